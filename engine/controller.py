"""The adaptive depth controller: every engine step, every adaptive request's depth.

Pure logic (no vLLM imports); the engine hook (engine/hook.py) calls ``plan``
with the scheduled requests' ``RequestLedger`` (engine/spec_stats.py), whose
``rates`` and ``chosen`` are this controller's per-request state, before vLLM
schedules a step, and feeds back what the step cost and produced.

Per request, the depths maximise the batch's expected tokens per second
(engine/depth_choice.py) from measured acceptance (engine/acceptance.py) and a
measured cost per draft (engine/cost_model.py); for a drafter that pays per
drafting pass, one depth for the whole step from timed windows
(engine/step_depth.py).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.acceptance import (
    PositionRates,
    RequestRates,
    RequestWeights,
    Resolved,
    Weights,
    phase_estimate,
)
from engine.cost_model import CostEstimate, StepCostModel
from engine.depth_choice import Candidate, best_depths, cumulative, settle
from engine.spec_stats import ANSWER, TOOL_CALL, RequestLedger
from engine.step_depth import MAX_PATIENCE, Leaving, StepDepthChooser
from engine.step_times import StepWindow


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    explore_share: float = 0.05
    """Steps on which adaptive requests move their depth at random by up to one
    (what the cost slope is learned from), while the slope is uncertain. With
    ``step_depth``: about the share of windows that re-time a passed-over depth."""
    settled_explore_share: float = 0.01
    """The share once the slope is known to within ``price_precision``."""
    price_precision: float = 0.05
    """The slope is known well enough when its standard error is worth less than
    this many tokens per draft at the batch's plain rate (batch / base): an error
    that small cannot move a decision by more than a 5% acceptance difference."""
    shadow_share: float = 0.25
    """Steps after which the drafter proposes all K drafts even when no request verifies them."""
    cold_explore_share: float = 0.5
    """Share of random steps while the batch size's cost slope is not learned yet."""
    warmup_steps: int = 40
    """Random steps taken first (drawn from 0..cap), before the cost model has any."""
    request_prior_weight: float = 8.0
    """A request's estimate is its phase's, worth this many of its own proposals, plus its
    own history; the weight used until ``request_weights`` have been scored."""
    request_weights: tuple[float, ...] = (2.0, 8.0, 32.0, 128.0, 512.0)
    """Candidate weights, scored per phase by how well each predicted the next proposal
    (engine/acceptance.py WeightChooser); the best one is used. One entry fixes it."""
    weight_samples: float = 100.0
    """Scored proposals (forgotten at ``phase_keep``) before the best weight replaces the default."""
    scored_per_step: int = 8
    """Proposals scored per step on average (a random sample: scoring all 64 of a batch of
    64 would cost a third of the controller's time)."""
    request_keep: float = 0.95
    phase_keep: float = 0.995
    hysteresis: float = 0.01
    """Keep a request's previous depth unless the new one is worth this share more of its own tokens."""
    explore_depths: tuple[int, ...] = ()
    """Depths a random step draws from (empty: 0..cap). (1, K) with explore_share 1
    compares shadow and verified acceptance on like steps."""
    step_depth: bool = False
    """One depth for the whole step, chosen from the step time measured at each depth
    (engine/step_depth.py): for drafters that pay per drafting pass (model drafters)."""
    step_max_patience: float = MAX_PATIENCE
    """With ``step_depth``: the longest a passed-over depth far below the best rate waits before it
    is run again, in units of its wait (``StepDepthChooser.max_patience``)."""
    step_hold_ends: bool = True
    """With ``step_depth``: a request held at its thinking budget that the measured hold length says
    leaves the hold within a window counts at its answer's gain for the window's steps after
    (``StepDepthChooser``, ``Leaving``); off: it counts a token a step for the whole window."""
    step_borrow_times: bool = False
    """With ``step_depth``: price a depth not yet timed at a batch size from the nearest batch size
    where every depth is, and try it first only when that price is close to the best
    (``StepDepthChooser.borrow``); off (the default: on an H100, twenty-first GPU session, it ran
    depth 2 for 10 windows in a row at c=16 on a price borrowed from c=4, and no gain showed):
    every depth is tried first at every batch size."""
    step_drain_finish: bool = False
    """With ``step_depth``: a batch of adaptive requests that all end within the window, with no
    request waiting for a slot, is priced by the steps until its last one ends
    (``StepDepthChooser.drain_finish``); off (the default; twenty-fourth GPU session, an H100 and an
    H200: no shorter drain): a finished request's slot counts a token a step, as if the next
    request took it."""
    step_drain_horizon: bool = False
    """With ``step_depth``: a batch whose adaptive requests all run out of tokens within two windows
    tries no depth first and re-runs none (``StepDepthChooser.drain_horizon``); off (the default
    until measured on a GPU): it explores as any batch does."""
    step_min_depth: int = 0
    """With ``step_depth``: the shallowest depth a window runs (``StepDepthChooser.min_depth``); 0,
    the default: every depth from 0. A diagnostic for benchmarks' arms, not a tuning knob."""
    step_one_pass: bool = True
    """With ``step_depth``: depth 0 is timed as depth 1 is, less the drafts it does not verify (the
    share's slope): vLLM drafts at least one a step, so both run the drafter's one pass
    (``BucketTimes.one_pass``). On by default since the twenty-sixth GPU session (H100, c=16, 6
    repetitions, docs/gpu.md): mix 0.989 against 0.954 off, tail 4.8 steps a cell against 12.0
    (fixed-1 4.2). Off: depth 0 has its own time, from its own windows, which are mostly run when
    most of the batch is held (twenty-fourth GPU session, H100: the fitted slope was 0, so depth 1
    was priced 10% dearer than depth 0 at any share, even with 90% of the batch verifying nothing
    at either)."""
    step_cut_windows: bool = True
    """With ``step_depth``: a step without adaptive requests (all held at their thinking budget)
    ends the window planned, and the next is chosen for the batch after it
    (``StepDepthChooser.interrupt``); off: the window runs on after it at the depth it was chosen
    at, for another batch (twentieth and twenty-first GPU sessions, c=64: depth-0 windows chosen
    as the batch entered its holds ran on as it left them and answered)."""
    step_verify_share: bool = True
    """With ``step_depth``: price each depth at the drafts per request the batch would verify at it
    (a held request verifies none), from the measured slope of step time in them
    (``StepDepthChooser.by_share``); off: one time per depth and batch size, whatever the share
    held (twenty-first GPU session: depth 0, timed when most of the batch was held, looked cheaper
    than it is and ran in 15-30% of the windows at c=64)."""
    seed: int | None = None


