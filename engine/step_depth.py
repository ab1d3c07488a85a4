"""One depth for the whole step: the adaptive choice for drafters whose cost is per drafting pass.

A model drafter (vLLM's ``draft_model``, EAGLE, MTP, DSpark) runs one forward
pass per draft position for the whole batch: the step costs about
``base + passes x pass`` where ``passes`` is the batch's deepest depth
(``num_spec_tokens_to_schedule``), almost whatever the other requests verify.
Measured on an H200 (vLLM 0.26, self-draft, batch 16: docs/gpu.md): 21 ms with
no drafts, 30-35 ms as soon as a few requests verify one, 32 ms with all at
depth 3. A per-draft price cannot see that (one request's extra draft costs the
batch a whole pass, or nothing), so the per-request controller bought depth 3
everywhere and lost to a fixed depth 1 by 28% at concurrency 4.

This chooser runs windows of 8 steps at one depth D, learns the step time at
each D per batch-size bucket (an exponentially weighted mean of its decode
steps, prefills and other depths' steps left out) and picks the D with the
most expected tokens per second, every adaptive request verifying min(cap, D):

    rate(D) = sum_i (1 + E_i(min(cap_i, D))) / T(D)

E_i is the request's expected accepted drafts (the controller's estimates). A
depth not yet timed at this batch size is tried first; then a random D on
``explore_share`` of the steps keeps every T(D) and the acceptance beyond D current.
"""

from __future__ import annotations

import random
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
    finished: int = 0


@dataclass(slots=True)
class StepDepthChooser:
    max_depth: int
    rng: random.Random
    window_steps: int = 8
    """Steps per depth decision. A step is timed from the update before it to its own (under
    async scheduling a step is scheduled while the one before it runs, so only consecutive
    updates time it); a window's first step is not timed, since the step before it ran at
    another depth."""
    keep: float = 0.95
    """Weight of the past in each step-time mean (about 20 timed steps of memory)."""
    times: dict[int, list[float | None]] = field(default_factory=dict)
    """Bucket of batch sizes -> mean step seconds at depth 0..K (None: not timed yet)."""
    current: StepWindow | None = None

    def choose(
        self, batch: int, gains: Sequence[Sequence[float]], caps: Sequence[int], explore_share: float
    ) -> StepWindow:
        """The window this step runs in; ``gains[i][d]``: request i's expected accepted drafts at depth d."""
        window = self.current
        if window is not None and window.to_plan > 0:
            window.to_plan -= 1
            return window
        table = self.times.setdefault(bucket_of(batch), [None] * (self.max_depth + 1))
        untimed = [d for d, t in enumerate(table) if t is None]
        if untimed:
            depth = self.rng.choice(untimed)
        elif self.rng.random() < explore_share:
            depth = self.rng.randrange(self.max_depth + 1)
        else:
            depth = max(range(self.max_depth + 1), key=lambda d: self.rate(d, table, gains, caps))
        self.current = StepWindow(depth, self.window_steps - 1)
        return self.current

    @staticmethod
    def rate(depth: int, table: Sequence[float | None], gains: Sequence[Sequence[float]], caps: Sequence[int]) -> float:
        seconds = table[depth]
        assert seconds is not None
        tokens = sum(1 + g[min(cap, depth)] for g, cap in zip(gains, caps, strict=True))
        return tokens / seconds

    def step_finished(self, window: StepWindow, batch: int, previous_update: float, now: float) -> None:
        """A decode step of the window finished at ``now``; the update before it came at ``previous_update``."""
        window.finished += 1
        if window.finished > 1 and previous_update > 0:
            self.observe(bucket_of(batch), window.depth, now - previous_update)

    def observe(self, bucket: int, depth: int, seconds: float) -> None:
        table = self.times.setdefault(bucket, [None] * (self.max_depth + 1))
        old = table[depth]
        table[depth] = seconds if old is None else self.keep * old + (1 - self.keep) * seconds

    def snapshot(self) -> dict[str, Any]:
        return {
            str(bucket): [None if t is None else round(t * 1e3, 3) for t in table]
            for bucket, table in sorted(self.times.items())
        }
