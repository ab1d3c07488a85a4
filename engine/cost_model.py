"""Online step-cost model: what one more verified draft costs, per batch size.

Pure logic (no vLLM imports); the engine hook feeds it every decode step.

Model: ``step_s = base_s(B) + per_draft_s(B) * drafts`` for a step of B
requests verifying ``drafts`` draft tokens in all (B + drafts tokens).

Naturally occurring steps are confounded: a step verifies few drafts
*because* the drafter found nothing, and finding nothing may itself cost
(ngram searched the whole context) or a long accepted run may come with a
cheap context. A plain regression of time on drafts would learn those
accidents. So the slope is estimated only from controlled variation: on a
small random share of steps the controller moves every adaptive request's
depth at random, and the slope is the instrumental-variable (Wald) estimate
``cov(time, Z) / cov(drafts, Z)`` over those steps, where Z, the sum of the
random draws' deviations from their means, is uncorrelated with everything
else in the step. The base is the
mean of ``time - slope * drafts`` over all steps. Everything is exponentially
weighted, so the model follows load and forgets old steps.

The slope comes with its standard error (the usual IV error from the same
moments), which the controller uses to decide how much to keep exploring.

Random steps are few where steps are long and batches large (a benchmark
cell at 16 requests is about 60 steps), so the IV slope is combined, by
precision, with a prior that natural variation gives for free: the slope of
step time over *batch size* on steps that verified no draft. A token of one
more request costs, to first order, what a draft token of a request costs
(the same layers, one more row; on the user's machine one more set of
experts read), and batch size moves with arrivals and finishes, not with
what the drafter found. Its error is the regression's plus half the slope
itself (``prior_mismatch``: attention and drafting differ between the two),
so a well-determined IV slope outweighs it.

Batch sizes are bucketed by powers of two (1, 2, 3-4, 5-8, ...); a bucket
without enough random steps borrows the slope of the nearest bucket that has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


@dataclass(frozen=True, slots=True)
class CostEstimate:
    base_s: float
    """Step time with no drafts verified."""
    per_draft_s: float
    """Marginal time of one more verified draft token (>= 0)."""
    samples: float
    """Weight of the random steps behind the slope (0: no slope learned yet)."""
    per_draft_se_s: float = math.inf
    """Standard error of ``per_draft_s``; inf when this bucket has no slope of its own
    from random steps (a prior or a borrowed slope only)."""


def bucket_of(batch: int) -> int:
    """0 for 1 request, 1 for 2, 2 for 3-4, 3 for 5-8, ..."""
    return max(batch - 1, 0).bit_length()


@dataclass(slots=True)
class _Moments:
    """Exponentially weighted sums of 1 and of the products of t, d, z."""

    w: float = 0.0
    t: float = 0.0
    d: float = 0.0
    z: float = 0.0
    tz: float = 0.0
    dz: float = 0.0
    zz: float = 0.0
    tt: float = 0.0
    td: float = 0.0
    dd: float = 0.0

    def add(self, keep: float, t: float, d: float, z: float) -> None:
        self.w = self.w * keep + 1.0
        self.t = self.t * keep + t
        self.d = self.d * keep + d
        self.z = self.z * keep + z
        self.tz = self.tz * keep + t * z
        self.dz = self.dz * keep + d * z
        self.zz = self.zz * keep + z * z
        self.tt = self.tt * keep + t * t
        self.td = self.td * keep + t * d
        self.dd = self.dd * keep + d * d

    def merged(self, other: _Moments) -> _Moments:
        return _Moments(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(_Moments)))

    def ols(self, min_var: float) -> tuple[float, float] | None:
        """Least-squares slope of t on d and its standard error, or None when d barely varied."""
        if self.w <= 2:
            return None
        w = self.w
        mt, md = self.t / w, self.d / w
        var_d = self.dd / w - md * md
        if var_d < min_var:
            return None
        slope = (self.td / w - mt * md) / var_d
        var_u = max(self.tt / w - mt * mt - slope * slope * var_d, 0.0)
        return slope, math.sqrt(var_u / (w * var_d))

    def slope(self, min_cov: float) -> tuple[float, float] | None:
        """Wald estimate cov(t, z) / cov(d, z) and its standard error, or None when z barely moved d.

        The error is the IV one: sqrt(var(u) var(z) / (n cov(d, z)^2)), u the
        residual t - b d, n the (decayed) number of random steps."""
        if self.w <= 1:
            return None
        w = self.w
        mt, md, mz = self.t / w, self.d / w, self.z / w
        cov_dz = self.dz / w - md * mz
        if cov_dz < min_cov:
            return None
        slope = (self.tz / w - mt * mz) / cov_dz
        var_t, var_d, cov_td = self.tt / w - mt * mt, self.dd / w - md * md, self.td / w - mt * md
        var_u = max(var_t - 2 * slope * cov_td + slope * slope * var_d, 0.0)
        var_z = max(self.zz / w - mz * mz, 0.0)
        return slope, math.sqrt(var_u * var_z / (w * cov_dz * cov_dz))


@dataclass(slots=True)
class _Bucket:
    all_steps: _Moments = field(default_factory=_Moments)
    random_steps: _Moments = field(default_factory=_Moments)
    plain_steps: _Moments = field(default_factory=_Moments)
    """Steps that verified no draft, with d = the batch size: the prior's regression."""


