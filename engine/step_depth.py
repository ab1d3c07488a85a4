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

    rate(D) = (F + sum_i (1 + E_i(min(cap_i, D)))) / T(D)

E_i is the request's expected accepted drafts (the controller's estimates); F the
expected tokens of the batch's requests at a depth the window does not set (held
at a thinking budget: 1 each), which every depth's T(D) includes. A
depth not yet timed at this batch size is tried first, for two windows. T(D) is
the median (the faster, of two) over the depth's last 16 windows at this batch
size of each window's mean step time (each step from the update before it to its own, over
the steps the worker went straight into: an idle gap before a step is not its
cost; a step over 4x the mean of the window's other steps is a stall, left
out). A window's mean, not each step's own time: under async scheduling the
engine core's updates can arrive in bunches (a delayed one, then its successor
at once), which moves time between neighbouring steps but not out of a window
(per-step times read 0.6 ms for a batch-1 step that takes over 10 ms on the
H200: docs/gpu.md). The median over windows keeps one slow window (a pause,
prefills next door) from pricing a depth out, even when it is one of two.

The machine's speed drifts: on the H200 machines a window's mean scattered
0.84-1.35x its depth's median (10th-90th percentile) and consecutive windows
correlated 0.6. So a window is kept over the speed the one before it showed
(``drift_carry`` of its log ratio to its depth's time), which lets depths timed
at different moments compare as if timed at one.

Windows that follow a window of the same depth ("steady") time T(D); a window
that switched depth is timed apart, and what it cost beyond the median steady
window is the switch cost, charged to every other depth (amortized over
``switch_horizon`` windows) when the choice weighs a switch. Once a depth has a
steady time, its after-switch windows count too, less the median switch cost: a
passed-over depth is mostly re-timed by windows that switch to it. A depth timed
only right after switches carries their cost in its time. A depth the choice passes over is run
again, for two windows (the second steady), once it has not run for
K / ``explore_share`` windows of this bucket times its patience: 1 for a depth
within ``close_gap`` (5%) of the best rate, up to ``max_patience`` (2) for one
further below (re-running a clearly worse depth costs its gap and rarely changes
the choice). On the H200 the depths the chooser rarely ran read 43-75% above
what static cells measured, and a depth's first window at a batch size held one
step of 96-149 ms (docs/gpu.md): hence two windows for a new depth, the stall
rule and the faster of two windows. ``load/chooser_sim.py`` replays these rules against
step times drawn from a GPU run's measured scatter (a simulation, docs/gpu.md).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.cost_model import bucket_of


def typical(window_means: Sequence[float]) -> float:
    """A depth's step time from its windows' means: the faster of one or two, the median of more.

    Not the mean of two: one stalled window would price a rarely-run depth out until it is
    explored again, 60 windows later (on the H200 depth 1 read 31.2 ms at batch 9-16 against
    11.1 ms in static cells, from windows not kept then). From three on the median: the lower
    median of many sits below the depth's usual time, and the incumbent, timed by many windows,
    then loses to a challenger timed by few (replayed against the seventh and eighth GPU sessions'
    scatter, ``load/chooser_sim.py``: medians equal or up to 1.3% higher, worst seeds equal or
    higher)."""
    if len(window_means) <= 2:
        return min(window_means)
    return statistics.median(window_means)


@dataclass(slots=True)
class StepWindow:
    """Consecutive steps run at one depth."""

    depth: int
    to_plan: int
    """Steps still to be scheduled in it."""
    bucket: int = 0
    """The batch-size bucket it was chosen for; only its steps at that bucket are timed."""
    switched: bool = True
    """Its depth differs from the window before it (or none came before)."""
    finished: int = 0
    steps_s: list[float] = field(default_factory=list)
    """Its timed steps' times."""
    planned: int = 0
    predicted: float = 0.0
    """Tokens a step of it was expected to yield when it was chosen (the rate's numerator)."""
    tokens: int = 0
    """Tokens its finished steps yielded (what the prediction is checked against)."""
    fixed: int = 0
    """Requests in its planned steps whose depth it did not set (held at a thinking budget, or
    static), summed: the batch's make-up, which the depth's time may depend on."""
    closed: bool = False

    def mean_and_slowest(self, stall_factor: float) -> tuple[float, float, int]:
        """Mean step time without stalls (steps over ``stall_factor`` x the mean of the window's
        other steps), the slowest step, and the number of steps the mean is over. Not against the
        median: under async scheduling bunched updates pair a long step with a near-zero one, and
        the short ones can be the majority of a window."""
        total, n = sum(self.steps_s), len(self.steps_s)
        kept = [t for t in self.steps_s if t * (n - 1) <= stall_factor * (total - t)]
        return sum(kept) / len(kept), max(self.steps_s), len(kept)


@dataclass(slots=True)
class BucketTimes:
    """Step times at one bucket of batch sizes: per depth, the mean step time of its last windows
    that followed a window of the same depth (``steady``) and of those that switched to it
    (``after_switch``, used until a steady one exists); the extra time a switch cost; and when
    each depth last got a window."""

    steady: list[deque[float]]
    after_switch: list[deque[float]]
    switch_s: deque[float]
    last_window: list[int]
    windows: int = 0
    """Windows chosen at this bucket so far."""
    drift: float = 0.0
    """Log of how much slower than its depth's estimate the last kept window ran."""

    @classmethod
    def empty(cls, max_depth: int, memory: int) -> BucketTimes:
        depths = range(max_depth + 1)
        return cls(
            [deque(maxlen=memory) for _ in depths],
            [deque(maxlen=memory) for _ in depths],
            deque(maxlen=memory),
            [0] * (max_depth + 1),
        )

    def estimates(self, window_steps: int = 8, with_switched: bool = True) -> list[float | None]:
        """Step seconds per depth (None: not timed yet): ``typical`` of its steady windows and,
        less the median switch cost, of the windows that switched to it (``with_switched``). A depth
        the chooser passes over is mostly re-timed by windows that switch to it: without them its
        time stays what its first windows read, however long ago (the eighth GPU session: depth 1 at
        batch 3-4 priced at 23.0 ms by an old steady window while its last window, after a switch
        that cost nothing, read 11.9; static cells 11-15)."""
        per_step = self.switch_cost() / window_steps
        out: list[float | None] = []
        for steady, switched in zip(self.steady, self.after_switch, strict=True):
            if steady and with_switched:
                out.append(typical([*steady, *(t - per_step for t in switched)]))
            else:
                out.append(typical(steady or switched) if steady or switched else None)
        return out

    def switch_cost(self) -> float:
        """Median extra seconds a window spent for switching depth (0 until measured)."""
        return max(statistics.median(self.switch_s), 0.0) if self.switch_s else 0.0


@dataclass(slots=True)
class StepDepthChooser:
    max_depth: int
    rng: random.Random
    window_steps: int = 8
    """Steps per depth decision. A step is timed from the update before it to its own (under
    async scheduling a step is scheduled while the one before it runs, so only consecutive
    updates time it)."""
    memory: int = 16
    """Window means kept per depth and bucket; their ``typical`` is the depth's step time."""
    min_timed: int = 3
    """A window with fewer timed steps (prefills, a batch that changed bucket) is not kept."""
    switch_horizon: int = 4
    """Windows a switch is amortized over when weighing it."""
    close_gap: float = 0.05
    """A passed-over depth within this share of the best rate is re-run every K / explore_share
    windows; one further below waits proportionally longer."""
    drift_carry: float = 0.3
    """How much of the last window's speed over its depth's estimate carries into the next."""
    max_patience: float = 2.0
    """The longest a passed-over depth waits, in units of K / explore_share windows."""
    with_switched: bool = True
    """A depth's time includes its after-switch windows, less the switch cost (``BucketTimes.estimates``)."""
    stall_factor: float = 4.0
    """A step over this many times the mean of its window's other steps is a stall (a first use of a
    shape, a pause), not the depth's cost: left out of the window's mean."""
    times: dict[int, BucketTimes] = field(default_factory=dict)
    """Bucket of batch sizes -> its step times."""
    current: StepWindow | None = None
    timing: StepWindow | None = None
    """The window whose steps are finishing now (under async scheduling, the one before ``current``)."""
    repeat: int | None = None
    """A depth run again in the next window, so that it is timed after a window of its own."""
    history: deque[tuple[int, int, bool, int, float, float, float, float, float]] = field(
        default_factory=lambda: deque(maxlen=1024)
    )
    """The last closed windows as (bucket, depth, switched, steps in the mean, mean step seconds,
    slowest step seconds, requests at a depth it did not set per planned step, tokens per step
    expected when chosen, tokens per finished step): what the estimates were made from and how the
    choice's token count held (``/phasespec/state``; a benchmark's whole run)."""

    def choose(
        self,
        batch: int,
        gains: Sequence[Sequence[float]],
        caps: Sequence[int],
        explore_share: float,
        fixed_tokens: float = 0.0,
    ) -> StepWindow:
        """The window this step runs in; ``gains[i][d]``: request i's expected accepted drafts at depth d;
        ``fixed_tokens``: the expected tokens of the batch's requests whose depth the window does not set."""
        window = self.next_step()
        if window is not None:
            return window
        previous = self.current.depth if self.current is not None else None
        bucket = bucket_of(batch)
        table = self.bucket(bucket)
        table.windows += 1
        estimates = table.estimates(self.window_steps, self.with_switched)
        untimed = [d for d, t in enumerate(estimates) if t is None]
        if self.repeat is not None:
            depth, self.repeat = self.repeat, None
        elif untimed:
            # Two windows, the second timed steady: a depth's first steps at a batch size
            # pay one-time costs (H200: single steps of 96-149 ms against ~12).
            depth = self.repeat = self.rng.choice(untimed)
        else:
            # A switch is paid once and the new depth kept for windows: amortized over a few.
            switch_s = table.switch_cost() / (self.window_steps * self.switch_horizon)
            rates = [self.rate(d, estimates, gains, caps, fixed_tokens=fixed_tokens) for d in range(self.max_depth + 1)]
            stale = self.stale(table, rates, explore_share)
            if stale is not None:
                depth = self.repeat = stale
            else:

                def worth(d: int) -> float:
                    return self.rate(d, estimates, gains, caps, 0.0 if d == previous else switch_s, fixed_tokens)

                depth = max(range(self.max_depth + 1), key=worth)
        table.last_window[depth] = table.windows
        self.current = StepWindow(depth, self.window_steps - 1, bucket, switched=depth != previous)
        self.current.predicted = self.tokens_at(depth, gains, caps, fixed_tokens)
        return self.current

    def next_step(self) -> StepWindow | None:
        """The current window, when this step still belongs to it (None: a new window is due)."""
        window = self.current
        if window is not None and window.to_plan > 0:
            window.to_plan -= 1
            return window
        return None

    def stale(self, table: BucketTimes, rates: Sequence[float], explore_share: float) -> int | None:
        """The passed-over depth to run again now, if any (the longest unrun of those due): one that
        has not run for K / ``explore_share`` windows of this bucket times its patience, its gap
        below the best rate in units of ``close_gap``, between 1 and ``max_patience``."""
        if explore_share <= 0:
            return None
        best = max(rates)
        due = []
        for d, rate in enumerate(rates):
            # A depth timed only after switches carries their cost: not judged by its gap.
            gap = 1 - rate / best if best > 0 and table.steady[d] else 0.0
            patience = min(max(1.0, gap / self.close_gap), self.max_patience)
            if table.windows - table.last_window[d] > self.max_depth / explore_share * patience:
                due.append((table.last_window[d], d))
        return min(due)[1] if due else None

    @staticmethod
    def rate(
        depth: int,
        table: Sequence[float | None],
        gains: Sequence[Sequence[float]],
        caps: Sequence[int],
        extra_s: float = 0.0,
        fixed_tokens: float = 0.0,
    ) -> float:
        """Expected tokens per second at ``depth``, each step costing ``extra_s`` more (a switch), with
        ``fixed_tokens`` a step from requests whose depth it does not set."""
        seconds = table[depth]
        assert seconds is not None
        tokens = StepDepthChooser.tokens_at(depth, gains, caps, fixed_tokens)
        return tokens / (seconds + extra_s) if seconds + extra_s > 0 else math.inf

    @staticmethod
    def tokens_at(depth: int, gains: Sequence[Sequence[float]], caps: Sequence[int], fixed_tokens: float) -> float:
        """Expected tokens of a step at ``depth``: each request's 1 + E(min(cap, depth)), plus those of the
        requests whose depth the window does not set."""
        return fixed_tokens + sum(1 + g[min(cap, depth)] for g, cap in zip(gains, caps, strict=True))

    def step_finished(
        self, window: StepWindow, batch: int, previous_update: float, now: float, tokens: int = 0
    ) -> None:
        """A decode step of the window finished at ``now`` with ``tokens`` new tokens; the update before
        it came at ``previous_update``."""
        if window is not self.timing:
            self.close(self.timing)
            self.timing = window
        window.finished += 1
        window.tokens += tokens
        if previous_update > 0 and bucket_of(batch) == window.bucket:
            window.steps_s.append(now - previous_update)
        if window.finished >= self.window_steps:
            self.close(window)

    def close(self, window: StepWindow | None) -> None:
        """Keep a finished window's time (once): a steady window's mean step time; a switching
        one's mean while its depth has no steady time, and what the switch cost over it."""
        if window is None or window.closed:
            return
        window.closed = True
        if len(window.steps_s) < self.min_timed:
            return
        table = self.bucket(window.bucket)
        measured, slowest, kept = window.mean_and_slowest(self.stall_factor)
        fixed = window.fixed / window.planned if window.planned else 0.0
        realized = window.tokens / window.finished if window.finished else 0.0
        self.history.append(
            (window.bucket, window.depth, window.switched, kept, measured, slowest, fixed, window.predicted, realized)
        )
        # The machine's speed drifts (consecutive windows' scatter correlates 0.6 on the H200):
        # a window is kept over the speed the window before it predicts, so depths timed at
        # different times compare as if timed at one.
        mean = measured / math.exp(self.drift_carry * table.drift)
        steady = table.steady[window.depth]
        if not window.switched:
            if steady:  # only a steady window tells the machine's speed: a switch adds its own cost
                table.drift = math.log(measured / typical(steady))
            steady.append(mean)
            return
        if steady:
            # Against the median, not a lower one: below it a switch would absorb the ordinary
            # scatter of windows.
            table.switch_s.append((mean - statistics.median(steady)) * kept)
        table.after_switch[window.depth].append(mean)

    def bucket(self, bucket: int) -> BucketTimes:
        table = self.times.get(bucket)
        if table is None:
            table = self.times[bucket] = BucketTimes.empty(self.max_depth, self.memory)
        return table

    def observe(self, bucket: int, depth: int, seconds: float) -> None:
        """A steady window's mean step time."""
        self.bucket(bucket).steady[depth].append(seconds)

    def snapshot(self) -> dict[str, Any]:
        return {
            str(bucket): [
                None if t is None else round(t * 1e3, 3) for t in table.estimates(self.window_steps, self.with_switched)
            ]
            for bucket, table in sorted(self.times.items())
        }

    def windows_snapshot(self) -> list[list[Any]]:
        """The last closed windows: [bucket, depth, switched, steps in the mean, mean step ms, slowest step
        ms, requests per step at a depth the window did not set, tokens per step expected when chosen,
        tokens per finished step]."""
        return [
            [b, d, s, n, round(t * 1e3, 3), round(top * 1e3, 3), round(fixed, 2), round(want, 2), round(got, 2)]
            for b, d, s, n, t, top, fixed, want, got in self.history
        ]

    def switch_snapshot(self) -> dict[str, float]:
        """Per bucket, the measured extra ms a window pays for switching depth."""
        return {str(bucket): round(table.switch_cost() * 1e3, 3) for bucket, table in sorted(self.times.items())}
