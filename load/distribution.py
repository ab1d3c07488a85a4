"""Two-sample comparison of sampled outputs: total-variation distance with a permutation p-value.

Used by the sampling-fidelity tests: outputs (any hashable: a token tuple) sampled under one
depth policy against those under another. No distributional assumption (no chi-square tables,
no scipy): the null distribution of the TV distance comes from relabelling the pooled samples.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def _codes(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    index: dict[Hashable, int] = {}
    codes = np.fromiter((index.setdefault(x, len(index)) for x in [*a, *b]), dtype=np.int64, count=len(a) + len(b))
    return codes, len(index)


def _tv(codes: np.ndarray, n_a: int, k: int) -> float:
    a = np.bincount(codes[:n_a], minlength=k) / n_a
    b = np.bincount(codes[n_a:], minlength=k) / (len(codes) - n_a)
    return float(0.5 * np.abs(a - b).sum())


def tv_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Total-variation distance between the empirical distributions of ``a`` and ``b``."""
    codes, k = _codes(a, b)
    return _tv(codes, len(a), k)


def permutation_p_value(a: Sequence[Hashable], b: Sequence[Hashable], rounds: int = 2000, seed: int = 0) -> float:
    """P(TV of a random relabelling >= the observed TV): small when ``a`` and ``b`` differ."""
    codes, k = _codes(a, b)
    observed = _tv(codes, len(a), k)
    rng = np.random.default_rng(seed)
    at_least = sum(_tv(rng.permutation(codes), len(a), k) >= observed - 1e-12 for _ in range(rounds))
    return (at_least + 1) / (rounds + 1)
