"""Step times per depth from windows of steps: what the step chooser (engine/step_depth.py) decides on.

A window is consecutive steps at one depth; its time is its mean step time. Depths are compared
only through neighbouring windows (``BucketTimes``): the machine's speed drifts more than depths
differ, and cancels in the ratio of two windows run one after the other (docs/design.md).

A step's time also grows with the drafts it verifies (the target's forward runs over them), which
the depth does not fix: a request held at its thinking budget verifies none at any depth. So each
window also records its verified drafts per request (its share), and the pairs give the log step
time's slope in it besides the depths' own times.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


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
    drafts: int = 0
    """Drafts its planned steps verify, summed over their requests (its depth's, the static ones')."""
    slots: int = 0
    """Requests in its planned steps, summed."""
    started: float = 0.0
    """When its first finished step began (the update before it), 0 until known."""
    ended: float = 0.0
    """When its last finished step ended."""
    closed: bool = False

    def share(self) -> float:
        """Drafts verified per request a planned step (its depth where nothing was planned)."""
        return self.drafts / self.slots if self.slots else float(self.depth)

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
    """Step times at one bucket of batch sizes, from pairs of neighbouring windows.

    ``pairs[(a, b)]``: (log(time of a window at depth b / time of the window at depth a right
    before it), its share less the other's), the last ``memory`` of them; (d, d) pairs too.
    The log time's slope in the share (drafts verified per request) is a least-squares fit to
    every pair's, each kind of pair about its own means (which is how a depth's own time drops
    out). Depth b's time relative to depth a at equal shares is the median of the (a, b) pairs
    less the slope's part, less the same of the (b, a) pairs, halved, when both exist: a switch's
    extra cost is in both directions' second window and cancels, and so does a steady trend;
    with one direction only, the switch's cost is counted against the depth switched to."""

    pairs: dict[tuple[int, int], deque[tuple[float, float]]]
    recent: deque[tuple[int, float, float]]
    """(depth, log mean step seconds, share) of the last windows kept: the level."""
    last_window: list[int]
    """When (in windows of this bucket) each depth last got a window."""
    memory: int
    windows: int = 0
    """Windows chosen at this bucket so far."""
    by_share: bool = True
    """Fit the slope in the share (False: 0, every depth's time whatever the batch verifies)."""
    min_spread: float = 0.25
    """The slope is fitted only once the shares' squared spread about their kinds' means sums to
    this (before: 0): with one share per depth (no request held, none capped) it cannot be told
    from the depths' own times."""
    one_pass: bool = False
    """Depth 0 is timed as depth 1 at its share (``passes``): vLLM drafts at least one draft a step
    (engine/hook.py ``DraftPasses``), so a depth-0 step runs the drafter's one pass as a depth-1 step
    does, and the two differ only in the drafts the target verifies. False: each depth its own time."""

    @classmethod
    def empty(cls, max_depth: int, memory: int, by_share: bool = True, one_pass: bool = False) -> BucketTimes:
        return cls({}, deque(maxlen=memory), [0] * (max_depth + 1), memory, by_share=by_share, one_pass=one_pass)

    def passes(self, depth: int) -> int:
        """The time class a depth is fitted in: its drafter passes with ``one_pass`` (0 and 1 alike,
        with the share's slope between them), else the depth itself. Pairs are kept by depth and
        read by class, so the setting can change while the times are kept."""
        return max(1, depth) if self.one_pass and self.by_share else depth

    def classed(self) -> Mapping[tuple[int, int], Sequence[tuple[float, float]]]:
        """The pairs by (class, class) (``passes``): the pairs themselves where each depth is its own."""
        if self.passes(0) == 0:
            return self.pairs
        out: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for (a, b), samples in self.pairs.items():
            out.setdefault((self.passes(a), self.passes(b)), []).extend(samples)
        return out

    def add(self, depth: int, seconds: float, adjacent: bool, share: float | None = None) -> None:
        """A window's mean step time and share (None: its depth); ``adjacent``: it ran right after
        the last window kept here (which then makes a pair with it)."""
        log_s, share = math.log(seconds), float(depth) if share is None else share
        if adjacent and self.recent:
            before, before_log_s, before_share = self.recent[-1]
            pairs = self.pairs.get((before, depth))
            if pairs is None:
                pairs = self.pairs[(before, depth)] = deque(maxlen=self.memory)
            pairs.append((log_s - before_log_s, share - before_share))
        self.recent.append((depth, log_s, share))

    def slope(self) -> float:
        """d log(step seconds) / d share: least squares over every kind of pair about its own means
        (none negative: verifying more is not faster)."""
        if not self.by_share:
            return 0.0
        sxy = sxx = 0.0
        for samples in self.classed().values():
            if len(samples) < 2:
                continue
            mean_r = statistics.fmean(r for r, _ in samples)
            mean_s = statistics.fmean(s for _, s in samples)
            sxy += sum((r - mean_r) * (s - mean_s) for r, s in samples)
            sxx += sum((s - mean_s) ** 2 for _, s in samples)
        return max(0.0, sxy / sxx) if sxx >= self.min_spread else 0.0

    def links(self, slope: float | None = None) -> dict[tuple[int, int], tuple[float, int]]:
        """(a, b) with a < b -> (log time of b over a at equal shares, samples), from the pairs both
        ways, with ``slope`` (None: the fitted one)."""
        out: dict[tuple[int, int], tuple[float, int]] = {}
        slope = self.slope() if slope is None else slope
        pairs = self.classed()

        def median(key: tuple[int, int]) -> float | None:
            samples = pairs.get(key)
            return statistics.median(r - slope * s for r, s in samples) if samples else None

        for a, b in {(min(k), max(k)) for k in pairs if k[0] != k[1]}:
            there, back = median((a, b)), median((b, a))
            n = len(pairs.get((a, b), ())) + len(pairs.get((b, a), ()))
            if there is not None and back is not None:
                out[(a, b)] = ((there - back) / 2, n)
            elif there is not None:
                out[(a, b)] = (there, n)
            elif back is not None:
                out[(a, b)] = (-back, n)
        return out

    def relative(self, slope: float) -> dict[int, float]:
        """Log step time of each class (``passes``) the pairs link to the last window's, over that
        class's, at equal shares: a least-squares fit to the links, by Gauss-Seidel sweeps from a
        spanning tree."""
        if not self.recent:
            return {}
        neighbours: dict[int, list[tuple[int, float, int]]] = {}
        for (a, b), (ratio, n) in self.links(slope).items():
            neighbours.setdefault(a, []).append((b, ratio, n))
            neighbours.setdefault(b, []).append((a, -ratio, n))
        anchor = self.passes(self.recent[-1][0])
        theta = {anchor: 0.0}
        order = [anchor]
        for d in order:  # breadth first: the spanning tree's first guess
            for other, ratio, _ in neighbours.get(d, []):
                if other not in theta:
                    theta[other] = theta[d] + ratio
                    order.append(other)
        links = sum(len(neighbours.get(d, [])) for d in order) // 2
        for _ in range(20 * len(order) if links >= len(order) else 0):  # a loop in the links: fit them all
            for d in order[1:]:
                near = neighbours[d]
                theta[d] = sum(n * (theta[o] - ratio) for o, ratio, n in near) / sum(n for _, _, n in near)
        return theta

    def estimates(self, shares: Sequence[float] | None = None) -> list[float | None]:
        """Step seconds per depth at ``shares[d]`` drafts verified per request (None: d), None where
        the depth is not linked to the last window's depth yet: the relative times at the level of
        the last windows (the median of their times over their depths' at their shares)."""
        slope = self.slope()
        theta = self.relative(slope)
        levels = [
            log_s - theta[self.passes(d)] - slope * share for d, log_s, share in self.recent if self.passes(d) in theta
        ]
        level = statistics.median(levels) if levels else 0.0
        depths = range(len(self.last_window))
        at = depths if shares is None else shares
        return [
            math.exp(level + theta[self.passes(d)] + slope * at[d]) if self.passes(d) in theta else None for d in depths
        ]

    def switch_share(self) -> float | None:
        """What a switch adds to a window's time, as a share (median over depth pairs run both
        ways; None until one is)."""
        slope = self.slope()
        pairs = self.classed()
        both = [
            (statistics.median(r - slope * s for r, s in there) + statistics.median(r - slope * s for r, s in back)) / 2
            for (a, b), there in pairs.items()
            if a < b and (back := pairs.get((b, a)))
        ]
        return math.exp(statistics.median(both)) - 1 if both else None
