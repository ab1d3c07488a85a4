"""Step times per depth from windows of steps: what the step chooser (engine/step_depth.py) decides on.

A window is consecutive steps at one depth; its time is its mean step time. Depths are compared
only through neighbouring windows (``BucketTimes``): the machine's speed drifts more than depths
differ, and cancels in the ratio of two windows run one after the other (docs/design.md).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
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
    started: float = 0.0
    """When its first finished step began (the update before it), 0 until known."""
    ended: float = 0.0
    """When its last finished step ended."""
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
    """Step times at one bucket of batch sizes, from pairs of neighbouring windows.

    ``pairs[(a, b)]``: log(time of a window at depth b / time of the window at depth a right
    before it), the last ``memory`` of them. Depth b's time relative to depth a is the median
    of the (a, b) pairs, less the median of the (b, a) pairs, halved, when both exist: a switch's
    extra cost is in both directions' second window and cancels, and so does a steady trend;
    with one direction only, the switch's cost is counted against the depth switched to."""

    pairs: dict[tuple[int, int], deque[float]]
    recent: deque[tuple[int, float]]
    """(depth, log mean step seconds) of the last windows kept: the level."""
    last_window: list[int]
    """When (in windows of this bucket) each depth last got a window."""
    memory: int
    windows: int = 0
    """Windows chosen at this bucket so far."""

    @classmethod
    def empty(cls, max_depth: int, memory: int) -> BucketTimes:
        return cls({}, deque(maxlen=memory), [0] * (max_depth + 1), memory)

    def add(self, depth: int, seconds: float, adjacent: bool) -> None:
        """A window's mean step time; ``adjacent``: it ran right after the last window kept here
        (which then makes a pair with it, when at another depth)."""
        log_s = math.log(seconds)
        if adjacent and self.recent and self.recent[-1][0] != depth:
            before, before_log_s = self.recent[-1]
            pairs = self.pairs.get((before, depth))
            if pairs is None:
                pairs = self.pairs[(before, depth)] = deque(maxlen=self.memory)
            pairs.append(log_s - before_log_s)
        self.recent.append((depth, log_s))

    def links(self) -> dict[tuple[int, int], tuple[float, int]]:
        """(a, b) with a < b -> (log time of b over a, samples), from the pairs both ways."""
        out: dict[tuple[int, int], tuple[float, int]] = {}
        for a, b in {(min(k), max(k)) for k in self.pairs}:
            there, back = self.pairs.get((a, b)), self.pairs.get((b, a))
            if there and back:
                out[(a, b)] = ((statistics.median(there) - statistics.median(back)) / 2, len(there) + len(back))
            elif there:
                out[(a, b)] = (statistics.median(there), len(there))
            elif back:
                out[(a, b)] = (-statistics.median(back), len(back))
        return out

    def relative(self) -> dict[int, float]:
        """Log step time of each depth the pairs link to the last window's depth, over that depth's:
        a least-squares fit to the links, by Gauss-Seidel sweeps from a spanning tree."""
        if not self.recent:
            return {}
        neighbours: dict[int, list[tuple[int, float, int]]] = {}
        for (a, b), (ratio, n) in self.links().items():
            neighbours.setdefault(a, []).append((b, ratio, n))
            neighbours.setdefault(b, []).append((a, -ratio, n))
        anchor = self.recent[-1][0]
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

    def estimates(self) -> list[float | None]:
        """Step seconds per depth (None: not linked to the last window's depth yet): the relative
        times at the level of the last windows (the median of their times over their depths')."""
        theta = self.relative()
        levels = [log_s - theta[d] for d, log_s in self.recent if d in theta]
        level = statistics.median(levels) if levels else 0.0
        return [math.exp(level + theta[d]) if d in theta else None for d in range(len(self.last_window))]

    def switch_share(self) -> float | None:
        """What a switch adds to a window's time, as a share (median over depth pairs run both
        ways; None until one is)."""
        both = [
            (statistics.median(there) + statistics.median(back)) / 2
            for (a, b), there in self.pairs.items()
            if a < b and (back := self.pairs.get((b, a)))
        ]
        return math.exp(statistics.median(both)) - 1 if both else None