@dataclass(slots=True)
class VerifiedCounts:
    """Steps fully open to the drafter, by depth verified: how often drafts 1..j matched."""

    steps: int = 0
    matched: list[int] = field(default_factory=list)

    def add(self, run: int, max_depth: int) -> None:
        self.matched = self.matched or [0] * max_depth
        self.steps += 1
        for j in range(run):
            self.matched[j] += 1

    def as_dict(self) -> dict[str, Any]:
        rates = [round(m / self.steps, 4) for m in self.matched] if self.steps else []
        return {"steps": self.steps, "acceptance_by_position": rates}


HOLD_MEMORY = 64
"""Holds kept for ``DepthController.hold_length``."""


def budget_hold(output_tokens: int, budget: int | None, phase: str, max_depth: int) -> bool:
    """Whether a request verifies no drafts now: close to its thinking budget, whatever the policy.

    vLLM's thinking-budget forcing under speculative decoding
    (v1/sample/thinking_budget_state.py, ``_update_think_state``) forces one
    position per step: where drafts already match the end string it only
    counts them, so the target may reject such a draft and emit its own
    token inside the forced string ("Okay, here done thinking." for "Okay,
    I am done thinking." on the embedded model, plain vLLM 0.32 with a
    draft model at K=3), and where it triggers depends on how many drafts the
    step verifies (``think_count + len(spec) + 1 > budget``). A step without
    drafts takes the same path as an engine without speculation. So every
    request verifies no drafts from 4(K+1) output tokens before its budget
    (covering the early trigger and async scheduling's one-step lag) until
    the front end reports the end of reasoning: greedy output is then the
    same at every depth, and the forced string is the one configured.
    """
    start = hold_start(budget, phase, max_depth)
    return start is not None and output_tokens >= start


