"""The adaptive policy against the static ones, from a policy benchmark's cells.

    .venv/bin/python -m load.adaptive_report load/results/DIR [DIR...]

(and, where the folder's ``controller.json`` has them, the step chooser's windows)

Ratios are *paired*: within one repetition at one concurrency every policy ran
back to back (rotated order), so ``adaptive / other`` is taken per repetition
and the table shows their geometric mean and the [min, max] over repetitions.
Machine drift between repetitions (up to ~30% here) then cancels instead of
landing in whichever policy happened to run during a slow minute. The best
static policy is chosen in hindsight by mean throughput, which favours it: the
largest of many noisy means is biased upwards. An A/A twin (``X-aa``) is never a
"best": it is shown against its original in a table of its own.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load.policy_report import USER_MAP


@dataclass(frozen=True, slots=True)
class Paired:
    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def read_cells(folders: list[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for folder in folders:
        with (folder / "cells.csv").open() as file:
            rows.extend(csv.DictReader(file))
    return rows


class Board:
    """tok/s per (concurrency, repetition, policy)."""

    def __init__(self, cells: list[dict[str, Any]]) -> None:
        self.tok_s: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        self.chosen: dict[int, dict[str, list[int]]] = defaultdict(dict)
        for cell in cells:
            conc, rep, name = int(cell["concurrency"]), int(cell["rep"]), cell["policy"]
            self.tok_s[conc][rep][name] = float(cell["tok_s"])
            for phase, steps in json.loads(cell.get("chosen") or "{}").items():
                have = self.chosen[conc].setdefault(phase, [0] * len(steps))
                for depth, n in enumerate(steps):
                    have[depth] += n

    def mean(self, conc: int, name: str) -> float:
        return statistics.fmean(rep[name] for rep in self.tok_s[conc].values() if name in rep)

    def policies(self, conc: int) -> set[str]:
        return {name for rep in self.tok_s[conc].values() for name in rep}

    def paired(self, conc: int, name: str, against: str) -> Paired | None:
        ratios = [rep[name] / rep[against] for rep in self.tok_s[conc].values() if name in rep and against in rep]
        if not ratios:
            return None
        return Paired(statistics.geometric_mean(ratios), min(ratios), max(ratios))

    def spread(self, conc: int, name: str) -> float:
        values = [rep[name] for rep in self.tok_s[conc].values() if name in rep]
        return (max(values) - min(values)) / statistics.fmean(values)


def adaptive_targets(cells: list[dict[str, Any]]) -> list[str]:
    """Markdown: adaptive against none, the best static and fixed policies, the user's map."""
    board = Board(cells)
    lines = [
        "| conc | reps | adaptive tok/s (spread) | vs none | best static (hindsight) | vs it | best fixed "
        "| vs it | vs map-1-2 | adaptive's steps at depth 0/1/2/3 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    concs = sorted(c for c in board.tok_s if "adaptive" in board.policies(c))
    for conc in concs:
        # An A/A twin is kept out of every "best" (as in load/policy_report.py): the larger of two
        # runs of one policy is that policy's luck (tenth GPU session: fixed-1-aa "best" at c >= 4).
        # A capped adaptive policy (adaptive-R-A) is no static one either.
        static_names = [n for n in board.policies(conc) if not n.endswith("-aa") and not n.startswith("adaptive")]
        static = {n: board.mean(conc, n) for n in static_names}
        best_static = max(static, key=static.__getitem__)
        fixed = {k: v for k, v in static.items() if k.startswith("fixed-")}
        best_fixed = max(fixed, key=fixed.__getitem__)
        user = board.paired(conc, "adaptive", USER_MAP.name)
        lines.append(
            f"| {conc} | {len(board.tok_s[conc])} | {board.mean(conc, 'adaptive'):.2f} "
            f"({board.spread(conc, 'adaptive'):.1%}) | {board.paired(conc, 'adaptive', 'none')} "
            f"| {best_static} {static[best_static]:.2f} | {board.paired(conc, 'adaptive', best_static)} "
            f"| {best_fixed} | {board.paired(conc, 'adaptive', best_fixed)} | {user or '-'} "
            f"| {dict(board.chosen[conc])} |"
        )
    if len(concs) > 1:
        names = {n for c in concs for n in board.policies(c) if n.startswith("fixed-") and not n.endswith("-aa")}
        names = {n for n in names if all(n in board.policies(c) for c in concs)}
        geo = {
            name: statistics.geometric_mean(board.paired(c, "adaptive", name).mean for c in concs)  # type: ignore[union-attr]
            for name in names | {"none"}
        }
        best = min(names, key=geo.__getitem__)
        lines += [
            "",
            f"Geometric mean over concurrency {', '.join(map(str, concs))} of the paired ratios: adaptive / none "
            f"{geo['none']:.3f}; adaptive / fixed-d: "
            + ", ".join(f"{n} {geo[n]:.3f}" for n in sorted(names))
            + f" (the best single fixed depth overall: {best}).",
        ]
    return lines


def twin_table(cells: list[dict[str, Any]]) -> list[str]:
    """Markdown: adaptive (and any capped adaptive policy, ``adaptive-R-A``) against each static
    policy that also ran under a second name (``X=aa``: an A/A control), beside the twin against
    it. Adaptive is only measured to lose (or win) where its ratio falls outside what the twins read."""
    board = Board(cells)
    lines = [
        "| conc | adaptive policy | static policy | adaptive / it | A/A: its twin / it | adaptive / its twin |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for conc in sorted(board.tok_s):
        names = board.policies(conc)
        for adaptive in sorted(n for n in names if n.startswith("adaptive")):
            for twin in sorted(n for n in names if n.endswith("-aa") and n.removesuffix("-aa") in names):
                original = twin.removesuffix("-aa")
                lines.append(
                    f"| {conc} | {adaptive} | {original} | {board.paired(conc, adaptive, original)} "
                    f"| {board.paired(conc, twin, original)} | {board.paired(conc, adaptive, twin)} |"
                )
    return lines if len(lines) > 2 else []


def window_table(state: dict[str, Any]) -> list[str]:
    """Markdown: the one-depth-per-step chooser's closed windows (``step_depth_windows`` of the
    controller state) by bucket, depth and whether the window switched depth, beside the
    estimate each depth had at the end: what to read when adaptive picked a depth it should not."""
    windows = state.get("step_depth_windows") or []
    estimates = state.get("step_depth_ms") or {}
    groups: dict[tuple[int, int, bool], list[list[Any]]] = defaultdict(list)
    for bucket, depth, switched, _steps, mean_ms, slowest_ms, *extra in windows:
        # Recorded since the seventh GPU session: requests at a fixed depth; since the eighth: tokens
        # per step expected when the window was chosen, and yielded.
        groups[(bucket, depth, switched)].append([mean_ms, slowest_ms, *extra, None, None, None][:5])
    lines = [
        "| bucket | depth | window | windows | mean step ms: median [min, max] | slowest step ms: median "
        "| requests at a fixed depth per step: median | tokens per step expected / yielded: median "
        "| the depth's estimate ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def median_of(values: list[Any]) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.1f}" if known else "-"

    for (bucket, depth, switched), rows in sorted(groups.items()):
        means = [r[0] for r in rows]
        estimate = (estimates.get(str(bucket)) or [None] * (depth + 1))[depth]
        lines.append(
            f"| {bucket} | {depth} | {'after a switch' if switched else 'steady'} | {len(rows)} "
            f"| {statistics.median(means):.1f} [{min(means):.1f}, {max(means):.1f}] "
            f"| {statistics.median(r[1] for r in rows):.1f} "
            f"| {median_of([r[2] for r in rows])} "
            f"| {median_of([r[3] for r in rows])} / {median_of([r[4] for r in rows])} "
            f"| {'-' if estimate is None else estimate} |"
        )
    lines.append("")
    if "step_depth_switch_share" in state:  # since the ninth GPU session: from pairs of windows
        share = state.get("step_depth_switch_share") or {}
        lines.append("What a switch adds to a window's time, share, by bucket: " + json.dumps(share))
    else:
        switch = state.get("step_depth_switch_ms") or {}
        lines.append("Switch cost per window, ms, by bucket: " + json.dumps(switch))
    return lines


def held_table(state: dict[str, Any]) -> list[str]:
    """Markdown: tokens per ms of the chooser's windows by bucket, share of the batch held at a fixed
    depth (quarters of the bucket's largest batch, ``2 ** bucket``) and depth, steps weighted: does
    depth 0 run only where most of the batch is held, and does it pay there? Windows written before
    the eighth GPU session (no tokens yielded) are left out."""
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for bucket, depth, _switched, steps, mean_ms, _slowest, *extra in state.get("step_depth_windows") or []:
        if len(extra) < 3 or not steps:
            continue
        held, yielded = extra[0], extra[2]
        quarter = min(int(4 * held / 2**bucket), 3)  # bucket b holds batches up to 2**b
        group = groups[(bucket, quarter, depth)]
        group[0] += 1
        group[1] += steps
        group[2] += yielded * steps
        group[3] += mean_ms * steps
    lines = [
        "| bucket | held at a fixed depth | depth | windows | steps | tokens per ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (bucket, quarter, depth), (windows, steps, tokens, ms) in sorted(groups.items()):
        band = f"{25 * quarter}-{25 * (quarter + 1)}% of {2**bucket}"
        lines.append(f"| {bucket} | {band} | {depth} | {windows} | {steps} | {tokens / ms if ms else 0:.2f} |")
    return lines if len(lines) > 2 else []


def mix_table(folder: Path, against: str = "fixed-1") -> list[str]:
    """Markdown: each policy's timed steps against ``against``'s, split into what its choices cost and
    how fast its steps ran. A step's time depends on its shape (concurrency, tokens verified) and on
    the host's speed at that moment, which drifts more than depths differ (an A/A twin reads 0.8-1.2x
    on a shared host). Pricing every policy's steps at the run's mean time for each shape, pooled over
    all policies (``cost_curve.csv``), cancels the drift: ``mix`` is the throughput its choices would
    have at equal speed (the A/A twin reads 1.000). ``full`` is the same over the steps with every slot
    busy, and ``drain`` what the others (a cell's last requests, or a batch filling) add beyond
    ``against``'s, as a share of its priced time: a cell ends when its slowest request does, and a
    step of a few requests costs nearly a full one. Requests per step are in ``cost_by_batch.csv``
    (since the twenty-third GPU session); without it, a step with fewer tokens verified than slots
    stands for one with slots free, which counts a depth-0 step of a partial batch as drain and a
    depth-1 one as full (the split then favours ``full`` for a policy that runs depth 0 in drains).
    ``speed`` is the rest: its steps' own times against those prices, relative to ``against``'s (the
    host's drift, and any per-step CPU a policy adds); ``timed`` = mix x speed is the ratio of the
    timed steps' total times. Untimed steps (prefills, steps the worker did not go straight into) are
    left out of all of them."""
    by_batch = (folder / "cost_by_batch.csv").exists()
    pooled_file, by_policy_file = (
        folder / "cost_curve.csv",
        folder / ("cost_by_batch.csv" if by_batch else "cost_by_policy.csv"),
    )
    if not pooled_file.exists() or not by_policy_file.exists():
        return []
    with pooled_file.open() as f:
        pooled = {(int(r["concurrency"]), int(r["tokens_per_step"])): float(r["mean_ms"]) for r in csv.DictReader(f)}
    # (conc, policy) -> [steps, priced ms, own ms, priced ms of the steps with fewer tokens than slots]
    totals: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    with by_policy_file.open() as f:
        for r in csv.DictReader(f):
            conc, tokens, steps = int(r["concurrency"]), int(r["tokens_per_step"]), int(r["steps"])
            total = totals[(conc, r["policy"])]
            price = steps * pooled[(conc, tokens)]
            total[0] += steps
            total[1] += price
            total[2] += steps * float(r["mean_ms"])
            total[3] += price if (int(r["requests"]) if by_batch else tokens) < conc else 0.0
    lines = [
        f"| conc | policy | timed steps / {against}'s | mix: priced at pooled step times | full: mix with every slot "
        f"busy{'' if by_batch else ' (by tokens)'} | drain: priced time of the others beyond {against}'s "
        "| speed at equal shapes "
        "| timed: mix x speed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for conc, name in sorted(k for k in totals if k[1] != against):
        base = totals.get((conc, against))
        if base is None:
            continue
        count, priced, own, drain = totals[(conc, name)]
        mix = base[1] / priced
        full = (base[1] - base[3]) / (priced - drain) if priced > drain else float("nan")
        speed = (priced / own) / (base[1] / base[2])
        lines.append(
            f"| {conc} | {name} | {count / base[0]:.3f} | {mix:.3f} | {full:.3f} | {(drain - base[3]) / base[1]:+.3f} "
            f"| {speed:.3f} | {mix * speed:.3f} |"
        )
    return lines if len(lines) > 2 else []


def drain_table(folder: Path) -> list[str]:
    """Markdown: per policy, a cell's timed steps with every slot busy and in its drain (fewer
    requests than slots), the drain's steps beyond fixed-1's, and the tokens each request verifies
    a step in both (1 + its drafts; held requests verify one): whether a policy's drain is longer,
    or runs shallower, and its tail (a quarter of the slots busy or less: a cell's last requests) in
    steps and time. Needs ``cost_by_batch.csv`` (requests per step) and ``cells.csv`` (the
    repetitions). Without speculation every request advances a token a step and a cell of
    equal-length requests drains in a few steps: a longer drain is the spread of the requests'
    progress, which acceptance's luck and each policy's depths set."""
    batch_file, cells_file = folder / "cost_by_batch.csv", folder / "cells.csv"
    if not batch_file.exists() or not cells_file.exists():
        return []
    reps: dict[tuple[int, str], set[str]] = defaultdict(set)
    for r in read_cells([folder]):
        reps[(int(r["concurrency"]), r["policy"])].add(r["rep"])
    # (conc, policy) -> [full steps, request-steps, tokens, drain steps, request-steps, tokens, tail steps, tail ms]
    totals: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0] * 8)
    with batch_file.open() as f:
        for r in csv.DictReader(f):
            conc, requests, steps = int(r["concurrency"]), int(r["requests"]), int(r["steps"])
            total, at = totals[(conc, r["policy"])], 3 if requests < conc else 0
            total[at] += steps
            total[at + 1] += steps * requests
            total[at + 2] += steps * int(r["tokens_per_step"])
            if requests <= conc // 4:
                total[6] += steps
                total[7] += steps * float(r["mean_ms"])

    def cells_of(conc: int, name: str) -> int:
        return max(1, len(reps.get((conc, name), ())))

    lines = [
        "| conc | policy | full steps a cell | drain steps a cell | drain steps beyond fixed-1's "
        "| tail (a quarter of the slots busy or less): steps a cell | tail ms a cell "
        "| tokens verified per request a step: full | drain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for conc, name in sorted(totals):
        full, full_reqs, full_tokens, drain, drain_reqs, drain_tokens, tail, tail_ms = totals[(conc, name)]
        n = cells_of(conc, name)
        base = totals.get((conc, "fixed-1"))
        beyond = "-" if base is None else f"{drain / n - base[3] / cells_of(conc, 'fixed-1'):+.1f}"
        per_full = f"{full_tokens / full_reqs:.2f}" if full_reqs else "-"
        per_drain = f"{drain_tokens / drain_reqs:.2f}" if drain_reqs else "-"
        lines.append(
            f"| {conc} | {name} | {full / n:.1f} | {drain / n:.1f} | {beyond} | {tail / n:.1f} | {tail_ms / n:.0f} "
            f"| {per_full} | {per_drain} |"
        )
    return lines if len(lines) > 2 else []


def main(argv: list[str]) -> None:
    folders = [Path(p) for p in argv]
    cells = read_cells(folders)
    print("\n".join(adaptive_targets(cells)))
    twins = twin_table(cells)
    if twins:
        print("\nAdaptive against each policy that has an A/A twin, paired per repetition:\n")
        print("\n".join(twins))
    for folder in folders:
        mix = mix_table(folder)
        if mix:
            print(f"\nEach policy's timed steps against fixed-1's, its choices priced at equal speed ({folder}):\n")
            print("\n".join(mix))
        drain = drain_table(folder)
        if drain:
            print(f"\nSteps with every slot busy and in the drain, per cell ({folder}):\n")
            print("\n".join(drain))
        state_file = folder / "controller.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        if state.get("step_depth_windows"):
            print(f"\nThe step chooser's windows ({state_file}):\n")
            print("\n".join(window_table(state)))
            held = held_table(state)
            if held:
                print("\nThe same windows by requests held, tokens per ms (steps weighted):\n")
                print("\n".join(held))
            if state.get("step_depth_cut_windows") is not None:  # since the twenty-second GPU session
                cut = json.dumps(state["step_depth_cut_windows"])
                print(f"\nWindows ended early by steps without adaptive requests, by bucket: {cut}")


if __name__ == "__main__":
    main(sys.argv[1:])
