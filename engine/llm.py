"""PhasespecLLM: vLLM's AsyncLLM plus the per-request speculative-depth API.

vLLM's serving layer only ever calls ``generate``; subclassing keeps every
other ``EngineClient`` method vLLM's own, so the OpenAI handlers see exactly
the engine ``vllm serve`` would give them. The depth API (``set_spec_depth``,
``spec_stats``) talks to the hook in the engine-core process (engine/hook.py)
through vLLM's utility calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from engine.compat import call_utility_all, runner_applies_thinking_budget
from engine.spec_stats import DEFAULT_PHASE, EXTRA_KEY, validate_depth

logger = logging.getLogger("phasespec.engine")


BUDGET_IGNORED = (
    "this engine runs vLLM's V2 model runner, which ignores thinking budgets before vLLM 0.31 "
    "(vLLM itself only warns at startup); leave it out, or run the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) "
    "where the drafter allows it (DSpark needs V2)"
)


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """Applied to requests that leave these fields unset."""

    thinking_token_budget: int | None = None
    hold_eos_while_thinking: bool = False


@dataclass(slots=True)
class SpecRequest:
    """A request's speculative settings at submission, and its final counters."""

    depth: int | None = None
    """Initial depth (None: K)."""
    phase: str = DEFAULT_PHASE
    adaptive: bool = False
    """``depth`` is a cap; the engine's controller chooses 0..cap every step."""
    trace: bool = False
    """Record every verify step (engine step, drafted, accepted, phase)."""
    final: dict[str, Any] | None = field(default=None)
    """Per-phase counters, filled in when the request finishes."""


class OutputObserver(Protocol):
    """Watches one request's outputs and steers its depth (proxy/observer.py)."""

    def start(self) -> SpecRequest: ...

    def on_output(self, output: RequestOutput) -> tuple[int, str, bool] | None:
        """(depth or cap, phase, adaptive) when the hook must be told."""

    def finish(self, spec_stats: dict[str, Any] | None, aborted: bool) -> Any: ...


ObserverFactory = Callable[[str, SamplingParams, "bool | None"], OutputObserver]


def apply_defaults(params: SamplingParams, defaults: RequestDefaults, reasoning_end_len: int) -> None:
    """Fill in the server's reasoning defaults where the request left them unset.

    The EOS hold covers the request's thinking budget, its own or the default: a model that
    never closes ``<think>`` (the embedded one) would otherwise stop inside it."""
    if params.thinking_token_budget is None:
        params.thinking_token_budget = defaults.thinking_token_budget
    budget = params.thinking_token_budget
    if budget is None or budget < 0 or not defaults.hold_eos_while_thinking or params.min_tokens != 0:
        return
    # The forced end string follows the budget; one answer token after it.
    wanted = budget + reasoning_end_len + 1
    params.min_tokens = wanted if params.max_tokens is None else min(wanted, params.max_tokens)


def attach_spec_meta(params: SamplingParams, request_id: str, spec: SpecRequest, max_depth: int) -> None:
    """Carry the depth hook's metadata to the scheduler in ``extra_args``."""
    depth = max_depth if spec.depth is None else validate_depth(spec.depth, max_depth)
    meta = {"group": request_id, "depth": depth, "phase": spec.phase, "trace": spec.trace, "adaptive": spec.adaptive}
    params.extra_args = {**(params.extra_args or {}), EXTRA_KEY: meta}


