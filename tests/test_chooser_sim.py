"""load/chooser_sim.py: the step chooser replayed against a GPU run's measured window scatter (pure logic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load.chooser_sim import Noise, Scenario, compare, run, scenarios_from_cells

SESSION7 = Path(__file__).resolve().parent.parent / "load/results/gpu-h200-vllm0.26-session7/bench-selfdraft-async"


def test_noise_is_each_windows_ratio_to_its_depths_median_and_their_lag1_correlation() -> None:
    rows = [[4, 1, False, 8, ms, ms] for ms in (10, 12, 10, 12, 10, 12)] + [[4, 1, True, 8, 13, 13]]
    noise = Noise.from_windows(rows)
    assert noise.steady == pytest.approx(sorted([10 / 11, 12 / 11] * 3))
    assert noise.switched == pytest.approx(13 / 11)
    assert noise.lag1 == 0.0, "alternating windows anti-correlate: no carry"
    with pytest.raises(ValueError):
        Noise.from_windows(rows[:3])


def test_without_noise_the_chooser_finds_the_best_depth() -> None:
    scenario = Scenario("flat", 16, (14.0, 15.0, 19.0, 25.0), (1.0, 1.2, 1.3, 1.34))
    quiet = Noise((1.0,), 1.0, 0.0)
    best = max(range(4), key=lambda d: run(scenario, quiet, 2000, 0, d))
    assert best == 1
    assert compare(scenario, quiet, 5000, 3)["median"] > 0.98


def test_the_session7_scatter_costs_the_chooser_little_against_the_best_static_depth() -> None:
    noise = Noise.from_windows(json.loads((SESSION7 / "controller.json").read_text())["step_depth_windows"])
    assert 0.8 < noise.steady[len(noise.steady) // 10] < 0.9 and noise.lag1 > 0.5, "the measured scatter"
    (scenario,) = scenarios_from_cells(SESSION7 / "cells.csv", [16])
    assert compare(scenario, noise, 5000, 10)["median"] > 0.95


def test_the_sweeps_rules_differ_where_they_say() -> None:
    """load/chooser_sweep.py: ``constant`` waits K / explore_share windows whatever the bucket's age,
    ``thin`` re-runs a far depth priced by fewer than 4 pairs as soon as a close one, ``impatient``
    re-runs a far one after 2x the wait, not 6x."""
    import random

    from engine.step_depth import StepDepthChooser
    from load.chooser_sweep import RULES

    close, far = [1.0, 0.97, 0.5, 0.5], [1.0, 0.5, 0.5, 0.5]

    def due(rule: str, windows: int, last: int, rates: list[float], pairs: int = 0) -> bool:
        chooser: StepDepthChooser = RULES[rule](3, random.Random(0))
        table = chooser.bucket(4)
        table.windows, table.last_window = windows, [windows, last, windows, windows]
        for _ in range(pairs):
            table.add(0, 0.01, adjacent=True)
            table.add(1, 0.01, adjacent=True)
        return chooser.stale(table, rates, 0.05) == 1

    assert due("shipped", 40, 19, close) and not due("constant", 40, 19, close)
    assert due("constant", 100, 39, close), "60 windows"
    assert due("thin", 40, 9, far) and not due("shipped", 40, 9, far)
    assert not due("thin", 40, 9, far, pairs=3), "5 pairs price it: its patience is its gap's"
    assert due("impatient", 300, 100, far) and not due("shipped", 300, 100, far), "2 x 60 windows, not 6 x"
