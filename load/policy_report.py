"""Aggregation of policy-benchmark cells into the report: pure functions.

A *cell* is one policy run over the whole workload at one concurrency; the
benchmark repeats every cell and interleaves the policies, so the spread
between repetitions is the noise floor a difference must beat.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PHASES = ("reasoning", "answer")


@dataclass(frozen=True, slots=True)
class Policy:
    reasoning: int
    answer: int
    adaptive: bool = False
    """Adaptive: reasoning and answer are caps; the engine's controller chooses."""
    twin: str = ""
    """A/A control: the same static policy under a second name, kept out of every "best"."""
    capped: bool = False
    """An adaptive policy with caps below K (``adaptive@R:A``), named for them: not "the" adaptive
    policy, and kept out of every "best" as adaptive is."""

    @property
    def name(self) -> str:
        if self.twin:
            return f"{replace(self, twin='').name}-{self.twin}"
        if self.adaptive:
            return f"adaptive-{self.reasoning}-{self.answer}" if self.capped else "adaptive"
        if self.reasoning == self.answer:
            return "none" if self.reasoning == 0 else f"fixed-{self.reasoning}"
        return f"map-{self.reasoning}-{self.answer}"

    @property
    def fixed(self) -> bool:
        return self.reasoning == self.answer and not self.adaptive and not self.twin

    def sort_key(self) -> tuple[bool, int, int]:
        return (self.adaptive, self.reasoning, self.answer)


def policy_grid(max_depth: int) -> list[Policy]:
    """No speculation, fixed depths 1..K and every (reasoning, answer) map."""
    return [Policy(r, a) for r in range(max_depth + 1) for a in range(max_depth + 1)]


