"""SIMULATION, not an engine: phasespec's step chooser (engine/step_depth.py) against step times
drawn from a noise model measured on a GPU, beside every static depth on the same noise.

What the chooser must survive on a host like the H200 machines of the GPU sessions: window means
of one depth at one batch size scattered 0.84-1.35x their median (10th-90th percentile), with
single windows up to 2.4x, and a window that switches depth costing a little more than a steady
one. This replays that: every window of ``window_steps`` steps gets a host-speed factor drawn
(with a fixed seed, the same sequence for every policy) from the steady windows' ratios to their
median in a ``controller.json`` the GPU run wrote, and the first window after a switch is slower by
the median ratio of the switched windows. A step at depth d takes ``step_ms[d]`` x that factor and
yields ``batch x (1 + gain[d])`` tokens. The scenarios' step times and tokens per step are the
static cells of the same run (``cells.csv``: median ms per engine step and tokens per step by
policy).

What it can say: whether the chooser's rules (two windows per new depth, the stall rule, depths
compared through neighbouring windows, re-exploration) find the best depth under this noise, and what they
lose to it; with ``--held``, a share of every batch held at depth 0 (its thinking budget), which
the chooser counts, or, with ``--blind``, does not (as before it did). What it cannot: anything
about the engine (async timing, a held share that moves, phase mix, batch sizes that move); the
GPU benchmark (``load/bench_policies.py``) is the measurement.

    python -m load.chooser_sim load/results/gpu-h200-vllm0.26-session7/bench-selfdraft-async
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.step_depth import StepDepthChooser


@dataclass(frozen=True, slots=True)
class Noise:
    steady: tuple[float, ...]
    """Steady windows' mean step time over their (bucket, depth) median."""
    switched: float
    """Median of switched windows' mean over the steady median of their (bucket, depth)."""
    lag1: float
    """Correlation of consecutive windows' log ratios (the host's speed and the batch drift)."""

    def factors(self, seed: int) -> Iterator[float]:
        """Window factors with the measured marginal and lag-1 correlation: an AR(1) Gaussian
        mapped through the measured ratios' quantiles."""
        rng = random.Random(seed)
        normal = statistics.NormalDist()
        z = rng.gauss(0, 1)
        while True:
            u = normal.cdf(z)
            yield self.steady[min(int(u * len(self.steady)), len(self.steady) - 1)]
            z = self.lag1 * z + math.sqrt(1 - self.lag1**2) * rng.gauss(0, 1)

    @classmethod
    def from_windows(cls, windows: Sequence[Sequence[float]], min_windows: int = 6) -> Noise:
        """From ``step_depth_windows`` rows (bucket, depth, switched, steps, mean ms, slowest ms, ...):
        only (bucket, depth) pairs with ``min_windows`` steady windows, so that the median is one."""
        groups: dict[tuple[int, int], dict[bool, list[float]]] = {}
        for bucket, depth, after_switch, _, mean, *_ in windows:
            groups.setdefault((int(bucket), int(depth)), {True: [], False: []})[bool(after_switch)].append(mean)
        medians = {key: statistics.median(g[False]) for key, g in groups.items() if len(g[False]) >= min_windows}
        if not medians:
            raise ValueError(f"no (bucket, depth) with {min_windows} steady windows")
        steady = [m / medians[key] for key, g in groups.items() if key in medians for m in g[False]]
        switched = [m / medians[key] for key, g in groups.items() if key in medians for m in g[True]]
        logs = [
            math.log(w[4] / medians[(int(w[0]), int(w[1]))]) if (int(w[0]), int(w[1])) in medians else None
            for w in windows
        ]
        pairs = [(a, b) for a, b in itertools.pairwise(logs) if a is not None and b is not None]
        lag1 = statistics.correlation(*zip(*pairs, strict=True)) if len(pairs) > 2 else 0.0
        return cls(tuple(sorted(steady)), statistics.median(switched) if switched else 1.0, max(lag1, 0.0))


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    batch: int
    step_ms: tuple[float, ...]
    """True mean step time at each depth 0..K."""
    tokens: tuple[float, ...]
    """Tokens per step at each depth, over a step at depth 0 (so gain[d] = tokens[d] - 1)."""


def scenarios_from_cells(cells: Path, concurrencies: Sequence[int], max_depth: int = 3) -> list[Scenario]:
    """Per concurrency: the fixed-depth cells' median ms per engine step and tokens per step."""
    rows = list(csv.DictReader(cells.open()))
    out = []
    for conc in concurrencies:
        ms, tokens = [], []
        for depth in range(max_depth + 1):
            name = "none" if depth == 0 else f"fixed-{depth}"
            cell = [r for r in rows if int(r["concurrency"]) == conc and r["policy"] == name]
            if not cell:
                raise ValueError(f"{cells}: no {name} cells at concurrency {conc}")
            ms.append(statistics.median(float(r["ms_per_engine_step"]) for r in cell))
            tokens.append(statistics.median(float(r["tokens_per_engine_step"]) for r in cell))
        out.append(Scenario(f"c={conc}", conc, tuple(ms), tuple(t / tokens[0] for t in tokens)))
    return out


