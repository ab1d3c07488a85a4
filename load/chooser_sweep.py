"""SIMULATION: the step chooser's re-run rule against every recorded GPU noise (``load/chooser_sim.py``).

``chooser_sim`` replays one run's noise; this sweeps the rule that decides when a passed-over depth
is run again (``StepDepthChooser.stale``) over many: every ``controller.json`` with window times
(the noise) x every ``cells.csv`` with all static depths (the scenarios) x concurrency 1, 4, 16, 64
x how the run is read:

- ``cold-600``, ``cold-2000``, ``cold-5000``: a fresh chooser, every step counted (a server's start
  and its long run);
- ``bench``: as ``load/bench_policies.py`` runs adaptive, cells of 300 steps with 110 windows of
  other policies between them, after one uncounted warm-up cell; ``bench-slow``: the same on a host
  whose first windows run 2x slower, fading over 20 windows (the H100 hosts' warm-up).

Printed per rule and reading: the mean over noise x scenario x concurrency of the chooser's median
(and worst) ratio to the best static depth in hindsight, seed by seed. Rules (``RULES``):

- ``shipped``: the engine's rule (engine/step_depth.py): a passed-over depth waits half the
  bucket's windows so far (at least 16, at most K / explore_share) times its patience;
- ``constant``: the rule before: it waits K / explore_share windows times its patience;
- ``thin``: three quarters of the windows, and a depth priced by fewer than 4 pairs waits as a
  close one does, whatever its gap (the seventeenth GPU session's failure: depth 1 at c=16 priced
  from 3 pairs, judged 17% worse, never re-run);
- ``impatient``: the shipped rule with a far depth waiting up to 2x its wait, not 6x: the rule
  until the twentieth GPU session, where 6x (the sweep's ``patient`` then) took adaptive from
  0.93-0.95 to 0.96-0.97 of fixed-1 on an H200 (the H100's and H200's depths 2-3 cost 20-30% at
  c >= 16: GPU sessions 18-20).

    python -m load.chooser_sweep --seeds 16
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.step_depth import StepDepthChooser
from engine.step_times import BucketTimes
from load import chooser_sim

RESULTS = Path(__file__).parent / "results"
Reading = tuple[int, tuple[int, int] | None, tuple[float, int]]
READINGS: dict[str, Reading] = {
    # (steps counted, (steps per cell, windows between cells) or None, (first-window slowness, fade))
    "cold-600": (600, None, (1.0, 0)),
    "cold-2000": (2000, None, (1.0, 0)),
    "cold-5000": (5000, None, (1.0, 0)),
    "bench": (300, (300, 110), (1.0, 0)),
    "bench-slow": (300, (300, 110), (2.0, 20)),
}


@dataclass(slots=True)
class Constant(StepDepthChooser):
    """The earlier rule: a passed-over depth waits K / explore_share windows (times its patience)."""

    rerun_fraction: float = 1.0


@dataclass(slots=True)
class Thin(StepDepthChooser):
    """A depth priced by fewer than ``thin_pairs`` pairs waits as a close one does, whatever its gap."""

    rerun_fraction: float = 0.75
    thin_pairs: int = 4

    def stale(self, table: BucketTimes, rates: Sequence[float], explore_share: float, lowest: int = 0) -> int | None:
        pairs = [0] * len(rates)
        for (a, b), (_, n) in table.links().items():
            pairs[a] += n
            pairs[b] += n
        best = max(rates)
        # A thin depth is priced at the best rate, so its patience is 1.
        seen = [best if n < self.thin_pairs else rate for n, rate in zip(pairs, rates, strict=True)]
        return StepDepthChooser.stale(self, table, seen, explore_share, lowest)  # slots dataclass: no bare super()


@dataclass(slots=True)
class Impatient(StepDepthChooser):
    """A depth far below the best waits up to 2x its wait (its gap over ``close_gap``), not 6x."""

    max_patience: float = 2.0


RULES: dict[str, type[StepDepthChooser]] = {
    "shipped": StepDepthChooser,
    "constant": Constant,
    "thin": Thin,
    "impatient": Impatient,
}


def recorded(results: Path, only: str = "") -> tuple[list[chooser_sim.Noise], list[chooser_sim.Scenario]]:
    """The window noise of every run with window times, and the scenarios (concurrency 1, 4, 16, 64)
    of every run with every static depth's cells; ``only``: runs whose folder name contains it."""
    noises = []
    for p in sorted(results.glob(f"gpu-*{only}*/*/controller.json")):
        windows = json.loads(p.read_text()).get("step_depth_windows") or []
        if len(windows) >= 100:
            noises.append(chooser_sim.Noise.from_windows(windows))
    scenarios = []
    for p in sorted(results.glob(f"gpu-*{only}*/*/cells.csv")):
        rows = list(csv.DictReader(p.open()))
        policies = {r["policy"] for r in rows}
        concurrencies = {r["concurrency"] for r in rows}
        if (
            {"none", "fixed-1", "fixed-2", "fixed-3"} <= policies
            and {"1", "4", "16", "64"} <= concurrencies
            and "ms_per_engine_step" in rows[0]
        ):
            scenarios += chooser_sim.scenarios_from_cells(p, [1, 4, 16, 64])
    return noises, scenarios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--readings", default=",".join(READINGS))
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--only", default="", help="only runs whose folder name contains this (e.g. h100)")
    cfg = parser.parse_args(argv)
    noises, scenarios = recorded(cfg.results, cfg.only)
    readings = cfg.readings.split(",")
    print(f"SIMULATION. {len(noises)} noises x {len(scenarios)} scenarios, {cfg.seeds} seeds.")
    print("| rule | " + " | ".join(f"{r}: median (worst)" for r in readings) + " |")
    print("| --- |" + " --- |" * len(readings))
    for rule in cfg.rules.split(","):
        cols = []
        for reading in readings:
            steps, bench_cells, slow_start = READINGS[reading]
            results = [
                chooser_sim.compare(
                    scenario,
                    noise,
                    steps,
                    cfg.seeds,
                    cells=bench_cells,
                    slow_start=slow_start,
                    chooser_type=RULES[rule],
                )
                for noise, scenario in itertools.product(noises, scenarios)
            ]
            median = statistics.mean(r["median"] for r in results)
            worst = statistics.mean(r["worst"] for r in results)
            cols.append(f"{median:.4f} ({worst:.3f})")
        print(f"| {rule} | " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
