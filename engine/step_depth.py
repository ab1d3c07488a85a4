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

    rate(D) = sum_i (1 + E_i(min(cap_i, D))) / T(D)

E_i is the request's expected accepted drafts (the controller's estimates). A
depth not yet timed at this batch size is tried first. T(D) is the median over
the depth's last 8 windows at this batch size of each window's mean step time
(the time from the update before its second step to its last update, divided by
its steps). A window's mean, not each step's own time: under async scheduling
the engine core's updates can arrive in bunches (a CPU stall delays one, the
next follows at once), which moves time between neighbouring steps but not out
of a window; per-step times had read 0.6 ms for a batch-1 step that takes over
10 ms on the H200, and 10 vs 18 ms for the same depth in two runs (docs/gpu.md).
The median over windows keeps one slow window (a pause, a prefill next door)
from pricing a depth out. A depth the choice passes over is run again once it
has not run for K / ``explore_share`` windows of this batch size, so a time
measured at a bad moment does not stay for good.
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


@dataclass(slots=True)
class StepWindow:
    """Consecutive steps run at one depth."""

    depth: int
    to_plan: int
    """Steps still to be scheduled in it."""
    bucket: int = 0
    """The batch-size bucket it was chosen for; only its steps at that bucket are timed."""
    finished: int = 0
    seconds: float = 0.0
    """Summed time of its timed steps."""
    timed: int = 0
    closed: bool = False


@dataclass(slots=True)
class BucketTimes:
    """Step times at one bucket of batch sizes: the mean step time of each depth's last windows,
    and when each depth last got a window."""

    samples: list[deque[float]]
    last_window: list[int]
    windows: int = 0
    """Windows chosen at this bucket so far."""

    @classmethod
    def empty(cls, max_depth: int, memory: int) -> BucketTimes:
        return cls([deque(maxlen=memory) for _ in range(max_depth + 1)], [0] * (max_depth + 1))

    def estimates(self) -> list[float | None]:
        """Median step seconds per depth (None: not timed yet)."""
        return [statistics.median(times) if times else None for times in self.samples]


@dataclass(slots=True)
class StepDepthChooser:
    max_depth: int
    rng: random.Random
    window_steps: int = 8
    """Steps per depth decision. A step is timed from the update before it to its own (under
    async scheduling a step is scheduled while the one before it runs, so only consecutive
    updates time it); a window's first step is not timed, since the step before it ran at
    another depth."""
    memory: int = 8
    """Window means kept per depth and bucket; their median is the depth's step time."""
    min_timed: int = 3
    """A window with fewer timed steps (prefills, a batch that changed bucket) is not kept."""
    times: dict[int, BucketTimes] = field(default_factory=dict)
    """Bucket of batch sizes -> its step times."""
    current: StepWindow | None = None
    timing: StepWindow | None = None
    """The window whose steps are finishing now (under async scheduling, the one before ``current``)."""

    def choose(
        self, batch: int, gains: Sequence[Sequence[float]], caps: Sequence[int], explore_share: float
    ) -> StepWindow:
        """The window this step runs in; ``gains[i][d]``: request i's expected accepted drafts at depth d."""
        window = self.current
        if window is not None and window.to_plan > 0:
            window.to_plan -= 1
            return window
        bucket = bucket_of(batch)
        table = self.bucket(bucket)
        table.windows += 1
        estimates = table.estimates()
        untimed = [d for d, t in enumerate(estimates) if t is None]
        stalest = min(range(self.max_depth + 1), key=lambda d: table.last_window[d])
        if untimed:
            depth = self.rng.choice(untimed)
        elif explore_share > 0 and table.windows - table.last_window[stalest] > self.max_depth / explore_share:
            depth = stalest
        else:
            depth = max(range(self.max_depth + 1), key=lambda d: self.rate(d, estimates, gains, caps))
        table.last_window[depth] = table.windows
        self.current = StepWindow(depth, self.window_steps - 1, bucket)
        return self.current

    @staticmethod
    def rate(depth: int, table: Sequence[float | None], gains: Sequence[Sequence[float]], caps: Sequence[int]) -> float:
        seconds = table[depth]
        assert seconds is not None
        tokens = sum(1 + g[min(cap, depth)] for g, cap in zip(gains, caps, strict=True))
        return tokens / seconds if seconds > 0 else math.inf

    def step_finished(self, window: StepWindow, batch: int, previous_update: float, now: float) -> None:
        """A decode step of the window finished at ``now``; the update before it came at ``previous_update``."""
        if window is not self.timing:
            self.close(self.timing)
            self.timing = window
        window.finished += 1
        if window.finished > 1 and previous_update > 0 and bucket_of(batch) == window.bucket:
            window.seconds += now - previous_update
            window.timed += 1
        if window.finished >= self.window_steps:
            self.close(window)

    def close(self, window: StepWindow | None) -> None:
        """Keep a finished window's mean step time (once)."""
        if window is None or window.closed:
            return
        window.closed = True
        if window.timed >= self.min_timed:
            self.observe(window.bucket, window.depth, window.seconds / window.timed)

    def bucket(self, bucket: int) -> BucketTimes:
        table = self.times.get(bucket)
        if table is None:
            table = self.times[bucket] = BucketTimes.empty(self.max_depth, self.memory)
        return table

    def observe(self, bucket: int, depth: int, seconds: float) -> None:
        self.bucket(bucket).samples[depth].append(seconds)

    def snapshot(self) -> dict[str, Any]:
        return {
            str(bucket): [None if t is None else round(t * 1e3, 3) for t in table.estimates()]
            for bucket, table in sorted(self.times.items())
        }