def run(
    scenario: Scenario,
    noise: Noise,
    steps: int,
    seed: int,
    depth: int | None,
    held: float = 0.0,
    blind: bool = False,
    cells: tuple[int, int] | None = None,
    slow_start: tuple[float, int] = (1.0, 0),
    chooser_type: type[StepDepthChooser] = StepDepthChooser,
) -> float:
    """Tokens per second over ``steps`` steps: at a fixed ``depth``, or the chooser's (None).

    ``slow_start``: (F, W): the first window runs F times slower, the slowness fading linearly over
    W windows (a host's warm-up: the eighth GPU session's first cell ran at half the speed of the
    later ones).

    ``cells``: (steps per cell, windows between cells) as the policy benchmark runs adaptive: cells
    of a few hundred steps, other policies' cells in between (the noise runs on meanwhile, unseen),
    and a first, warm-up cell whose tokens are not counted.

    ``held``: the share of the batch at a depth the chooser does not set (held at a thinking
    budget): the chooser sees the rest as its requests, each gaining ``gain[d] / (1 - held)`` so
    that the batch yields what the cells measured, and the held ones as ``fixed_tokens``, or not
    at all with ``blind`` (the chooser before it counted them)."""
    factors = noise.factors(seed)
    chooser = chooser_type(len(scenario.step_ms) - 1, random.Random(seed + 1))
    n_held = round(scenario.batch * held)
    adaptive = scenario.batch - n_held
    scale = scenario.batch / adaptive
    gains = [[(t - 1) * scale for t in scenario.tokens]] * adaptive
    caps = [len(scenario.step_ms) - 1] * adaptive
    fixed_tokens = 0.0 if blind else float(n_held)
    window_steps = chooser.window_steps
    clock = tokens = 0.0
    factor = 1.0
    previous = None
    warm_up = cells[0] if cells else 0
    for step in range(steps + warm_up):
        if step == warm_up:
            clock = tokens = 0.0
        if cells and step and step % cells[0] == 0:
            for _ in range(cells[1]):
                next(factors)
        if step % window_steps == 0:
            slow, fade = slow_start
            left = max(0.0, 1 - step / window_steps / fade) if fade else 0.0  # of the slowness
            factor = next(factors) * (1 + (slow - 1) * left)
        if depth is None:
            window = chooser.choose(scenario.batch, gains, caps, explore_share=0.05, fixed_tokens=fixed_tokens)
            d = window.depth
        else:
            d = depth
        seconds = scenario.step_ms[d] * factor / 1e3
        if previous is not None and d != previous:
            seconds += (noise.switched - 1) * window_steps * scenario.step_ms[d] / 1e3
        previous = d
        if depth is None:
            chooser.step_finished(window, scenario.batch, clock, clock + seconds)
        clock += seconds
        tokens += scenario.batch * scenario.tokens[d]
    return tokens / clock


def compare(
    scenario: Scenario,
    noise: Noise,
    steps: int,
    seeds: int,
    held: float = 0.0,
    blind: bool = False,
    cells: tuple[int, int] | None = None,
    slow_start: tuple[float, int] = (1.0, 0),
    chooser_type: type[StepDepthChooser] = StepDepthChooser,
) -> dict[str, float]:
    """Chooser over the best static depth (in hindsight, per seed), median and worst over seeds."""
    ratios = []
    for seed in range(seeds):
        static = [
            run(scenario, noise, steps, seed, d, cells=cells, slow_start=slow_start)
            for d in range(len(scenario.step_ms))
        ]
        chosen = run(scenario, noise, steps, seed, None, held, blind, cells, slow_start, chooser_type)
        ratios.append(chosen / max(static))
    return {"median": statistics.median(ratios), "worst": min(ratios)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a bench_policies output folder (controller.json, cells.csv)")
    parser.add_argument("--cells", type=Path, default=None, help="the scenarios from another run's cells.csv")
    parser.add_argument("--concurrency", default="4,16,64")
    parser.add_argument("--steps", default="600,5000", help="steps per simulated run (a benchmark's, a server's)")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--held", type=float, default=0.0, help="share of the batch held at depth 0 (thinking budget)")
    parser.add_argument("--blind", action="store_true", help="the chooser does not count held requests' tokens")
    parser.add_argument(
        "--bench-cells",
        default=None,
        help="STEPS,GAP: as the policy benchmark runs adaptive, in cells of STEPS steps with GAP windows "
        "of other policies between them, after one uncounted warm-up cell",
    )
    parser.add_argument(
        "--slow-start",
        default="1,0",
        help="F,W: the first window F times slower, fading over W windows (a host's warm-up)",
    )
    cfg = parser.parse_args(argv)
    noise = Noise.from_windows(json.loads((cfg.run / "controller.json").read_text())["step_depth_windows"])
    print(
        f"SIMULATION. Noise from {cfg.run}: {len(noise.steady)} steady windows, 10th-90th percentile "
        f"{noise.steady[len(noise.steady) // 10]:.2f}-{noise.steady[len(noise.steady) * 9 // 10]:.2f}x "
        f"their median, consecutive windows correlated {noise.lag1:.2f}; a switched window {noise.switched:.2f}x."
    )
    print(
        "| scenario | ms per step at depth 0..K | tokens per step over depth 0 | steps "
        "| chooser / best static: median (worst) |"
    )
    print("| --- | --- | --- | --- | --- |")
    cells = cfg.cells or cfg.run / "cells.csv"
    bench_cells = None
    if cfg.bench_cells:
        cell_steps, gap = (int(v) for v in cfg.bench_cells.split(","))
        bench_cells = (cell_steps, gap)
    f, fade = cfg.slow_start.split(",")
    slow_start = (float(f), int(fade))
    for scenario in scenarios_from_cells(cells, [int(c) for c in cfg.concurrency.split(",")]):
        for steps in (int(s) for s in cfg.steps.split(",")):
            result = compare(scenario, noise, steps, cfg.seeds, cfg.held, cfg.blind, bench_cells, slow_start)
            print(
                f"| {scenario.name} | {', '.join(f'{m:.1f}' for m in scenario.step_ms)} | "
                f"{', '.join(f'{t:.3f}' for t in scenario.tokens)} | {steps} | "
                f"{result['median']:.3f} ({result['worst']:.3f}) |"
            )


if __name__ == "__main__":
    main()
