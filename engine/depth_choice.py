"""The per-request depth choice: the depths that maximise a batch's expected tokens per second.

For a batch of requests with per-position acceptance ``c`` and
proposal rates ``p`` (engine/acceptance.py) and a step cost
``base + per_draft * drafts`` (engine/cost_model.py), choose depths d_i that
maximise the batch's expected tokens per second,

    sum_i (1 + sum_{j<=d_i} c_ij) / (base + per_draft * sum_i sum_{j<=d_i} p_ij).

A ratio objective: Dinkelbach's method solves it exactly by iterating
"given the current rate L, each request independently maximises
E_i(d) - L * per_draft * V_i(d)", i.e. goes one draft deeper while the
expected accepted token there is worth more than its time at the batch's
rate. Each iteration raises L; it stops in a few rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.cost_model import CostEstimate


@dataclass(frozen=True, slots=True)
class Candidate:
    accepted: Sequence[float]
    """c[j]: drafts 1..j all accepted, j = 1..K."""
    proposed: Sequence[float]
    """p[j]: at least j drafts proposed."""
    low: int
    high: int
    """Depths allowed: low..high (a fixed-depth request has low == high)."""


def cumulative(values: Sequence[float]) -> list[float]:
    """[0, v1, v1+v2, ...]: the prefix sums, so E(d) and V(d) are one lookup."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def expected_rate(candidates: Sequence[Candidate], depths: Sequence[int], cost: CostEstimate | None) -> float:
    """Expected tokens per second of the batch at these depths (per step if no cost is known)."""
    return _rate(
        [cumulative(c.accepted) for c in candidates], [cumulative(c.proposed) for c in candidates], depths, cost
    )


def _rate(
    gains: list[list[float]], drafts: list[list[float]], depths: Sequence[int], cost: CostEstimate | None
) -> float:
    base = cost.base_s if cost is not None else 1.0
    per_draft = cost.per_draft_s if cost is not None else 0.0
    tokens = len(depths) + sum(g[d] for g, d in zip(gains, depths, strict=True))
    return tokens / (base + per_draft * sum(v[d] for v, d in zip(drafts, depths, strict=True)))


def best_depths(candidates: Sequence[Candidate], cost: CostEstimate | None) -> tuple[list[int], float]:
    """Depths maximising expected tokens per second, and that rate."""
    per_draft = cost.per_draft_s if cost is not None else 0.0
    gains = [cumulative(c.accepted) for c in candidates]
    drafts = [cumulative(c.proposed) for c in candidates]
    rate, best = 0.0, [c.high for c in candidates]
    for _ in range(16):
        price = rate * per_draft
        depths = []
        for c, g, v in zip(candidates, gains, drafts, strict=True):
            # argmax over low..high of E(d) - price * V(d); the shallowest on ties.
            pick, top = c.low, g[c.low] - price * v[c.low]
            for d in range(c.low + 1, c.high + 1):
                value = g[d] - price * v[d]
                if value > top + 1e-12:
                    pick, top = d, value
            depths.append(pick)
        new_rate = _rate(gains, drafts, depths, cost)
        if new_rate <= rate * (1 + 1e-9):
            break  # the previous depths were optimal
        rate, best = new_rate, depths
    return best, rate


def settle(
    candidates: Sequence[Candidate],
    chosen: Sequence[int],
    previous: Sequence[int | None],
    rate: float,
    cost: CostEstimate | None,
    margin: float,
) -> list[int]:
    """Hysteresis per request: keep a request's previous depth unless the chosen one
    is worth ``margin`` more of its own expected tokens at the batch's price of a
    draft (``rate * per_draft``, the Dinkelbach price at the optimum).

    Per request, not per batch: one request's change moves a batch of 16 by well
    under 1%, so a batch-level margin would freeze every depth once set."""
    price = rate * (cost.per_draft_s if cost is not None else 0.0)
    settled = []
    for c, depth, last in zip(candidates, chosen, previous, strict=True):
        if last is None or last == depth:
            settled.append(depth)
            continue
        gains, drafts = cumulative(c.accepted), cumulative(c.proposed)
        worth = (gains[depth] - price * drafts[depth]) - (gains[last] - price * drafts[last])
        settled.append(depth if worth > margin * (1 + gains[depth]) else last)
    return settled
