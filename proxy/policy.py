"""The depth policy: a pure function from phase to speculative depth (or cap)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.phases import Phase


@dataclass(frozen=True, slots=True)
class PhaseDepths:
    """Depth per phase; None means K (the engine's num_speculative_tokens).

    ``adaptive``: each value is a cap, and the engine's controller chooses the
    depth in 0..cap every step (engine/controller.py)."""

    reasoning: int | None = 1
    answer: int | None = 2
    tool_call: int | None = None
    adaptive: bool = False

    def for_phase(self, phase: Phase) -> int | None:
        return {Phase.REASONING: self.reasoning, Phase.ANSWER: self.answer, Phase.TOOL_CALL: self.tool_call}[phase]


ADAPTIVE = PhaseDepths(None, None, None, adaptive=True)
"""The adaptive policy with every phase capped at K."""


def choose_depth(phase: Phase, depths: PhaseDepths | None, max_depth: int) -> int:
    """The depth (or, adaptive, the cap) for a request in ``phase``; clamped to 0..K.

    ``depths=None`` turns phase switching off: every request runs at K.
    """
    if depths is None:
        return max_depth
    wanted = depths.for_phase(phase)
    return max_depth if wanted is None else max(0, min(wanted, max_depth))
