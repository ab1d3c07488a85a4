"""load/oracle_bound.py on cells written by hand: the bound is each phase's best rate, token-weighted."""

from __future__ import annotations

import json

import pytest

from load.oracle_bound import bound


def cell(policy: str, ms: float, phases: dict[str, dict[str, object]] | None = None) -> dict[str, str]:
    return {"policy": policy, "ms_per_engine_step": str(ms), "kinds": "{}", "phases": json.dumps(phases or {})}


def counters(tokens: int, accepted: list[int], steps: int) -> dict[str, object]:
    return {
        "tokens": tokens,
        "num_drafts": steps,
        "num_accepted_tokens_per_pos": accepted,
        "steps_by_drafted": [0, 0, steps],
    }


def test_each_phase_takes_its_best_depth_and_the_bound_weighs_them_by_tokens() -> None:
    # Steps of 9 / 10 / 12 ms at depth 0 / 1 / 2. Reasoning accepts 0.2 / 0.1 by position: depth 1
    # (1.2 tokens a step, 0.120 a ms) beats depth 0 (0.111) and 2 (1.3 / 12 = 0.108). The answer
    # accepts 0.9 / 0.8: depth 2 (2.7 / 12 = 0.225) beats depth 1 (0.190).
    rows = [
        cell("none", 9.0),
        cell("fixed-1", 10.0),
        cell("fixed-2", 12.0, {"reasoning": counters(300, [20, 10], 100), "answer": counters(100, [90, 80], 100)}),
    ]
    ratio, lines = bound(rows, max_depth=2, against=1)
    assert "reasoning" in lines[1] and "best depth 1," in lines[1]
    assert "answer" in lines[0] and "best depth 2," in lines[0]
    # Time at depth 1: 300 / 0.120 + 100 / 0.190 ms; at the best the answer's is 100 / 0.225.
    at_fixed = 300 / 0.12 + 100 / 0.19
    assert ratio == pytest.approx(at_fixed / (300 / 0.12 + 100 / 0.225))
    assert ratio > 1.0
