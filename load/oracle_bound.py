"""The most any depth chooser could gain over a fixed depth on a benchmark run, from its own cells.

Each (prompt kind, phase) is given the depth with the most tokens per second, from the acceptance
by position the deepest static cell measured (every position proposed there) and the static
cells' step times (median ms per engine step of ``fixed-d``; ``none`` for depth 0), and its tokens
are timed at that rate; the bound is the time at ``--against`` depth over that time. Generous:
it ignores that a model drafter's depth is one per step for the whole batch, the steps held at a
thinking budget, and what learning the depths costs. Usage:

    python -m load.oracle_bound load/results/gpu-h200-vllm0.26-session10/bench-mixed --concurrency 16
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

from load.policy_report import add_phase, position_acceptance


def static_ms(rows: list[dict[str, str]], max_depth: int) -> dict[int, float]:
    """Median ms per engine step of each static depth's cells (``none`` is depth 0)."""
    names = {0: "none", **{d: f"fixed-{d}" for d in range(1, max_depth + 1)}}
    return {
        d: statistics.median(float(r["ms_per_engine_step"]) for r in rows if r["policy"] == name)
        for d, name in names.items()
        if any(r["policy"] == name for r in rows)
    }


def acceptance(rows: list[dict[str, str]], policy: str) -> dict[tuple[str, str], tuple[list[float], int]]:
    """(kind, phase) -> (acceptance by position, tokens), summed over ``policy``'s cells."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row["policy"] == policy:
            kinds = json.loads(row["kinds"]) or {"all": json.loads(row["phases"])}
            for kind, phases in kinds.items():
                for phase, counters in phases.items():
                    add_phase(totals.setdefault((kind, phase), {}), counters)
    return {
        key: ([rate or 0.0 for rate in position_acceptance(phase)], phase["tokens"]) for key, phase in totals.items()
    }


def bound(rows: list[dict[str, str]], max_depth: int, against: int) -> tuple[float, list[str]]:
    """The time at fixed depth ``against`` over the time with every (kind, phase) at its best depth,
    and a line per (kind, phase)."""
    ms = static_ms(rows, max_depth)
    deepest = max(d for d in ms if d > 0)
    at_fixed = at_best = 0.0
    lines = []
    for (kind, phase), (acc, tokens) in sorted(acceptance(rows, f"fixed-{deepest}").items()):
        rate = {d: (1 + sum(acc[:d])) / ms[d] for d in ms}
        best = max(rate, key=rate.__getitem__)
        at_fixed += tokens / rate[against]
        at_best += tokens / rate[best]
        shown = ", ".join(f"{a:.3f}" for a in acc)
        lines.append(
            f"{kind:<6} {phase:<10} {tokens:6d} tokens, acceptance by position [{shown}]: best depth {best}, "
            f"{rate[best] / rate[against]:.3f}x depth {against}"
        )
    lines.append("static ms per engine step: " + ", ".join(f"depth {d} {t:.2f}" for d, t in sorted(ms.items())))
    return at_fixed / at_best, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench_policies --out folder (its cells.csv)")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--max-depth", type=int, default=3)
    parser.add_argument("--against", type=int, default=1, help="the fixed depth compared with")
    args = parser.parse_args()
    with (args.run / "cells.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["concurrency"]) == args.concurrency]
    ratio, lines = bound(rows, args.max_depth, args.against)
    print("\n".join(lines))
    print(f"bound: {ratio:.3f}x fixed-{args.against} (each kind and phase at its best depth)")


if __name__ == "__main__":
    main()