class PhasespecLLM(AsyncLLM):
    """AsyncLLM with request defaults and per-request speculative depth."""

    request_defaults: RequestDefaults = RequestDefaults()
    observer_factory: ObserverFactory | None = None
    vllm_fixes: tuple[str, ...] = ()
    """engine/vllm_fixes.py fixes applied in the workers (set by engine/runtime.py)."""
    applies_thinking_budget: bool = True
    """Whether the model runner enforces ``thinking_token_budget`` (not vLLM's V2 runner before 0.31)."""
    _reasoning_end_len: int = 0

    def configure(self, defaults: RequestDefaults) -> None:
        reasoning = self.vllm_config.reasoning_config
        if defaults.thinking_token_budget is not None and (reasoning is None or not reasoning.enabled):
            raise ValueError("a default thinking budget needs --reasoning-parser (and --reasoning-config)")
        self.applies_thinking_budget = runner_applies_thinking_budget(self.vllm_config)
        if defaults.thinking_token_budget is not None and not self.applies_thinking_budget:
            raise ValueError(f"--engine.default_thinking_budget: {BUDGET_IGNORED}")
        self.request_defaults = defaults
        end_ids = reasoning.reasoning_end_token_ids if reasoning is not None else None
        self._reasoning_end_len = len(end_ids or ())
        self._cleanup_tasks: set[asyncio.Task[Any]] = set()

    @property
    def max_spec_depth(self) -> int:
        """K: the engine's ``num_speculative_tokens`` (0 without speculation)."""
        spec = self.vllm_config.speculative_config
        return int(spec.num_speculative_tokens or 0) if spec is not None else 0

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        spec: SpecRequest | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[RequestOutput, None]:
        observer = None
        if spec is None and self.observer_factory is not None:
            observer = self.observer_factory(request_id, sampling_params, kwargs.get("reasoning_ended"))
            spec = observer.start()
        spec = spec if spec is not None else SpecRequest()
        params = sampling_params.clone()  # one copy of the caller's, edited below
        apply_defaults(params, self.request_defaults, self._reasoning_end_len)
        if params.thinking_token_budget is not None and not self.applies_thinking_budget:
            raise ValueError(f"thinking_token_budget: {BUDGET_IGNORED}")
        tracked = self.max_spec_depth > 0
        if tracked:
            attach_spec_meta(params, request_id, spec, self.max_spec_depth)
        # A non-streaming request is watched step by step too: ask vLLM for
        # deltas and hand the caller one merged final output, as FINAL_ONLY would.
        merge = observer is not None and params.output_kind == RequestOutputKind.FINAL_ONLY
        if merge:
            params.output_kind = RequestOutputKind.DELTA
        merged: RequestOutput | None = None
        finished = False
        try:
            async for output in super().generate(prompt, params, request_id, **kwargs):
                change = observer.on_output(output) if observer is not None else None
                if output.finished:
                    finished = True
                    if tracked:
                        spec.final = await self.pop_spec_stats(request_id)
                    if observer is not None:
                        observer.finish(spec.final, aborted=False)
                elif change is not None and tracked:
                    await self.set_spec_depth(request_id, *change)
                if merge:
                    merged = _merge(merged, output)
                    if not output.finished:
                        continue
                    output = merged
                yield output
        finally:
            if not finished:
                if observer is not None:
                    observer.finish(None, aborted=True)
                if tracked:
                    # Aborted (client gone, error): the hook moved its counters to
                    # the finished mailbox when vLLM freed the request; drop them.
                    task = asyncio.get_running_loop().create_task(self.pop_spec_stats(request_id))
                    self._cleanup_tasks.add(task)
                    task.add_done_callback(self._cleanup_tasks.discard)

    async def set_spec_depth(
        self, request_id: str, depth: int, phase: str | None = None, adaptive: bool = False
    ) -> bool:
        """Set a running request's depth (``adaptive``: its cap) from the next engine step on.

        Returns False (and logs) for an unknown or finished request; raises
        ``DepthError`` for a depth outside 0..K.
        """
        validate_depth(depth, self.max_spec_depth)
        applied = any(await self._utility("phasespec_set_depth", request_id, depth, phase, adaptive))
        if not applied:
            logger.info("set_spec_depth: no running request %s (finished or unknown)", request_id)
        return applied

    async def spec_stats(self, request_id: str) -> dict[str, Any] | None:
        """Per-phase counters of a running (or finished, unread) request."""
        return _on_rank(await self._utility("phasespec_stats", request_id))

    async def pop_spec_stats(self, request_id: str) -> dict[str, Any] | None:
        return _on_rank(await self._utility("phasespec_pop_stats", request_id))

    async def spec_hook_state(self) -> dict[str, int]:
        """How many requests the hook holds state for, summed over engine ranks."""
        totals: dict[str, int] = {}
        for sizes in await self._utility("phasespec_hook_state"):
            for key, n in sizes.items():
                totals[key] = totals.get(key, 0) + n
        return totals

    async def spec_hook_path(self) -> dict[str, Any]:
        """The path the hook takes (scheduler, shadow drafts, graph mode, adaptive unit: the same
        on every rank) and its own CPU time per step (rank 0's)."""
        return {**(await self._utility("phasespec_hook_path"))[0], "vllm_fixes": list(self.vllm_fixes)}

    async def controller_state(self, reset_window: bool = False) -> dict[str, Any]:
        """The adaptive controller's estimates and emulation, per engine rank."""
        ranks = await self._utility("phasespec_controller_state", reset_window)
        return ranks[0] if len(ranks) == 1 else {"ranks": ranks}

    async def configure_controller(self, **changes: Any) -> dict[str, Any]:
        """Change controller settings (engine/controller.py ControllerSettings) at run time; returns the old ones."""
        return dict((await self._utility("phasespec_configure_controller", changes))[0])

    async def cpu_probe(self) -> float:
        """Seconds of a fixed pure-Python workload in the engine core (rank 0): the host's speed now."""
        return float((await self._utility("phasespec_cpu_probe"))[0])

    async def drain_step_log(self) -> list[tuple[int, int, int, float]]:
        """Decode steps since the last call: (requests, tokens verified, drafts, seconds)."""
        return [tuple(step) for rank in await self._utility("phasespec_drain_steps") for step in rank]

    async def _utility(self, method: str, *args: Any) -> list[Any]:
        # Under data parallelism a request lives on one rank; the call goes to
        # every rank and only the one holding the request applies it.
        return await call_utility_all(self.engine_core, method, *args)


def _on_rank(ranks: list[Any]) -> dict[str, Any] | None:
    """The one rank's answer that knows the request, tagged with that rank (data parallelism)."""
    return next(({**r, "engine_rank": i} for i, r in enumerate(ranks) if r), None)


def _merge(merged: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """Accumulate delta outputs into one, as vLLM's FINAL_ONLY output would read."""
    if merged is None:
        return delta
    merged.add(delta, aggregate=True)
    merged.metrics = delta.metrics or merged.metrics
    return merged
