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
- Engine-core utility calls (``phasespec_*`` methods, added to ``EngineCore``
  by ``engine.engine_calls.install_utilities`` when the engine core builds its
  ``DepthScheduler``) change depths between steps and read counters.
- Counters are fed from ``make_spec_decoding_stats``, the exact call that
  feeds vLLM's Prometheus spec-decode counters, so they agree to the token.

Which vLLM it runs on is decided by engine/compat.py, by feature detection:
``engine.runtime.install_depth_hook`` checks it before importing this module.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from engine.acceptance import Resolved
from engine.compat import (
    drafter_takes_lower_k,
    runner_applies_thinking_budget,
    runner_honours_batch_k,
    uses_v2_runner,
)
from engine.controller import ControllerSettings, DepthController, StepPlan, budget_hold, depth_tokens_left, hold_start
from engine.emulation import PadCounter, StepEmulation
from engine.engine_calls import install_utilities
from engine.spec_stats import DEFAULT_PHASE, EXTRA_KEY, RequestLedger, SpecLedger

PASS_FREE_METHODS = ("ngram", "ngram_gpu", "suffix")
"""Drafters that search the text: their cost does not grow by a forward pass per draft position."""


def step_depth_wanted(setting: str, vllm_config: Any) -> bool:
    """``--adaptive.step_depth``: auto is on for model drafters (one pass per draft position)."""
    if setting != "auto":
        return setting == "on"
    spec = vllm_config.speculative_config
    return spec is not None and spec.method not in PASS_FREE_METHODS


def hook_options(vllm_config: Any) -> dict[str, Any]:
    """phasespec's engine-side options, carried to the engine core in ``additional_config``."""
    extra = vllm_config.additional_config
    return dict(extra.get(EXTRA_KEY) or {}) if isinstance(extra, dict) else {}


class OwnTime:
    """CPU time the hook adds to each engine step: its ``schedule`` and ``update_from_output``
    overrides minus vLLM's own work inside them (the small callbacks vLLM makes from inside,
    ``_update_after_schedule`` and ``make_spec_decoding_stats``, count as vLLM's)."""

    __slots__ = ("seconds", "steps")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0

    def add(self, seconds: float, step_done: bool = False) -> None:
        self.seconds += seconds
        self.steps += step_done

    def us_per_step(self) -> float | None:
        return round(1e6 * self.seconds / self.steps, 1) if self.steps else None


class CoreTime:
    """Wall time of whole ``schedule`` and ``update_from_output`` calls, vLLM's work inside them
    included: with the step time beside it, whether the engine core's loop, not the GPU, sets the
    pace (a benchmark compares policies by it; ``OwnTime`` is the hook's share of it)."""

    __slots__ = ("schedule_s", "update_s")

    def __init__(self) -> None:
        self.schedule_s = self.update_s = 0.0


class DraftPasses:
    """The drafter's passes for the steps that verified drafts: its count when it proposed them
    (``num_spec_tokens_to_schedule`` of the step before), and the passes beyond the deepest depth the
    step verified (vLLM drafts at least one): drafting paid for and cut unverified."""

    __slots__ = ("passes", "steps", "unverified")

    def __init__(self) -> None:
        self.steps = self.passes = self.unverified = 0

    def add(self, count: int, output: SchedulerOutput) -> None:
        spec = output.scheduled_spec_decode_tokens
        scheduled = output.num_scheduled_tokens
        if not any(n == 1 + len(spec.get(rid, ())) for rid, n in scheduled.items()):
            return  # no request decoding: no drafts were proposed for this step
        deepest = max(map(len, spec.values()), default=0)
        self.steps += 1
        self.passes += count
        self.unverified += max(0, count - max(deepest, 1))


