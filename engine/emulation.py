"""Step-cost emulation, for benchmarks only: pad each decode step to a cost shape.

``--engine.emulate_step_ms "A+B*tokens"`` (or a named profile) makes every
decode-only engine step last at least ``scale * (A + B * tokens)`` ms, tokens
being the tokens the step verified (one per request plus its drafts). The real
engine, real drafts and real acceptance run as usual; only the clock follows
another machine's shape. Steps that hold a prefill run at their real speed.
A step whose real time already exceeds the target is counted as an overrun
(the emulation is then optimistic for that step): keep overruns under 1% by
raising ``--engine.emulate_scale``, which keeps the shape and the ratios.

Profiles:
- ``moe-offload``: ``7 + 48 * tokens``. DeepSeek-V4-Flash on an RTX 5090 with
  the MoE experts in system RAM (docs/benchmarks.md): about 150 ms per step at k=2
  whatever the acceptance (11-13 tok/s at 30-50% acceptance while reasoning,
  17.4-17.9 tok/s at 87-90% in the answer). Every extra verified token reads
  other experts from RAM, so the cost is linear in tokens; the fit puts 55 ms
  on a step of 1 token and 151 ms on 3.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

PROFILES = {"moe-offload": (7.0, 48.0)}
_LINEAR = re.compile(r"^\s*([0-9.]+)\s*\+\s*([0-9.]+)\s*\*\s*tokens\s*$")


class EmulationError(ValueError):
    """An emulation spec that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class StepEmulation:
    spec: str
    fixed_ms: float
    per_token_ms: float
    scale: float = 1.0

    @classmethod
    def parse(cls, spec: str, scale: float = 1.0) -> StepEmulation:
        if scale <= 0:
            raise EmulationError(f"emulation scale must be positive, got {scale}")
        if spec in PROFILES:
            fixed, per_token = PROFILES[spec]
            return cls(spec, fixed, per_token, scale)
        match = _LINEAR.match(spec)
        if match is None:
            raise EmulationError(
                f"emulate_step_ms must be 'A+B*tokens' (ms) or one of {sorted(PROFILES)}, got {spec!r}"
            )
        return cls(spec, float(match[1]), float(match[2]), scale)

    def target_s(self, tokens: int) -> float:
        return self.scale * (self.fixed_ms + self.per_token_ms * tokens) / 1e3

    def describe(self) -> dict[str, object]:
        return {
            "spec": self.spec,
            "step_ms": f"{self.scale:g} * ({self.fixed_ms:g} + {self.per_token_ms:g} * tokens)",
            "scale": self.scale,
        }


@dataclass(slots=True)
class PadCounter:
    padded: int = 0
    overrun: int = 0

    def pad(self, emulation: StepEmulation, elapsed_s: float, tokens: int) -> float:
        """The step's emulated duration: sleeps (in the engine core) until the target when the
        real step was faster, else counts an overrun and keeps the real time."""
        target = emulation.target_s(tokens)
        if elapsed_s >= target:
            self.overrun += 1
            return elapsed_s
        time.sleep(target - elapsed_s)
        self.padded += 1
        return target

    def as_dict(self) -> dict[str, float | int]:
        total = self.padded + self.overrun
        return {
            "padded_steps": self.padded,
            "overrun_steps": self.overrun,
            "overrun_share": round(self.overrun / total, 4) if total else 0.0,
        }