def hold_start(budget: int | None, phase: str, max_depth: int) -> int | None:
    """The output token from which ``budget_hold`` holds a request (None: it is not held)."""
    if budget is None or budget < 0 or phase in (ANSWER, TOOL_CALL):
        return None
    return budget - 4 * (max_depth + 1)


def depth_tokens_left(
    output_tokens: int, max_tokens: int | None, budget: int | None, phase: str, max_depth: int
) -> int | None:
    """Output tokens before a request's depth stops mattering: its ``max_tokens``, or, while it
    reasons under a thinking budget, the start of its budget hold (``hold_start``); None: no end
    known. After it the request yields a token a step whatever the depth (held, or its slot taken
    by the next request), which a window of steps chosen for it must count (``StepDepthChooser``)."""
    ends = [end for end in (max_tokens, hold_start(budget, phase, max_depth)) if end is not None]
    return max(0, min(ends) - output_tokens) if ends else None


@dataclass(slots=True)
class StepPlan:
    depths: dict[str, int]
    """Chosen depth of every adaptive request in the batch."""
    explore: bool
    instrument: float | None
    """Z on a random step: the sum of the drawn depths' deviations from their draws' means."""
    full_draft: bool
    """Let the drafter propose K after this step (shadow drafts for every position)."""
    step_window: StepWindow | None = None
    """The steps at one depth this step belongs to (``ControllerSettings.step_depth``)."""
    next_drafts: int | None = None
    """The last step of a window: what the next window's first step verifies, which the drafter
    drafts after this step (vLLM sizes the next proposal by this step's count)."""
    drafts_for_next: bool = False
    """``next_drafts`` makes this step draft another number of passes than its own depths would: it
    runs the next window's drafting, so it counts in its window but is not timed there."""
    after_gap: bool = False
    """The first step after steps without adaptive requests: it verifies what the drafter proposed
    then (one pass: held requests verify none), not its window's depth; counted, not timed."""


_Prior = tuple[Weights, tuple[list[float], list[float]]]
"""A phase's request weights and its (a, p) estimates."""


@dataclass(slots=True)
class PhaseWindow:
    """What one phase did since the last summary."""

    max_depth: int
    steps_by_depth: list[int] = field(default_factory=list)
    tokens: int = 0

    def __post_init__(self) -> None:
        self.steps_by_depth = self.steps_by_depth or [0] * (self.max_depth + 1)