class DepthScheduler(Scheduler):
    """vLLM's scheduler, verifying at most each request's own depth of drafts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        install_utilities()  # in the engine-core process, before any utility call reaches it
        options = hook_options(self.vllm_config)
        self.spec_ledger = SpecLedger(self.num_spec_tokens)
        adaptive = dict(options.get("adaptive", {}))
        adaptive["step_depth"] = step_depth_wanted(adaptive.get("step_depth", "auto"), self.vllm_config)
        self.controller = DepthController(max(self.num_spec_tokens, 0), ControllerSettings(**adaptive))
        emulate = options.get("emulate")
        self.emulation = StepEmulation.parse(emulate["spec"], emulate["scale"]) if emulate else None
        self.pads = PadCounter()
        if self.emulation is not None:
            self.spec_ledger.annotations["emulation"] = self.emulation.describe()
        # Lowering the batch's drafting count is vLLM's own dynamic-SD knob,
        # which vLLM disables under data parallelism (ranks draft in lockstep);
        # some drafters only draft exactly K (compat.FIXED_K_DRAFTERS).
        # vLLM 0.23.0 has no per-step drafting count (compat.lowers_batch_k), and the V2 model
        # runner before 0.32 ignores it (compat.runner_honours_batch_k): the drafter drafts K.
        method = getattr(self.vllm_config.speculative_config, "method", None)
        self._has_batch_k = runner_honours_batch_k(self.vllm_config)
        self._lower_batch_k = (
            self.num_spec_tokens > 0
            and self.parallel_config.data_parallel_size == 1
            and self._has_batch_k
            and drafter_takes_lower_k(method)
        )
        # Under sync scheduling the drafts are back in the scheduler before the
        # next step, so cut drafts can be matched (shadow drafts); under async
        # scheduling they stay in the worker and only verified positions are seen.
        self._shadow = not isinstance(self, AsyncScheduler)
        self._draft_limit = self.num_spec_tokens
        # Decode-only steps as (requests, tokens verified, draft tokens, seconds):
        # the cost curve a depth policy must respect.
        self.step_log: deque[tuple[int, int, int, float]] = deque(maxlen=8192)
        self._inflight: dict[int, tuple[float, StepPlan | None]] = {}
        self._last_update = 0.0
        self._plan: StepPlan | None = None
        self.own_time = OwnTime()
        self.core_time = CoreTime()
        self.draft_passes = DraftPasses()

    def describe(self) -> dict[str, Any]:
        """Which path this engine takes: for ``/phasespec/state`` and the startup log."""
        compilation = self.vllm_config.compilation_config
        mode = getattr(compilation, "cudagraph_mode", None)
        return {
            "scheduler": "async" if isinstance(self, AsyncScheduler) else "sync",
            "model_runner": "v2" if uses_v2_runner(self.vllm_config) else "v1",
            "runner_honours_batch_k": self._has_batch_k,
            "applies_thinking_budget": runner_applies_thinking_budget(self.vllm_config),
            "shadow_drafts": self._shadow,
            "lowers_batch_k": self._lower_batch_k,
            "cudagraph_mode": getattr(mode, "name", None) if mode is not None else None,
            "adaptive_unit": "step" if self.controller.settings.step_depth else "request",
            "hook_us_per_step": self.own_time.us_per_step(),
            "hook_cpu_s": self.own_time.seconds,
            "hook_steps": self.own_time.steps,
            "schedule_s": self.core_time.schedule_s,
            "update_s": self.core_time.update_s,
            # The engine core process's CPU time, all its threads (the GPU worker's among them).
            "process_cpu_s": time.process_time(),
            "draft_steps": self.draft_passes.steps,
            "draft_passes": self.draft_passes.passes,
            "draft_passes_unverified": self.draft_passes.unverified,
        }

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
                bool(meta.get("adaptive", False)),
            )
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        started = time.perf_counter()
        self._plan = self._plan_depths()
        proposals: dict[str, list[int]] = {}
        for request in self.running:
            ledger = self.spec_ledger.get(request.request_id)
            if ledger is None:
                continue
            if self._shadow:
                proposals[request.request_id] = request.spec_token_ids
            depth = ledger.verified_depth
            if len(request.spec_token_ids) > depth:
                # A new list: under async scheduling the placeholders are shared.
                request.spec_token_ids = request.spec_token_ids[:depth]
        limit = self._draft_limit  # what the drafter was allowed when it proposed these
        base_started = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        base_s = time.perf_counter() - base_started
        self._inflight[id(output)] = (started, self._plan)
        if self._has_batch_k:
            self.draft_passes.add(limit, output)
        if proposals:
            self._book_proposals(output, proposals, limit)
        ended = time.perf_counter()
        self.own_time.add(ended - started - base_s)
        self.core_time.schedule_s += ended - started
        return output

    def _plan_depths(self) -> StepPlan | None:
        batch = []
        for request in self.running:
            ledger = self.spec_ledger.get(request.request_id)
            if ledger is None:
                continue
            self._budget_state(request, ledger)
            # Under sync scheduling the drafts for this step are already
            # here; under async they are placeholders, not yet drafted.
            ledger.proposed = len(request.spec_token_ids) if self._shadow else None
            batch.append(ledger)
        if not batch:
            return None
        plan = self.controller.plan(batch, waiting=self.get_request_counts()[1])
        per_draft_ms = self.controller.per_draft_ms(len(batch)) if not plan.explore else None
        for ledger in batch:
            depth = plan.depths.get(ledger.engine_id)
            if depth is None:
                continue  # not adaptive this step
            if plan.explore:
                ledger.explored_steps += 1
                ledger.depth = depth
            else:
                ledger.choose(self.current_step, depth, self.controller.estimates, per_draft_ms)
        return plan

    def _budget_state(self, request: Request, ledger: RequestLedger) -> None:
        """Whether it is held at its thinking budget (and since when), and its tokens before depth
        stops mattering; a hold that ends is measured (``DepthController.hold_ended``)."""
        params = request.sampling_params
        budget = params.thinking_token_budget if params is not None else None
        out, k = request.num_output_tokens, self.num_spec_tokens
        held = budget_hold(out, budget, ledger.phase, k)
        if held and ledger.hold_from is None:
            ledger.hold_from = hold_start(budget, ledger.phase, k)
        elif not held and ledger.hold_from is not None:
            self.controller.hold_ended(out - ledger.hold_from)
            ledger.hold_from = None
        ledger.budget_hold = held
        ledger.held_tokens = out - ledger.hold_from if ledger.hold_from is not None else 0
        ledger.tokens_left = depth_tokens_left(out, request.max_tokens, budget, ledger.phase, k)
        ledger.max_tokens_left = None if request.max_tokens is None else max(0, request.max_tokens - out)

    def _book_proposals(self, output: SchedulerOutput, proposals: dict[str, list[int]], limit: int) -> None:
        spec = output.scheduled_spec_decode_tokens
        for engine_id, n_scheduled in output.num_scheduled_tokens.items():
            drafts = proposals.get(engine_id)
            verified = len(spec.get(engine_id, ()))
            if drafts is None or n_scheduled != 1 + verified:
                continue  # not a decode step of a tracked request
            ledger = self.spec_ledger.get(engine_id)
            request = self.requests[engine_id]
            assert ledger is not None
            ledger.book.propose(request.num_output_tokens, drafts, limit, verified, ledger.phase)

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput) -> Any:
        own_started = time.perf_counter()
        started, plan = self._inflight.pop(id(scheduler_output), (None, None))
        spec = scheduler_output.scheduled_spec_decode_tokens
        scheduled = scheduler_output.num_scheduled_tokens
        decode_only = bool(scheduled) and all(n == 1 + len(spec.get(rid, ())) for rid, n in scheduled.items())
        elapsed = None
        if decode_only and started is not None:
            elapsed = self._step_seconds(started, scheduler_output.total_num_scheduled_tokens)
            if elapsed is not None:
                drafted = sum(len(ids) for ids in spec.values())
                self.step_log.append((len(scheduled), scheduler_output.total_num_scheduled_tokens, drafted, elapsed))
                self.controller.step_done(len(scheduled), drafted, elapsed, plan)
        # The ledgers too: a request finishing in this step has its ledger freed by the update.
        before = {rid: (self.requests.get(rid), self.spec_ledger.get(rid)) for rid in scheduled}
        step_tokens = 0
        base_started = time.perf_counter()
        result = super().update_from_output(scheduler_output, model_runner_output)
        base_s = time.perf_counter() - base_started
        for engine_id, (request, ledger) in before.items():
            if request is None or ledger is None or scheduled[engine_id] != 1 + len(spec.get(engine_id, ())):
                continue  # a prefill
            if self.spec_ledger.get(engine_id) is ledger:
                for resolved in ledger.book.feed(request.output_token_ids):
                    self.controller.observe(ledger, resolved)
            # else finished in this step: its last proposal stays undecided, its tokens are the step's
            new_tokens = request.num_output_tokens - ledger.tokens_seen
            # The prefill's token arrives with the first decode step's: not this step's yield.
            step_tokens += new_tokens - (ledger.tokens_seen == 0 and new_tokens > 0)
            ledger.tokens_seen = request.num_output_tokens
            self.controller.count(ledger.phase, ledger.verified_depth, new_tokens)
        now = time.perf_counter()
        if decode_only and plan is not None:
            # A step the worker did not go straight into (elapsed None) counts but is not timed.
            previous = self._last_update if elapsed is not None else 0.0
            self.controller.decode_step_timed(plan, len(scheduled), previous, now, step_tokens)
        self._last_update = now
        ended = time.perf_counter()
        self.own_time.add(ended - own_started - base_s, step_done=True)
        self.core_time.update_s += ended - own_started
        return result

    def _step_seconds(self, started: float, tokens: int) -> float | None:
        """How long the step's forward pass took (padded under emulation).

        Sync scheduling: schedule() to update_from_output() brackets exactly one
        forward pass (and the drafting after it). Async scheduling: a step is
        scheduled while the previous one runs, so the bracket spans two; what
        measures one step there is the time between two consecutive updates,
        counted only when this step was already queued when the previous one
        finished (the worker went straight from one to the other, no idle gap).
        """
        now = time.perf_counter()
        if isinstance(self, AsyncScheduler):
            return now - self._last_update if self._last_update and started < self._last_update else None
        elapsed = now - started
        if self.emulation is not None:
            padded = self.pads.pad(self.emulation, elapsed, tokens)
            self.own_time.seconds -= padded - elapsed  # emulated device time, not the hook's
            elapsed = padded
        return elapsed

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        # Before the base class: the async scheduler sizes its placeholders from it.
        full_draft = self._plan is not None and self._plan.full_draft
        if self._lower_batch_k and scheduler_output.num_scheduled_tokens and not full_draft:
            # What the drafter proposes after this step is what the next step verifies.
            wanted = max(map(self._next_depth, scheduler_output.num_scheduled_tokens))
            # Never 0: vLLM's drafters are not written for an empty proposal.
            scheduler_output.num_spec_tokens_to_schedule = min(
                scheduler_output.num_spec_tokens_to_schedule, max(wanted, 1)
            )
        if self._has_batch_k:
            self._draft_limit = scheduler_output.num_spec_tokens_to_schedule or self.num_spec_tokens
        super()._update_after_schedule(scheduler_output)

    def _next_depth(self, engine_id: str) -> int:
        """The drafts a scheduled request may verify in its next step (the controller's, for an
        adaptive one: under one depth a step, the window the next step runs in, which a request in
        its prefill gets too; counted at its cap, every arrival made the drafter draft K for the
        whole batch, and a window's last step drafted its own depth for a shallower next window)."""
        ledger = self.spec_ledger.get(engine_id)
        if ledger is None:
            return self.num_spec_tokens
        if ledger.adaptive and not ledger.budget_hold:
            return self.controller.next_depth(ledger)
        return ledger.verified_depth

    def make_spec_decoding_stats(  # type: ignore[no-untyped-def]
        self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id
    ):
        if num_draft_tokens:  # the same rule vLLM applies before counting a draft
            drafted = num_draft_tokens - (num_invalid_spec_tokens or {}).get(request_id, 0)
            self.spec_ledger.observe(request_id, self.current_step, drafted, num_accepted_tokens)
            ledger = self.spec_ledger.get(request_id)
            if ledger is not None and self._shadow:
                ledger.book.verified(num_accepted_tokens)
            elif ledger is not None:
                # No drafts to match: the verified positions are all there is.
                seen = Resolved(drafted, drafted, num_accepted_tokens, drafted, ledger.phase)
                self.controller.observe(ledger, seen)
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
