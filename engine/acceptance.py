"""Acceptance by draft position, learned from verified drafts and shadow drafts.

Pure logic (no vLLM imports); the engine hook feeds it.

For a request at depth d the expected tokens of a verify step are
``1 + sum(c[j] for j <= d)``, where ``c[j]`` is the probability that drafts
1..j are *all* accepted (vLLM's per-position acceptance counts the same
event). The drafter may propose fewer than d drafts (ngram finds no match),
so the expected number of drafts verified is ``sum(p[j] for j <= d)``, with
``p[j]`` the probability that it proposed at least j.

**Shadow drafts.** The drafter proposes up to the batch's drafting count
whatever a request then verifies. A cut draft at position j would have been
accepted exactly when drafts 1..j equal the next j tokens the target produced:
for greedy targets by definition, and under random sampling with the same
probability (the target emits a deterministic draft token x with probability
p(x), which is its acceptance probability). So every proposal, verified or
cut, is matched against the tokens that follow it; for the positions the step
verified, the match length equals vLLM's own accepted count (the rejected
position's recovered token never equals the draft), which ``ShadowBook``
checks on every step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Resolved:
    """One proposal, matched against what the target produced."""

    observed: int
    """Positions 1..observed were open to the drafter (the drafting count in force)."""
    proposed: int
    """Drafts it proposed (<= observed)."""
    run: int
    """Leading drafts equal to the tokens that followed (<= proposed)."""
    verified: int
    """Drafts the step verified (the request's depth then)."""
    phase: str
    agrees: bool | None = None
    """min(run, verified) == vLLM's accepted count; None when nothing was verified."""


@dataclass(slots=True)
class PositionRates:
    """Exponentially weighted per-position estimates of c[j] and p[j] (j = 1..K).

    Each position keeps a weight (observations, decayed by ``keep`` per new
    one) and weighted sums of "accepted" and "proposed"; a prior counts as
    ``weight`` observations.
    """

    keep: float
    weight: list[float]
    accepted_sum: list[float]
    proposed_sum: list[float]

    @classmethod
    def prior(cls, accepted: Sequence[float], proposed: Sequence[float], weight: float, keep: float) -> PositionRates:
        return cls(
            keep=keep,
            weight=[weight] * len(accepted),
            accepted_sum=[weight * a for a in accepted],
            proposed_sum=[weight * p for p in proposed],
        )

    @property
    def max_depth(self) -> int:
        return len(self.weight)

    def accepted(self) -> list[float]:
        """c[j]: drafts 1..j all accepted (index j-1)."""
        return [a / w for a, w in zip(self.accepted_sum, self.weight, strict=True)]

    def proposed(self) -> list[float]:
        """p[j]: the drafter proposed at least j drafts (index j-1)."""
        return [p / w for p, w in zip(self.proposed_sum, self.weight, strict=True)]

    def observe(self, observed: int, proposed: int, run: int) -> None:
        keep = self.keep
        for j in range(min(observed, self.max_depth)):
            self.weight[j] = self.weight[j] * keep + 1.0
            self.accepted_sum[j] = self.accepted_sum[j] * keep + (1.0 if j < run else 0.0)
            self.proposed_sum[j] = self.proposed_sum[j] * keep + (1.0 if j < proposed else 0.0)

    def samples(self) -> list[float]:
        return list(self.weight)


Weights = tuple[float, float]
"""The phase estimate's worth in a request's own observations: (acceptance, proposals)."""


def shrink(prior_weight: float, prior: float, hits: float, seen: float) -> float:
    """A rate from ``hits`` in ``seen`` own observations and ``prior`` worth ``prior_weight`` of them."""
    return (prior_weight * prior + hits) / (prior_weight + seen)


def phase_estimate(phase: PositionRates) -> tuple[list[float], list[float]]:
    """(a, p): a[j] = P(drafts 1..j accepted | at least j proposed), p[j] = P(at least j proposed)."""
    accepted = [c / max(q, 1e-12) for c, q in zip(phase.accepted_sum, phase.proposed_sum, strict=True)]
    return accepted, phase.proposed()


@dataclass(slots=True)
class RequestRates:
    """One request's own history, shrunk towards its phase's live estimate.

    Two rates per position, each shrunk with its own weight: whether the drafter
    proposes (``(Mp * phase_p + own proposals) / (Mp + own observations)``) and
    whether a proposed draft is accepted (``(Ma * phase_a + own accepted) /
    (Ma + own proposals)``); c = a * p. Separate because they are different
    things: ngram finding a match depends strongly on the request's text, how
    often a match is right much less. The decision (engine/controller.py) goes
    deeper exactly while a[j] is worth the price of a draft, so a is what must
    not be overconfident. ``RequestWeights`` measures both weights.
    """

    phase: PositionRates
    own: PositionRates

    @classmethod
    def start(cls, phase: PositionRates, keep: float) -> RequestRates:
        k = phase.max_depth
        return cls(phase, PositionRates.prior([0.0] * k, [0.0] * k, 0.0, keep))

    def estimate(
        self, weights: Weights, phase: tuple[list[float], list[float]] | None = None
    ) -> tuple[list[float], list[float]]:
        """(c, p) at ``weights``; ``phase`` is ``phase_estimate`` when already computed (once per step)."""
        phase_a, phase_p = phase or phase_estimate(self.phase)
        own, (m_a, m_p) = self.own, weights
        c, p = [], []
        for e_a, e_p, hits, drafts, seen in zip(
            phase_a, phase_p, own.accepted_sum, own.proposed_sum, own.weight, strict=True
        ):
            p_j = shrink(m_p, e_p, drafts, seen)
            p.append(p_j)
            c.append(p_j * shrink(m_a, e_a, hits, drafts))
        return c, p


@dataclass(slots=True)
class WeightChooser:
    """Which worth of the phase estimate predicts a phase's requests best, measured.

    Before every observation is counted, each candidate weight's estimate of
    it is scored (squared error, exponentially forgotten). Requests that differ
    (one copies code, one reasons freely) favour a small weight; requests that
    are alike, or own histories too short or too correlated (a shadow draft
    overlaps the next one's positions) to say more than their phase, favour a
    large one. A fixed guess picked drafts that a request's lucky run promised
    and its next proposals did not keep.
    """

    weights: tuple[float, ...]
    default: float
    keep: float
    min_samples: float
    errors: list[float] = field(default_factory=list)
    samples: float = 0.0

    def __post_init__(self) -> None:
        self.errors = self.errors or [0.0] * len(self.weights)

    def score(self, observations: Sequence[tuple[float, float, float, bool]]) -> None:
        """Each observation: (phase rate, own hits, own weight, outcome), before it is counted."""
        if not observations:
            return
        errors = self.errors
        for i in range(len(errors)):
            errors[i] *= self.keep
        self.samples = self.samples * self.keep + 1.0
        # Scalars, no lists: this runs for several proposals every engine step.
        for rate, hits, weight, outcome in observations:
            if weight == 0.0:
                continue  # every weight predicts the phase's estimate: the same error for all
            for i, m in enumerate(self.weights):
                d = shrink(m, rate, hits, weight) - outcome
                errors[i] += d * d

    def best(self) -> float:
        if self.samples < self.min_samples or not self.weights:
            return self.default
        return self.weights[min(range(len(self.weights)), key=self.errors.__getitem__)]

    def as_dict(self) -> dict[str, Any]:
        mean = [round(e / self.samples, 4) if self.samples else None for e in self.errors]
        return {"weight": self.best(), "error_by_weight": dict(zip(map(str, self.weights), mean, strict=True))}


@dataclass(slots=True)
class RequestWeights:
    """A phase's two measured weights (acceptance given a proposal, proposals)."""

    accept: WeightChooser
    propose: WeightChooser

    def score(self, rates: RequestRates, observed: int, proposed: int, run: int) -> None:
        (phase_a, phase_p), own = phase_estimate(rates.phase), rates.own
        n = min(observed, own.max_depth)
        self.propose.score([(phase_p[j], own.proposed_sum[j], own.weight[j], j < proposed) for j in range(n)])
        self.accept.score(
            [(phase_a[j], own.accepted_sum[j], own.proposed_sum[j], j < run) for j in range(min(n, proposed))]
        )

    @classmethod
    def new(cls, weights: tuple[float, ...], default: float, keep: float, min_samples: float) -> RequestWeights:
        return cls(*(WeightChooser(weights, default, keep, min_samples) for _ in range(2)))

    def best(self) -> Weights:
        return self.accept.best(), self.propose.best()

    def as_dict(self) -> dict[str, Any]:
        return {"acceptance": self.accept.as_dict(), "proposals": self.propose.as_dict()}


@dataclass(slots=True)
class _Pending:
    start: int
    drafts: list[int]
    observed: int
    verified: int
    phase: str
    run: int = 0
    real_accepted: int | None = None


@dataclass(slots=True)
class ShadowBook:
    """One request's proposals waiting for the tokens that decide them."""

    pending: deque[_Pending] = field(default_factory=deque)

    def propose(self, start: int, drafts: Sequence[int], observed: int, verified: int, phase: str) -> None:
        """Drafts proposed for output positions ``start``, ``start+1``, ...; ``verified`` of them scheduled."""
        self.pending.append(_Pending(start, list(drafts), observed, min(verified, len(drafts)), phase))

    def verified(self, accepted: int) -> None:
        """vLLM's accepted count for the newest proposal's verify step."""
        if self.pending:
            self.pending[-1].real_accepted = accepted

    def feed(self, output: Sequence[int]) -> list[Resolved]:
        """Match pending proposals against the request's output so far; return those decided."""
        done: list[Resolved] = []
        still: deque[_Pending] = deque()
        have = len(output)
        for entry in self.pending:
            drafts, start = entry.drafts, entry.start
            while (
                entry.run < len(drafts) and start + entry.run < have and output[start + entry.run] == drafts[entry.run]
            ):
                entry.run += 1
            decided = entry.run == len(drafts) or start + entry.run < have
            if not decided:
                still.append(entry)
                continue
            agrees = None
            if entry.verified and entry.real_accepted is not None:
                agrees = min(entry.run, entry.verified) == entry.real_accepted
            done.append(Resolved(entry.observed, len(drafts), entry.run, entry.verified, entry.phase, agrees))
        self.pending = still
        return done