@dataclass(slots=True)
class StepCostModel:
    keep_all: float = 0.99
    """Decay per decode step of the base (about the last 100 steps)."""
    keep_random: float = 0.98
    """Decay per random step of the slope (about the last 50 random steps)."""
    min_random: float = 12.0
    """Random-step weight a bucket needs before its slope is trusted."""
    min_cov: float = 0.02
    prior_mismatch: float = 0.5
    """The batch-size prior's error beyond its regression's, as a share of it."""
    min_batch_var: float = 0.1
    buckets: dict[int, _Bucket] = field(default_factory=dict)

    def observe(self, batch: int, drafts: int, seconds: float, instrument: float | None) -> None:
        """A decode step; ``instrument`` is Z on a random step, else None."""
        bucket = self.buckets.setdefault(bucket_of(batch), _Bucket())
        bucket.all_steps.add(self.keep_all, seconds, drafts, 0.0)
        if drafts == 0:
            bucket.plain_steps.add(self.keep_all, seconds, batch, 0.0)
        if instrument is not None:
            bucket.random_steps.add(self.keep_random, seconds, drafts, instrument)

    def _slope(self, index: int) -> tuple[float, float, float] | None:
        """(slope, its standard error, random-step weight) of a bucket with enough random steps."""
        bucket = self.buckets.get(index)
        if bucket is None or bucket.random_steps.w < self.min_random:
            return None
        found = bucket.random_steps.slope(self.min_cov)
        return None if found is None else (max(found[0], 0.0), found[1], bucket.random_steps.w)

    def prior(self, index: int) -> tuple[float, float] | None:
        """The batch-size slope around this bucket (it and its neighbours) and its error."""
        pooled = _Moments()
        for near in (index - 1, index, index + 1):
            if near in self.buckets:
                pooled = pooled.merged(self.buckets[near].plain_steps)
        found = pooled.ols(self.min_batch_var)
        if found is None:
            return None
        slope, se = max(found[0], 0.0), found[1]
        return slope, math.hypot(se, self.prior_mismatch * slope)

    def estimate(self, batch: int) -> CostEstimate | None:
        """The cost at this batch size; None until any step of a near size was seen."""
        index = bucket_of(batch)
        learned = sorted(self.buckets, key=lambda b: (abs(b - index), b))
        if not learned:
            return None
        own, prior = self._slope(index), self.prior(index)
        if own is not None and prior is not None and prior[1] > 0 and own[1] > 0:
            weights = (own[1] ** -2, prior[1] ** -2)
            per_draft = (own[0] * weights[0] + prior[0] * weights[1]) / sum(weights)
            se, samples = sum(weights) ** -0.5, own[2]
        elif own is not None:
            per_draft, se, samples = own
        elif prior is not None:
            per_draft, se, samples = prior[0], math.inf, 0.0
        else:
            found = next((s for s in map(self._slope, learned) if s is not None), None)
            per_draft, samples = (found[0], found[2]) if found is not None else (0.0, 0.0)
            se = math.inf
        moments = self.buckets[learned[0]].all_steps
        base = (moments.t - per_draft * moments.d) / moments.w
        return CostEstimate(max(base, 1e-6), max(per_draft, 0.0), samples, se)

    def snapshot(self) -> dict[str, dict[str, float | None]]:
        """Per bucket (named by its largest batch size): base and per-draft ms, random-step weight."""
        out = {}
        for index in sorted(self.buckets):
            est = self.estimate(2**index)
            if est is not None:
                se = est.per_draft_se_s
                out[str(2**index)] = {
                    "base_ms": round(est.base_s * 1e3, 3),
                    "per_draft_ms": round(est.per_draft_s * 1e3, 3),
                    "per_draft_se_ms": round(se * 1e3, 3) if math.isfinite(se) else None,
                    "random_steps": round(est.samples, 1),
                }
        return out
