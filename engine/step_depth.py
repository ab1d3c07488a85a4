"""One depth for the whole step: the adaptive choice for drafters whose cost is per drafting pass.

A model drafter (vLLM's ``draft_model``, EAGLE, MTP, DSpark) runs one forward
pass per draft position for the whole batch: the step costs about
``base + passes x pass`` where ``passes`` is the batch's deepest depth
(``num_spec_tokens_to_schedule``), almost whatever the other requests verify,
and a batch whose requests verify the same number of tokens can run a CUDA graph
a mixed one cannot. A per-draft price cannot see that (one request's extra draft
costs the batch a whole pass, or nothing); docs/gpu.md has the measurements.

This chooser runs windows of 8 steps at one depth D, learns the step time at
each D per batch-size bucket (decode steps only) and picks the D with the most
expected tokens per second, every adaptive request verifying min(cap, D):

    rate(D) = (F + sum_i y_i(D)) / T(D),   y_i(D) = 1 + E_i(min(cap_i, D))

E_i is the request's expected accepted drafts (the controller's estimates); F the
expected tokens of the batch's requests at a depth the window does not set (held
at a thinking budget: 1 each), which every depth's T(D) includes. A request with
L tokens left before its depth stops mattering (its max_tokens, its thinking-budget
hold) that a window of W steps would exhaust (W y > L) yields, a step over the
window, (L + W - L / y) / W: its L tokens, then one a step (held, or its slot
taken by the next request). Without that, a window chosen as a batch starts its
16-token answers priced depth 3 at 2.75 tokens a request a step for 8 steps, and
yielded 0.83 of what it was priced at (fifteenth GPU session, c=64: depth-3
windows at 0.79-0.83, depth 1 at 0.97; docs/gpu.md).
The other way round, a held request that leaves its hold within the window (the
controller measures how long holds last) counts a token a step until then and
its answer's 1 + E(min(cap, D)) after: counted as held for the whole window,
a batch chosen with most of it held ran depth 0 while its requests left the hold
together (twentieth GPU session, c=64: 32 depth-0 windows ran with 10-49 of 64
held, where depth 1 yielded 16-25% more per ms).
A step with no adaptive request (every request held) ends the window planned (``interrupt``):
the batch after it is another (c=64: a batch enters its holds together, and leaves them
together after steps with all held), and a depth-0 window chosen on the way in ran on while
the batch answered (twenty-first GPU session: depth-0 windows at 10-50 of 64 held yielded
14-23% less per ms than depth 1). Each depth is timed at the drafts per request the batch would
verify at it (``shares``; ``BucketTimes.slope``): held requests verify none at any depth.

T(D) comes from windows compared with their neighbours, never from windows far
apart in time. A window's time is its mean step time (each step from the update
before it to its own, over the steps the worker went straight into; a step over
4x the mean of the window's other steps is a stall, left out): under async
scheduling updates arrive in bunches, which moves time between neighbouring
steps but not out of a window. The machine's speed drifts more than depths
differ (eighth GPU session: window means 0.77-1.52x their depth's median,
consecutive windows correlated 0.83, a warm-up period twice as slow), so a depth
timed minutes ago and one timed now cannot be compared: when the chooser kept
each depth's own windows, a depth passed over stayed priced by its first,
slow windows (batch 1: depths 0-2 at 23.9-27.8 ms against 11.8-15.7 in static
cells) and the chooser ran the wrong depth for whole benchmarks. Instead each
window that directly follows a window of another depth at the same bucket gives
one pair, the log ratio of their times, in which the machine's speed cancels
(``BucketTimes``): the depths' relative times are a least-squares fit to the
pairs' medians, the level comes from the last windows. A switch's own cost
lands in each pair's second window; a depth explored and left again gives pairs
both ways, whose mean cancels it and a steady trend.

The depths weighed are 0 to the deepest cap of the batch's adaptive requests (a
deeper window would run as that one). A depth not yet linked to the others at
this batch size is tried first, for two windows (its first steps at a bucket pay
one-time costs). A depth the choice passes over is run again, for two windows,
once it has not run for its wait times its patience: 1 for a depth within
``close_gap`` (5%) of the best rate, up to ``max_patience`` (6) for one further
below (2 before the twentieth GPU session, where 6 took adaptive from 0.93-0.95 to
0.96-0.97 of fixed-1: on an H200 re-running the costly depths 2-3 was most of its gap
to the chooser capped at depth 1). The wait is half the windows this
bucket has had so far (at least 16), at most K / ``explore_share``: a close
depth is re-checked often while the estimates are young and rest on few pairs,
then at the fixed interval. With ``drain_horizon`` (off by default), a batch with a window or two of
tokens left tries and re-runs nothing (``drains``). ``load/chooser_sim.py`` replays these rules against
step times drawn from a GPU run's measured scatter, ``load/chooser_sweep.py``
against every recorded run's (simulations, docs/gpu.md).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.cost_model import bucket_of
from engine.step_times import BucketTimes, StepWindow

MAX_PATIENCE = 6.0
"""The default ``StepDepthChooser.max_patience`` (``ControllerSettings.step_max_patience``)."""


@dataclass(frozen=True, slots=True)
class Leaving:
    """A request held at its thinking budget (a token a step, whatever the depth) that leaves the
    hold within the window, after ``held_steps`` of its steps, and from then verifies the window's
    depth: its expected accepted drafts by depth then (``gains``, its answer's), its cap, and its
    tokens after the hold before its depth stops mattering (``left``; None: no end known)."""

    gains: Sequence[float]
    cap: int
    held_steps: int
    left: int | None


@dataclass(slots=True)
class StepDepthChooser:
    max_depth: int
    rng: random.Random
    window_steps: int = 8
    """Steps per depth decision. A step is timed from the update before it to its own (under
    async scheduling a step is scheduled while the one before it runs, so only consecutive
    updates time it)."""
    memory: int = 16
    """Pairs kept per (depth, depth) and bucket, and windows the level is read from."""
    min_timed: int = 3
    """A window with fewer timed steps (prefills, a batch that changed bucket) is not kept."""
    close_gap: float = 0.05
    """A passed-over depth within this share of the best rate is re-run after its wait; one further
    below waits proportionally longer."""
    max_patience: float = MAX_PATIENCE
    """The longest a passed-over depth waits, in units of its wait."""
    rerun_fraction: float = 0.5
    """A passed-over depth's wait: this share of the bucket's windows so far (1: never before
    K / explore_share: the earlier rule)..."""
    min_rerun_wait: int = 16
    """... but at least this many windows, and at most K / explore_share."""
    borrow: bool = False
    """A depth not yet linked to the others at a bucket is priced from the nearest bucket where every
    depth is, and tried first only when that price is within ``close_gap`` of the best; False (the
    default, ``ControllerSettings.step_borrow_times``): every such depth is tried first."""
    drain_horizon: bool = False
    """A batch whose adaptive requests all run out of tokens (``lefts``) within two windows at depth 1
    (a cell's last requests, a batch about to enter its holds) tries no depth first and re-runs none:
    a depth not yet linked at its bucket is priced from the nearest bucket where every depth is, or
    left out (``ControllerSettings.step_drain_horizon``). What such a window would learn is rarely
    used: the batch is gone in a window or two, and windows at the small buckets a drain passes
    through come a cell apart, never pair, and stay unlinked (twenty-third GPU session: adaptive's
    cells ran up to 19 steps with slots free against fixed-1's 6-8)."""
    drain_finish: bool = False
    """A batch that ends within the window with no request waiting for a slot (``choose``'s
    ``finishing``: a cell's last requests) is priced by the steps until its last request ends, not
    a whole window with a token a step credited for each slot freed: in a drain no request takes
    the slot, and the batch's steps cost nearly as much with a few requests as with all
    (``ControllerSettings.step_drain_finish``; twenty-third GPU session: a third to half of
    adaptive's drain steps, CPU engine, ran depth 0, which the credit made look as good as depth 1
    for a request with a few tokens left)."""
    min_depth: int = 0
    """The shallowest depth a window runs (``ControllerSettings.step_min_depth``): 1 leaves depth 0
    out (a diagnostic arm: do depth-0 windows, chosen when most of a batch is held, slow the
    requests still reasoning into a cell's stragglers?)."""
    by_share: bool = True
    """A depth's step time at the drafts per request the batch would verify at it (held requests
    verify none), from the measured slope (``BucketTimes.slope``); False
    (``ControllerSettings.step_verify_share``): one time per depth and bucket."""
    one_pass: bool = False
    """Depth 0 priced as depth 1's drafter pass at its own share (``BucketTimes.one_pass``;
    ``ControllerSettings.step_one_pass``)."""
    stall_factor: float = 4.0
    """A step over this many times the mean of its window's other steps is a stall (a first use of a
    shape, a pause), not the depth's cost: left out of the window's mean."""
    times: dict[int, BucketTimes] = field(default_factory=dict)
    """Bucket of batch sizes -> its step times."""
    current: StepWindow | None = None
    timing: StepWindow | None = None
    """The window whose steps are finishing now (under async scheduling, the one before ``current``)."""
    last_kept: StepWindow | None = None
    """The last window kept, when nothing came between it and the next one (a pair's first half)."""
    resumed: bool = False
    """Steps without adaptive requests came since the last window's step (``interrupt``)."""
    cut: dict[int, int] = field(default_factory=dict)
    """Bucket -> windows that ``interrupt`` ended with steps still planned."""
    repeat: int | None = None
    """A depth run again in the next window, so that it is timed after a window of its own."""
    history: deque[tuple[int, int, bool, int, float, float, float, float, float, float]] = field(
        default_factory=lambda: deque(maxlen=1024)
    )
    """The last closed windows as (bucket, depth, switched, steps in the mean, mean step seconds,
    slowest step seconds, requests at a depth it did not set per planned step, tokens per step
    expected when chosen, tokens per finished step, drafts verified per request): what the
    estimates were made from and how the choice's token count held (``/phasespec/state``; a
    benchmark's whole run)."""

    def choose(
        self,
        batch: int,
        gains: Sequence[Sequence[float]],
        caps: Sequence[int],
        explore_share: float,
        fixed_tokens: float = 0.0,
        ahead: bool = False,
        lefts: Sequence[int | None] | None = None,
        leaving: Sequence[Leaving] = (),
        fixed_drafts: float = 0.0,
        finishing: bool = False,
    ) -> StepWindow:
        """The window this step runs in; ``gains[i][d]``: request i's expected accepted drafts at depth d;
        ``fixed_tokens``: the expected tokens of the batch's requests whose depth the window does not set.
        ``ahead``: chosen at the last step of the window before it, so its first step is the next one.
        ``lefts[i]``: request i's tokens before its depth stops mattering (None: no end known).
        ``leaving``: held requests that leave their hold within the window (not in ``fixed_tokens``).
        ``fixed_drafts``: the drafts a step the requests whose depth the window does not set verify.
        ``finishing``: every request ends at its ``lefts`` and none waits for a slot (``drain_finish``)."""
        window = self.next_step()
        if window is not None:
            return window
        previous = self.current.depth if self.current is not None else None
        bucket = bucket_of(batch)
        table = self.bucket(bucket)
        table.windows += 1
        # A depth past every request's cap runs as the deepest cap (each verifies min(cap, D)): timed
        # under its own name, it priced depth 3 at depth 1's cost whenever the batch was capped at 1.
        top = min(self.max_depth, max([*caps, *(r.cap for r in leaving)], default=self.max_depth))
        shares = self.shares(batch, caps, fixed_drafts, leaving)
        estimates = table.estimates(shares)
        lowest = max(0, min(self.min_depth, top))
        untimed = [d for d, t in enumerate(estimates[: top + 1]) if t is None and d >= lowest]

        def rates_at(times: Sequence[float | None]) -> list[float]:
            """Expected tokens per second per depth up to ``top`` (0 where a depth has no time)."""
            return [
                0.0
                if t is None
                else self.rate(d, times, self.per_step(d, gains, caps, fixed_tokens, lefts, leaving, finishing))
                for d, t in enumerate(times[: top + 1])
            ]

        rates: list[float] = []
        draining = self.drain_horizon and self.drains(gains, caps, lefts)
        if untimed and (self.borrow or draining):
            priced = self.borrowed(bucket, estimates, top, shares)
            if priced is not None:
                estimates = priced
                rates = rates_at(estimates)
                untimed = [] if draining else [d for d in untimed if rates[d] >= (1 - self.close_gap) * max(rates)]
            elif draining and len(untimed) <= top - lowest:  # no bucket to borrow from: the best of those linked here
                rates = rates_at(estimates)
                untimed = []
        if draining:
            self.repeat = None
        if self.repeat is not None and not lowest <= self.repeat <= top:
            self.repeat = None
        if self.repeat is not None:
            depth, self.repeat = self.repeat, None
        elif untimed:
            # Two windows: a depth's first steps at a batch size pay one-time costs (H200: single
            # steps of 96-149 ms against ~12), and the second is the pair's first half for the next.
            depth = self.repeat = self.rng.choice(untimed)
        else:
            rates = rates or rates_at(estimates)
            stale = None if draining else self.stale(table, rates, explore_share, lowest)
            if stale is not None:
                depth = self.repeat = stale
            else:
                depth = max(range(lowest, top + 1), key=rates.__getitem__)
        table.last_window[depth] = table.windows
        self.current = StepWindow(depth, self.window_steps - (not ahead), bucket, switched=depth != previous)
        self.current.predicted = self.per_step(depth, gains, caps, fixed_tokens, lefts, leaving, finishing)
        return self.current

    def drains(self, gains: Sequence[Sequence[float]], caps: Sequence[int], lefts: Sequence[int | None] | None) -> bool:
        """Whether every adaptive request runs out of its tokens left within two windows at depth 1
        (its 1 + E(min(cap, 1)) tokens a step); False when any has no end known."""
        if not lefts or not gains:
            return False
        steps = 0.0
        for g, cap, left in zip(gains, caps, lefts, strict=True):
            if left is None:
                return False
            steps = max(steps, left / (1 + g[min(cap, 1)]))
        return steps < 2 * self.window_steps

    def shares(self, batch: int, caps: Sequence[int], fixed_drafts: float, leaving: Sequence[Leaving]) -> list[float]:
        """Per depth D, the drafts a step of a window at D verifies per request of the batch: each
        adaptive request's min(cap, D), the fixed ones', a leaving request's over its steps after
        the hold."""
        steps = self.window_steps
        return [
            (
                sum(min(cap, d) for cap in caps)
                + fixed_drafts
                + sum(min(r.cap, d) * (steps - min(r.held_steps, steps)) / steps for r in leaving)
            )
            / max(batch, 1)
            for d in range(self.max_depth + 1)
        ]

    def borrowed(
        self, bucket: int, estimates: Sequence[float | None], top: int, shares: Sequence[float] | None = None
    ) -> list[float | None] | None:
        """``estimates`` with the depths up to ``top`` not linked here priced from the nearest bucket
        where all of them are: its time relative to the nearest depth linked here (or, none linked,
        its times as they are: only ratios decide), at ``shares``. None: no such bucket."""
        for other in sorted(self.times, key=lambda b: (abs(b - bucket), b)):
            there = self.times[other].estimates(shares) if other != bucket else []
            if len(there) <= top or any(t is None for t in there[: top + 1]):
                continue
            linked = [d for d in range(top + 1) if estimates[d] is not None]
            out = list(estimates)
            for d in range(top + 1):
                if out[d] is None:
                    ref = min(linked, key=lambda r: (abs(r - d), r)) if linked else None
                    here, near = (1.0, 1.0) if ref is None else (estimates[ref], there[ref])
                    far = there[d]
                    assert here is not None and near is not None and far is not None
                    out[d] = here * far / near
            return out
        return None

    def interrupt(self) -> None:
        """A step without adaptive requests (all held at their thinking budget, or static): the window
        planned ends (a window chosen ahead, with no step planned yet, too), and the next is chosen
        for the batch that follows. The batch after such steps is another: the requests entered
        their holds before it and leave them in it, so a depth chosen before no longer holds."""
        if self.current is not None:
            if self.current.to_plan > 0:
                self.cut[self.current.bucket] = self.cut.get(self.current.bucket, 0) + 1
            self.current.to_plan = 0
            self.resumed = True

    def next_step(self) -> StepWindow | None:
        """The current window, when this step still belongs to it (None: a new window is due)."""
        window = self.current
        if window is not None and window.to_plan > 0:
            window.to_plan -= 1
            return window
        return None

    def stale(self, table: BucketTimes, rates: Sequence[float], explore_share: float, lowest: int = 0) -> int | None:
        """The passed-over depth to run again now, if any (the longest unrun of those due): one that
        has not run for its wait (``rerun_fraction`` of this bucket's windows, between
        ``min_rerun_wait`` and K / ``explore_share``) times its patience, its gap below the best rate
        in units of ``close_gap``, between 1 and ``max_patience``."""
        if explore_share <= 0:
            return None
        best = max(rates)
        wait = min(self.max_depth / explore_share, max(self.min_rerun_wait, self.rerun_fraction * table.windows))
        due = []
        for d, rate in enumerate(rates):
            if d < lowest:
                continue
            gap = 1 - rate / best if best > 0 else 0.0
            patience = min(max(1.0, gap / self.close_gap), self.max_patience)
            if table.windows - table.last_window[d] > wait * patience:
                due.append((table.last_window[d], d))
        return min(due)[1] if due else None

    @staticmethod
    def rate(depth: int, table: Sequence[float | None], tokens: float) -> float:
        """Expected tokens per second at ``depth``, for ``tokens`` a step."""
        seconds = table[depth]
        assert seconds is not None
        return tokens / seconds if seconds > 0 else math.inf

    def per_step(
        self,
        depth: int,
        gains: Sequence[Sequence[float]],
        caps: Sequence[int],
        fixed_tokens: float,
        lefts: Sequence[int | None] | None,
        leaving: Sequence[Leaving],
        finishing: bool,
    ) -> float:
        """Expected tokens a step of a window at ``depth`` (``tokens_at``); a finishing batch
        (``drain_finish``) that ends within the window at ``depth``: its tokens over the steps until
        its last request ends (a batch that runs on past the window is priced as any, its freed
        slots credited)."""
        if not (self.drain_finish and finishing and lefts and all(left is not None for left in lefts)):
            return self.tokens_at(depth, gains, caps, fixed_tokens, lefts, leaving)
        ends = [left for left in lefts if left is not None]
        rates = [1 + g[min(cap, depth)] for g, cap in zip(gains, caps, strict=True)]
        runs = max(left / y for left, y in zip(ends, rates, strict=True))
        if runs >= self.window_steps:
            return self.tokens_at(depth, gains, caps, fixed_tokens, lefts, leaving)
        return sum(ends) / max(1.0, runs)

    def tokens_at(
        self,
        depth: int,
        gains: Sequence[Sequence[float]],
        caps: Sequence[int],
        fixed_tokens: float,
        lefts: Sequence[int | None] | None = None,
        leaving: Sequence[Leaving] = (),
    ) -> float:
        """Expected tokens a step of a window at ``depth``: each request's 1 + E(min(cap, depth)), less
        what the window would run past its tokens left, plus those of the requests whose depth the
        window does not set, plus those of the held requests leaving their hold in it (a token a
        step while held, then as the others)."""
        steps = self.window_steps
        total = fixed_tokens
        for g, cap, left in zip(gains, caps, lefts if lefts is not None else [None] * len(gains), strict=True):
            total += window_tokens(steps, 1 + g[min(cap, depth)], left) / steps
        for r in leaving:
            held = min(r.held_steps, steps)
            total += (held + window_tokens(steps - held, 1 + r.gains[min(r.cap, depth)], r.left)) / steps
        return total

    def step_finished(
        self, window: StepWindow, batch: int, previous_update: float, now: float, tokens: int = 0
    ) -> None:
        """A decode step of the window finished at ``now`` with ``tokens`` new tokens; the update before
        it came at ``previous_update`` (0: the worker did not go straight into it, so it is not timed)."""
        if window is not self.timing:
            self.close(self.timing)
            self.timing = window
        if not window.finished:
            window.started = previous_update or now
        window.finished += 1
        window.tokens += tokens
        window.ended = now
        if previous_update > 0 and bucket_of(batch) == window.bucket:
            window.steps_s.append(now - previous_update)
        if window.finished >= self.window_steps:
            self.close(window)

    def close(self, window: StepWindow | None) -> None:
        """Keep a finished window's mean step time (once), paired with the window before it when
        that one was kept at the same bucket and ended no longer ago than this one lasted (other
        policies' requests, or none, may run between two adaptive windows)."""
        if window is None or window.closed:
            return
        window.closed = True
        before, self.last_kept = self.last_kept, None
        if len(window.steps_s) < self.min_timed:
            return
        measured, slowest, kept = window.mean_and_slowest(self.stall_factor)
        fixed = window.fixed / window.planned if window.planned else 0.0
        realized = window.tokens / window.finished if window.finished else 0.0
        share = window.share()
        self.history.append(
            (
                *(window.bucket, window.depth, window.switched, kept, measured, slowest),
                *(fixed, window.predicted, realized, share),
            )
        )
        adjacent = (
            before is not None
            and before.bucket == window.bucket
            and window.started - before.ended <= window.ended - window.started
        )
        self.bucket(window.bucket).add(window.depth, measured, adjacent, share)
        self.last_kept = window

    def bucket(self, bucket: int) -> BucketTimes:
        table = self.times.get(bucket)
        if table is None:
            table = self.times[bucket] = BucketTimes.empty(self.max_depth, self.memory, self.by_share, self.one_pass)
        return table

    def observe(self, bucket: int, depth: int, seconds: float, share: float | None = None) -> None:
        """A window's mean step time at ``share`` drafts verified per request (None: its depth), right
        after the last one observed at ``bucket`` (tests)."""
        self.bucket(bucket).add(depth, seconds, adjacent=True, share=share)

    def snapshot(self) -> dict[str, Any]:
        return {
            str(bucket): [None if t is None else round(t * 1e3, 3) for t in table.estimates()]
            for bucket, table in sorted(self.times.items())
        }

    def windows_snapshot(self) -> list[list[Any]]:
        """The last closed windows: [bucket, depth, switched, steps in the mean, mean step ms, slowest step
        ms, requests per step at a depth the window did not set, tokens per step expected when chosen,
        tokens per finished step, drafts verified per request]."""
        rows = []
        for b, d, s, n, t, top, fixed, want, got, v in self.history:
            ms = [round(t * 1e3, 3), round(top * 1e3, 3)]
            rows.append([b, d, s, n, *ms, round(fixed, 2), round(want, 2), round(got, 2), round(v, 3)])
        return rows

    def cut_snapshot(self) -> dict[str, int]:
        """Per bucket, the windows ``interrupt`` ended with steps still planned."""
        return {str(bucket): n for bucket, n in sorted(self.cut.items())}

    def slope_snapshot(self) -> dict[str, float]:
        """Per bucket, the log step time's slope in drafts verified per request."""
        return {str(bucket): round(table.slope(), 4) for bucket, table in sorted(self.times.items())}

    def switch_snapshot(self) -> dict[str, float | None]:
        """Per bucket, what a switch of depth adds to a window's time, as a share."""
        return {
            str(bucket): None if (share := table.switch_share()) is None else round(share, 4)
            for bucket, table in sorted(self.times.items())
        }


def window_tokens(steps: int, per_step: float, left: int | None) -> float:
    """Tokens a request yields in ``steps`` steps at ``per_step`` with ``left`` tokens before its depth
    stops mattering (None: no end): its ``left`` tokens, then one a step (held, or its slot taken
    by the next request)."""
    if left is None or steps * per_step <= left:
        return steps * per_step
    return left + steps - left / per_step