class DepthController:
    def __init__(self, max_depth: int, settings: ControllerSettings | None = None) -> None:
        self.max_depth = max_depth
        self.settings = settings or ControllerSettings()
        self.rng = random.Random(self.settings.seed)
        self.cost = StepCostModel()
        self.phases: dict[str, PositionRates] = {}
        self.weights: dict[str, RequestWeights] = {}
        self.window: dict[str, PhaseWindow] = {}
        self.by_verified: dict[int, VerifiedCounts] = {}
        self.explored_steps = 0
        self.planned_steps = 0
        self.shadow_checked = 0
        self.shadow_disagreed = 0
        self._explore_next = False
        self._score_share = 1.0
        self._score_rng = random.Random(self.settings.seed)
        self.step_chooser = StepDepthChooser(
            max_depth,
            self.rng,
            max_patience=self.settings.step_max_patience,
            borrow=self.settings.step_borrow_times,
            by_share=self.settings.step_verify_share,
            drain_horizon=self.settings.step_drain_horizon,
            drain_finish=self.settings.step_drain_finish,
            min_depth=self.settings.step_min_depth,
            one_pass=self.settings.step_one_pass,
        )
        self.hold_lengths: deque[int] = deque(maxlen=HOLD_MEMORY)
        """Output tokens from the start of a thinking-budget hold to its end, the last holds measured."""

    def reconfigure(self, settings: ControllerSettings) -> None:
        """New settings at run time (benchmarks, tests); the estimates learned so far are kept."""
        self.settings = settings
        self.step_chooser.max_patience = settings.step_max_patience
        self.step_chooser.borrow = settings.step_borrow_times
        self.step_chooser.drain_horizon = settings.step_drain_horizon
        self.step_chooser.drain_finish = settings.step_drain_finish
        self.step_chooser.min_depth = settings.step_min_depth
        self.step_chooser.by_share = settings.step_verify_share
        self.step_chooser.one_pass = settings.step_one_pass
        for table in self.step_chooser.times.values():
            table.by_share = settings.step_verify_share
            table.one_pass = settings.step_one_pass

    # --- estimates ---

    def hold_ended(self, tokens: int) -> None:
        """A request left its thinking-budget hold ``tokens`` output tokens after it began (the
        hook sees it: its phase turned to the answer, or it ended reasoning itself)."""
        self.hold_lengths.append(tokens)

    def hold_length(self) -> int | None:
        """Output tokens a hold lasts, the median of those measured (None: none yet)."""
        return round(statistics.median(self.hold_lengths)) if self.hold_lengths else None

    def phase_rates(self, phase: str) -> PositionRates:
        rates = self.phases.get(phase)
        if rates is None:
            # Weak prior: a falling acceptance, drafts always proposed.
            k = self.max_depth
            rates = PositionRates.prior([0.5**j for j in range(1, k + 1)], [1.0] * k, 1.0, self.settings.phase_keep)
            self.phases[phase] = rates
        return rates

    def weight_chooser(self, phase: str) -> RequestWeights:
        chooser = self.weights.get(phase)
        if chooser is None:
            s = self.settings
            chooser = RequestWeights.new(s.request_weights, s.request_prior_weight, s.phase_keep, s.weight_samples)
            self.weights[phase] = chooser
        return chooser

    def track(self, request: RequestLedger) -> RequestRates:
        """The request's estimates; entering a phase (or arriving) restarts them from the phase's."""
        if request.rates is None or request.rates_phase != request.phase:
            request.rates = RequestRates.start(self.phase_rates(request.phase), self.settings.request_keep)
            request.rates_phase, request.chosen = request.phase, None
        return request.rates

    def observe(self, request: RequestLedger, resolved: Resolved) -> None:
        """A proposal of this request was decided (engine/acceptance.py)."""
        rates = request.rates
        if rates is not None and request.rates_phase == resolved.phase:
            if self._score_rng.random() < self._score_share:
                # Scored before anything learns from it: a prediction, not a fit.
                chooser = self.weight_chooser(resolved.phase)
                chooser.score(rates, resolved.observed, resolved.proposed, resolved.run)
            rates.own.observe(resolved.observed, resolved.proposed, resolved.run)
        self.phase_rates(resolved.phase).observe(resolved.observed, resolved.proposed, resolved.run)
        if resolved.observed >= self.max_depth:
            self.by_verified.setdefault(resolved.verified, VerifiedCounts()).add(resolved.run, self.max_depth)
        if resolved.agrees is not None:
            self.shadow_checked += 1
            self.shadow_disagreed += not resolved.agrees

    def estimates(self, request: RequestLedger) -> list[float]:
        if request.rates is None:
            return []
        return request.rates.estimate(self.weight_chooser(request.rates_phase).best())[0]

    def next_depth(self, request: RequestLedger) -> int:
        """The depth an adaptive request verifies at its next step, as far as known after this
        step's plan: one depth a step, that of the window the next step runs in (chosen at a
        window's last step; a request in its prefill, not planned yet, gets it too); per request,
        its latest choice (its cap before the first)."""
        window = self.step_chooser.current if self.settings.step_depth else None
        return request.depth if window is None else min(request.cap, window.depth)

    def _candidate(self, request: RequestLedger, low: int, high: int, priors: dict[str, _Prior]) -> Candidate:
        """The request's estimates; ``priors`` caches each phase's weight and (c, p) within one step."""
        rates = self.track(request)
        prior = priors.get(request.phase)
        if prior is None:
            prior = (self.weight_chooser(request.phase).best(), phase_estimate(rates.phase))
            priors[request.phase] = prior
        accepted, proposed = rates.estimate(*prior)
        return Candidate(accepted, proposed, low, high)

    # --- decisions ---

    def plan(self, batch: Sequence[RequestLedger], waiting: int = 0) -> StepPlan:
        """The coming step's depth for every adaptive request of ``batch`` (every request scheduled);
        ``waiting``: requests queued for a slot."""
        modes = [request.planned() for request in batch]
        adaptive = [(request, cap) for request, (cap, is_adaptive) in zip(batch, modes, strict=True) if is_adaptive]
        s = self.settings
        if not adaptive:
            if s.step_depth and s.step_cut_windows:
                self.step_chooser.interrupt()
            return StepPlan({}, False, None, False)
        self.planned_steps += 1
        self._score_share = min(1.0, s.scored_per_step / len(batch))
        if s.step_depth:
            fixed = [
                (request, depth) for request, (depth, is_adaptive) in zip(batch, modes, strict=True) if not is_adaptive
            ]
            return self._plan_step_depth(len(batch), adaptive, fixed, waiting)
        warm = self.explored_steps >= s.warmup_steps
        explore = self._explore_next or not warm
        # A random step only teaches the slope through requests with drafts to
        # verify: when the drafter proposed none (known under sync scheduling),
        # the random step waits for the next step that has some.
        informative = any(request.proposed is None or request.proposed > 0 for request, _ in adaptive)
        cost = self.cost.estimate(len(batch))
        self._explore_next = explore and not informative
        if not self._explore_next:
            self._explore_next = self.rng.random() < self._explore_share(len(batch), cost)
        full_draft = self._explore_next or self.rng.random() < s.shadow_share
        if explore and informative:
            self.explored_steps += 1
            depths, instrument = {}, 0.0
            for request, cap in adaptive:
                decided = request.chosen if warm else None
                depths[request.engine_id], centred = self._random_depth(cap, decided, request.proposed)
                instrument += centred
            return StepPlan(depths, True, instrument, full_draft)
        candidates, previous = [], []
        priors: dict[str, _Prior] = {}
        for request, (cap, is_adaptive) in zip(batch, modes, strict=True):
            low = 0 if is_adaptive else cap
            candidates.append(self._candidate(request, low, cap, priors))
            last = request.chosen if is_adaptive else cap
            previous.append(last if last is not None and low <= last <= cap else None)
        chosen, rate = best_depths(candidates, cost)
        chosen = settle(candidates, chosen, previous, rate, cost, s.hysteresis)
        depths = {}
        for request, (_, is_adaptive), d in zip(batch, modes, chosen, strict=True):
            if is_adaptive:
                depths[request.engine_id] = request.chosen = d
        return StepPlan(depths, False, None, full_draft)

    def _plan_step_depth(
        self,
        batch_size: int,
        adaptive: Sequence[tuple[RequestLedger, int]],
        fixed: Sequence[tuple[RequestLedger, int]],
        waiting: int = 0,
    ) -> StepPlan:
        for request, _ in adaptive:
            self.track(request)  # a request entering a phase restarts its estimates now
        chooser, share = self.step_chooser, self.settings.explore_share
        held = [d for _, d in fixed]
        fixed_drafts = sum(held)
        after_gap, chooser.resumed = chooser.resumed, False
        window = chooser.next_step()

        def finishing() -> bool:
            """Every request ends at its tokens left (no hold ahead), none waiting to take a freed slot."""
            return (
                self.settings.step_drain_finish
                and not waiting
                and not fixed
                and all(r.tokens_left == r.max_tokens_left for r, _ in adaptive)
            )

        if window is None:  # a new window: only its choice needs the requests' estimates
            gains, caps, fixed_tokens, lefts, leaving = self._step_inputs(adaptive, fixed, ahead=False)
            window = chooser.choose(
                *(batch_size, gains, caps, share, fixed_tokens),
                lefts=lefts,
                leaving=leaving,
                fixed_drafts=fixed_drafts,
                finishing=finishing(),
            )
        window.planned += 1
        window.fixed += batch_size - len(adaptive)
        depths = {}
        for request, cap in adaptive:
            depths[request.engine_id] = request.chosen = min(cap, window.depth)
        window.drafts += fixed_drafts + sum(depths.values())
        window.slots += batch_size
        next_drafts = None
        if window.to_plan == 0:
            # Its last step: the drafter proposes after it for the next window's first step, as many
            # drafts as this step asks for, so the next window is chosen now (a window chosen a step
            # late verified the old depth's drafts in its first step, at the new depth's cost).
            gains, caps, fixed_tokens, lefts, leaving = self._step_inputs(adaptive, fixed, ahead=True)
            upcoming = chooser.choose(
                *(batch_size, gains, caps, share, fixed_tokens),
                ahead=True,
                lefts=lefts,
                leaving=leaving,
                fixed_drafts=fixed_drafts,
                finishing=finishing(),
            )
            next_drafts = max(min(cap, upcoming.depth) for _, cap in adaptive)
        # vLLM drafts at least 1 (engine/hook.py), and as deep as the deepest request's next step.
        other = next_drafts is not None and max(1, next_drafts, *held) != max([1, *depths.values(), *held])
        # No shadow steps: a step that drafts K would be timed as this depth's.
        return StepPlan(depths, False, None, False, window, next_drafts, other, after_gap)

    def _step_inputs(
        self, adaptive: Sequence[tuple[RequestLedger, int]], fixed: Sequence[tuple[RequestLedger, int]], ahead: bool
    ) -> tuple[list[list[float]], list[int], float, list[int | None], list[Leaving]]:
        """What a window's choice weighs: each adaptive request's expected accepted drafts by depth,
        its cap, the expected tokens of the requests at a depth the window does not set, each
        adaptive request's tokens before its depth stops mattering (``depth_tokens_left``), and the
        held adaptive requests that leave their hold within the window (``Leaving``). ``ahead``: the
        window starts at the step after this one."""
        priors: dict[str, _Prior] = {}
        gains = [cumulative(self._candidate(request, 0, cap, priors).accepted) for request, cap in adaptive]
        # Requests at a depth the window does not set (held at a thinking budget, static) yield
        # the same tokens at every depth, but they are in every depth's step time: left out of
        # the rate, they made deep depths look better than they are (a batch half held gains
        # half as much from a deeper depth, for the same extra time).
        fixed_tokens = 0.0
        leaving: list[Leaving] = []
        answer_gains: list[float] | None = None
        for request, depth in fixed:
            held_steps = self._held_steps(request, ahead)
            if held_steps is not None and held_steps < self.step_chooser.window_steps:
                left = request.max_tokens_left
                after = None if left is None else max(0, left - held_steps - ahead)
                if answer_gains is None:  # one phase's: once per choice
                    answer_gains = self._answer_gains()
                leaving.append(Leaving(answer_gains, request.cap, held_steps, after))
                continue
            fixed_tokens += 1 + (cumulative(self._candidate(request, 0, depth, priors).accepted)[depth] if depth else 0)
        lefts = [request.tokens_left for request, _ in adaptive]
        return gains, [cap for _, cap in adaptive], fixed_tokens, lefts, leaving

    def _held_steps(self, request: RequestLedger, ahead: bool) -> int | None:
        """The steps of a window starting now (or at the next step: ``ahead``) an adaptive request held
        at its thinking budget stays held, a token a step, from the holds measured; None: not such
        a request, or no hold measured yet (``step_hold_ends`` off: never known)."""
        length = self.hold_length()
        if not (request.adaptive and request.budget_hold) or length is None or not self.settings.step_hold_ends:
            return None
        return max(0, length - request.held_tokens - ahead)

    def _answer_gains(self) -> list[float]:
        """Expected accepted drafts by depth (0..K) of a request entering its answer: the phase's."""
        return cumulative(self.phase_rates(ANSWER).accepted())

    def _explore_share(self, batch: int, cost: CostEstimate | None) -> float:
        """How often to take a random step at this batch size.

        No slope of its own yet: often (a borrowed slope can be wrong). A slope
        whose standard error is still worth more than ``price_precision`` tokens
        per draft: ``explore_share``. Known that well: ``settled_explore_share``
        (every random step verifies drafts that may not pay: on the user's
        machine a draft is a whole expert read)."""
        s = self.settings
        if cost is None or not math.isfinite(cost.per_draft_se_s):  # no slope of this size's own
            return max(s.explore_share, s.cold_explore_share)
        if cost.per_draft_se_s * batch / cost.base_s > s.price_precision:
            return s.explore_share
        return min(s.settled_explore_share, s.explore_share)

    def _random_depth(self, cap: int, decided: int | None, proposed: int | None) -> tuple[int, float]:
        """A random depth, and the deviation of the drafts it verifies from their mean over the draw.

        Once a request has a decided depth, a random step moves it by at most
        one (cheap: on the user's machine a draft costs a whole expert read);
        before, it draws from 0..cap. The instrument is the centred draw: its
        mean is 0 whatever the decided depth, so it is uncorrelated with
        anything the decision depends on (phase, context, acceptance). When the
        proposal is known, it is the centred number of drafts the depth lets
        through (min(depth, proposed)): a request without drafts adds nothing
        but noise to the draw, and one with fewer drafts than the depth only
        what it has."""
        allowed = [d for d in self.settings.explore_depths if d <= cap]
        if not allowed:
            low, high = (0, cap) if decided is None else (max(decided - 1, 0), min(decided + 1, cap))
            allowed = list(range(low, high + 1))
        depth = self.rng.choice(allowed)
        if proposed is None:
            return depth, depth - sum(allowed) / len(allowed)
        return depth, min(depth, proposed) - sum(min(d, proposed) for d in allowed) / len(allowed)

    def step_done(self, batch: int, drafts: int, seconds: float, plan: StepPlan | None) -> None:
        """A decode step finished: feed its time to the cost model."""
        self.cost.observe(batch, drafts, seconds, plan.instrument if plan is not None else None)

    def decode_step_timed(
        self, plan: StepPlan, batch: int, previous_update: float, now: float, tokens: int = 0
    ) -> None:
        """A decode step of ``plan`` finished at ``now`` with ``tokens`` new tokens, the update before
        it at ``previous_update``."""
        if plan.step_window is not None:
            # A step drafting for a window of another depth ran that window's passes: its tokens are its
            # window's, its time is not (timed, a 1 -> 3 switch priced depth 1 an eighth of the way to 3).
            timed_from = 0.0 if plan.drafts_for_next or plan.after_gap else previous_update
            self.step_chooser.step_finished(plan.step_window, batch, timed_from, now, tokens)

    def count(self, phase: str, depth: int, tokens: int) -> None:
        window = self.window.get(phase)
        if window is None:
            window = self.window[phase] = PhaseWindow(self.max_depth)
        window.steps_by_depth[min(depth, self.max_depth)] += 1
        window.tokens += tokens

    def per_draft_ms(self, batch: int) -> float | None:
        est = self.cost.estimate(batch)
        return round(est.per_draft_s * 1e3, 3) if est is not None and est.samples else None

    def snapshot(self, reset_window: bool) -> dict[str, Any]:
        phases = {}
        # A phase that only ran without drafts (depth 0 under async scheduling: no shadow drafts) has
        # no estimates, but its steps and tokens count (left out, /phasespec/state and the summary
        # lost them: GPU session 17).
        for name in dict.fromkeys([*self.phases, *self.window]):
            window = self.window.get(name) or PhaseWindow(self.max_depth)
            rates = self.phases.get(name)
            phases[name] = {
                "acceptance_by_position": [] if rates is None else [round(c, 4) for c in rates.accepted()],
                "proposed_by_position": [] if rates is None else [round(p, 4) for p in rates.proposed()],
                "samples_by_position": [] if rates is None else [round(w, 1) for w in rates.samples()],
                "steps_by_depth": list(window.steps_by_depth),
                "tokens": window.tokens,
                "request_weight": self.weight_chooser(name).as_dict(),
            }
        by_verified = {str(v): c.as_dict() for v, c in sorted(self.by_verified.items())}
        if reset_window:
            self.window.clear()
            self.by_verified.clear()
        return {
            "phases": phases,
            "cost": self.cost.snapshot(),
            "planned_steps": self.planned_steps,
            "explored_steps": self.explored_steps,
            "shadow_checked": self.shadow_checked,
            "shadow_disagreed": self.shadow_disagreed,
            "by_verified_depth": by_verified,
            "step_depth_ms": self.step_chooser.snapshot() if self.settings.step_depth else None,
            "step_depth_switch_share": self.step_chooser.switch_snapshot() if self.settings.step_depth else None,
            "step_depth_windows": self.step_chooser.windows_snapshot() if self.settings.step_depth else None,
            "step_depth_share_slope": self.step_chooser.slope_snapshot() if self.settings.step_depth else None,
            "step_depth_cut_windows": self.step_chooser.cut_snapshot() if self.settings.step_depth else None,
            "hold_tokens": self.hold_length(),
            "holds_measured": len(self.hold_lengths),
        }