@dataclass(slots=True)
class Cell:
    policy: Policy
    concurrency: int
    rep: int
    wall_s: float
    tokens: int
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per phase: tokens, num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos,
    steps_by_drafted (vLLM's names)."""
    matches_uncapped: int | None = None
    """Requests whose greedy output equalled the uncapped policy's (concurrency 1)."""
    requests: int = 0
    unended: int = 0
    """Requests with no answer token: their reasoning never ended (the workload then is not the one
    asked for: every request reasons to its budget, then answers)."""
    chosen: dict[str, list[int]] = field(default_factory=dict)
    """Adaptive cells: engine steps at each depth, per phase (the controller's choices)."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """Adaptive cells: per request, its depth changes and the estimates behind them."""
    hook_us_per_step: float | None = None
    """CPU time the depth hook added per engine step (engine/hook.py OwnTime)."""
    engine_steps: int = 0
    """Engine steps during the cell (scheduler outputs the engine finished): wall / steps is the
    mean step time seen from outside, tokens / steps the tokens a step yields."""
    kinds: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """Per kind of request (the workload's ``copy``/``free``), the per-phase totals."""
    timed_steps: int = 0
    timed_s: float = 0.0
    """Decode steps the hook timed in the cell (the worker went straight into them), and their time:
    ``timed_s`` / ``wall_s`` is the share of the wall in timed decode steps, the rest is prefills,
    steps not timed and idle gaps, so a cell's loss can be placed in its steps or between them."""
    draft_steps: int = 0
    draft_passes: int = 0
    draft_passes_unverified: int = 0
    """Steps that verified drafts, the drafter's passes for them, and the passes beyond the deepest
    depth each verified (engine/hook.py ``DraftPasses``): drafting paid for and cut."""
    schedule_s: float = 0.0
    update_s: float = 0.0
    process_cpu_s: float = 0.0
    """The engine core's wall time in whole ``schedule`` and ``update_from_output`` calls (vLLM's
    work in them included; engine/hook.py ``CoreTime``) and its process's CPU time, over the cell:
    per step beside the step time, whether the core's loop sets the pace."""
    probe_s: float = 0.0
    """A fixed pure-Python workload's time in the engine core, before and after the cell (engine
    ``cpu_probe``): the host's speed between cells. Not a normalizer: on a steady host it stayed
    within 4.25-4.5 ms while steps moved +-5% with the hook's own CPU time per step (GPU session 19,
    docs/gpu.md); it shows a drift as large as that session's first host's (2x)."""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def add_phase(into: dict[str, Any], counters: dict[str, Any]) -> None:
    """Sum one request's per-phase report into a cell's phase totals."""
    for key in ("tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        into[key] = into.get(key, 0) + int(counters.get(key) or 0)
    for key in ("num_accepted_tokens_per_pos", "steps_by_drafted"):
        values = counters.get(key) or []
        have = into.setdefault(key, [])
        have.extend([0] * (len(values) - len(have)))  # a phase with no verify step reports []
        for i, v in enumerate(values):
            have[i] += v


def position_acceptance(phase: dict[str, Any]) -> list[float | None]:
    """Acceptance at draft position i: accepted there / steps that drafted past i."""
    by_drafted = phase.get("steps_by_drafted") or []
    rates: list[float | None] = []
    for pos, accepted in enumerate(phase.get("num_accepted_tokens_per_pos") or []):
        reached = sum(by_drafted[pos + 1 :])
        rates.append(round(accepted / reached, 4) if reached else None)
    return rates


def _mean_spread(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (max(values) - min(values)) / mean if mean else 0.0


def summarize(cells: list[Cell]) -> list[dict[str, Any]]:
    """One row per (concurrency, policy) with means over repetitions and ratios."""
    groups: dict[tuple[int, Policy], list[Cell]] = defaultdict(list)
    for cell in cells:
        groups[(cell.concurrency, cell.policy)].append(cell)
    mean_tok_s = {key: _mean_spread([c.tok_s for c in group])[0] for key, group in groups.items()}
    fixed = {key: v for key, v in mean_tok_s.items() if key[1].fixed and key[1].reasoning > 0}
    best_fixed_at = {conc: max(v for (c, _), v in fixed.items() if c == conc) for conc, _ in fixed}
    best_fixed_policy = (
        max({p for _, p in fixed}, key=lambda p: statistics.fmean(v for (c, q), v in fixed.items() if q == p))
        if fixed
        else None
    )
    static = {key: v for key, v in mean_tok_s.items() if not key[1].adaptive and not key[1].twin}
    best_static_at = {conc: max((v, p) for (c, p), v in static.items() if c == conc) for conc, _ in static}
    rows = []
    for (conc, policy), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1].sort_key())):
        tok_s, spread = _mean_spread([c.tok_s for c in group])
        none = mean_tok_s.get((conc, Policy(0, 0)))
        overall = mean_tok_s.get((conc, best_fixed_policy)) if best_fixed_policy else None
        phases: dict[str, dict[str, Any]] = {}
        for cell in group:
            for name, counters in cell.phases.items():
                add_phase(phases.setdefault(name, {}), counters)
        row: dict[str, Any] = {
            "concurrency": conc,
            "policy": policy.name,
            "reasoning_depth": policy.reasoning,
            "answer_depth": policy.answer,
            "reps": len(group),
            "tok_s": round(tok_s, 2),
            "spread": round(spread, 3),
            "vs_none": round(tok_s / none, 3) if none else None,
            "vs_best_fixed_here": round(tok_s / best_fixed_at[conc], 3) if conc in best_fixed_at else None,
            "vs_best_fixed_overall": round(tok_s / overall, 3) if overall else None,
            "best_fixed_overall": best_fixed_policy.name if best_fixed_policy else None,
            "vs_best_static_here": _ratio(tok_s, best_static_at.get(conc, (None,))[0]),
            "best_static_here": best_static_at[conc][1].name if conc in best_static_at else None,
            "vs_user_map": _ratio(tok_s, mean_tok_s.get((conc, USER_MAP))),
            "vs_twin": _ratio(tok_s, mean_tok_s.get((conc, replace(policy, twin="")))) if policy.twin else None,
            "outputs_match_uncapped": _matches(group),
            "chosen_depths": _chosen(group),
        }
        for name in PHASES:
            phase = phases.get(name, {})
            drafted = phase.get("num_draft_tokens", 0)
            row[f"{name}_tokens"] = phase.get("tokens", 0)
            row[f"{name}_acceptance"] = round(phase["num_accepted_tokens"] / drafted, 4) if drafted else None
            row[f"{name}_acceptance_by_pos"] = position_acceptance(phase)
        rows.append(row)
    return rows


USER_MAP = Policy(1, 2)
"""The DeepSeek-V4 user's static map (docs/benchmarks.md): reasoning 1, answer 2."""


def _ratio(value: float, against: float | None) -> float | None:
    return round(value / against, 3) if against else None


def _chosen(group: list[Cell]) -> dict[str, list[int]] | None:
    """Steps at each depth per phase, summed over an adaptive policy's repetitions."""
    total: dict[str, list[int]] = {}
    for cell in group:
        for phase, steps in cell.chosen.items():
            have = total.setdefault(phase, [0] * len(steps))
            for depth, n in enumerate(steps):
                have[depth] += n
    return total or None


def _matches(group: list[Cell]) -> str | None:
    checked = [c for c in group if c.matches_uncapped is not None]
    if not checked:
        return None
    return f"{sum(c.matches_uncapped or 0 for c in checked)}/{sum(c.requests for c in checked)}"


def cost_curve(
    steps: Sequence[Sequence[Any]], by_policy: bool = False, by_requests: bool = False
) -> list[dict[str, Any]]:
    """Mean step time by tokens verified per step, per concurrency (and policy, and requests in the step).

    ``steps``: (concurrency, requests in step, tokens verified, drafts, seconds, policy name).
    By policy, one policy's steps can be set against another's of the same shape: whether a
    policy loses in its steps' time or in the shapes it runs. By requests too, the steps with every
    slot busy can be told from a cell's drain (load/adaptive_report.py ``mix_table``).
    """
    groups: dict[tuple[int, str, int, int], list[float]] = defaultdict(list)
    for conc, requests, tokens, _, seconds, policy in steps:
        groups[(conc, policy if by_policy else "", requests if by_requests else 0, tokens)].append(seconds)
    return [
        {
            "concurrency": conc,
            **({"policy": policy} if by_policy else {}),
            **({"requests": requests} if by_requests else {}),
            "tokens_per_step": tokens,
            "steps": len(times),
            "mean_ms": round(1000 * statistics.fmean(times), 3),
            "p50_ms": round(1000 * statistics.median(times), 3),
        }
        for (conc, policy, requests, tokens), times in sorted(groups.items())
    ]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_chart(path: Path, rows: list[dict[str, Any]], curve: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    concurrencies = sorted({r["concurrency"] for r in rows})
    fig, axes = plt.subplots(1, len(concurrencies) + 1, figsize=(5 * (len(concurrencies) + 1), 5))
    for ax, conc in zip(axes, concurrencies, strict=False):
        here = [r for r in rows if r["concurrency"] == conc]
        colors = [
            "tab:green"
            if r["policy"] == "adaptive"
            else "tab:gray"
            if r["policy"] == "none"
            else "tab:blue"
            if r["reasoning_depth"] == r["answer_depth"]
            else "tab:orange"
            for r in here
        ]
        ax.bar(
            [r["policy"] for r in here],
            [r["vs_none"] or 0 for r in here],
            color=colors,
            yerr=[(r["spread"] or 0) * (r["vs_none"] or 0) for r in here],
        )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"concurrency {conc}: throughput vs none")
        ax.tick_params(axis="x", rotation=90)
    ax = axes[-1]
    for conc in concurrencies:
        pts = [c for c in curve if c["concurrency"] == conc]
        ax.plot([p["tokens_per_step"] for p in pts], [p["mean_ms"] for p in pts], marker="o", label=f"c={conc}")
    ax.set_xlabel("tokens verified per step")
    ax.set_ylabel("mean step time (ms)")
    ax.set_title("cost curve")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
