"""Depth-policy benchmark: every policy, one engine, interleaved, repeated.

    .venv/bin/python -m load.bench_policies --concurrency 1,4,16 --reps 2

Runs the embedded default (or whatever PHASESPEC_* / --vllm-args configure)
in this process, so every policy meets the same engine and the same machine
drift: for each repetition and concurrency, the policies run one after the
other in a random order drawn afresh for every repetition (seeded). Each
request reasons for ``--reasoning-budget`` tokens (vLLM's thinking budget
forces ``</think>``) and then answers for ``--answer-tokens``: the reasoning
share of tokens is set by these two.
Writes ``policies.csv``, ``cost_curve.csv`` (all policies), ``cost_by_policy.csv``, ``cost_by_batch.csv``
(by policy and requests in the step), ``cells.csv`` and
``policies.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from load.adaptive_report import adaptive_targets, read_cells
from load.policy_report import Cell, Policy, add_phase, cost_curve, policy_grid, summarize, write_chart, write_csv
from load.workload import WORKLOADS, chat_prompt, workload_prompt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client concurrencies")
    parser.add_argument("--reps", type=int, default=2, help="repetitions of every cell")
    parser.add_argument(
        "--prompts", type=int, default=20, help="requests per cell (distinct prompts); at least the concurrency"
    )
    parser.add_argument(
        "--requests-per-slot",
        type=int,
        default=1,
        help="a cell sends max(--prompts, this x concurrency) requests: longer cells at high concurrency",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="copy",
        help="copy: every request repeats and explains a sentence; mixed: copy requests alternate with "
        "open questions (load/workload.py)",
    )
    parser.add_argument("--reasoning-budget", type=int, default=48, help="thinking tokens per request")
    parser.add_argument("--answer-tokens", type=int, default=16, help="answer tokens per request")
    parser.add_argument(
        "--policies",
        default="all",
        help="'all' (every map, then adaptive) or e.g. '0:0,1:2,adaptive,3:3=aa' (reasoning:answer; "
        "'=NAME' runs a static policy a second time under another name: the A/A control; "
        "'adaptive@R:A' the adaptive policy with caps R and A, named adaptive-R-A; 'adaptive=NAME' the "
        "adaptive policy a second time, named adaptive-NAME, under the controller settings --arm NAME gives)",
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="controller settings for the cells of 'adaptive=NAME' (set before each of its cells, the "
        "others' restored after it), e.g. 'noexp={\"explore_share\": 0}': two choosers' rules "
        "interleaved on one engine; the arms share what the controller has learned",
    )
    parser.add_argument(
        "--emulate",
        default=None,
        help="EMULATION, not this machine: pad decode steps to 'A+B*tokens' ms or a profile ('moe-offload')",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="adaptive cells per concurrency run (and discarded) before the first repetition, so that the "
        "comparison sees a controller that has learned this machine, as a long-running server's has",
    )
    parser.add_argument(
        "--controller",
        default="{}",
        help="JSON of controller settings for this run (engine/controller.py ControllerSettings), "
        "e.g. '{\"request_prior_weight\": 64}'",
    )
    parser.add_argument("--emulate-scale", type=float, default=1.0, help="multiplies the emulated step time")
    parser.add_argument(
        "--vllm-args",
        default="[]",
        help="JSON list of `vllm serve` flags, after the embedded defaults (a later flag wins): e.g. a "
        "--speculative-config with another drafter (docs/design.md, 'Adaptive depth')",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default load/results/<time>)")
    cfg = parser.parse_args(argv)
    cfg.arms = parse_arms(cfg.arm)
    parse_policies(cfg.policies, 1 << 20, cfg.arms)  # refused before the engine starts, not after
    return cfg


def parse_arms(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--arm NAME=JSON`` -> {NAME: settings}."""
    arms = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--arm {item}: expected NAME=JSON")
        try:
            settings = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--arm {item}: {exc}") from None
        if not isinstance(settings, dict):
            raise SystemExit(f"--arm {item}: the settings must be a JSON object")
        arms[name] = settings
    return arms


def parse_policies(text: str, max_depth: int, arms: dict[str, dict[str, Any]] | None = None) -> list[Policy]:
    adaptive = Policy(max_depth, max_depth, adaptive=True)
    if text == "all":
        return [*policy_grid(max_depth), adaptive]
    policies = []
    for item in text.split(","):
        if item == "adaptive":
            policies.append(adaptive)
            continue
        if item.startswith("adaptive="):
            arm = item.removeprefix("adaptive=")
            if arm not in (arms or {}):
                raise SystemExit(f"policy {item}: no --arm {arm}=JSON gives its controller settings")
            policies.append(replace(adaptive, twin=arm))
            continue
        capped = item.startswith("adaptive@")
        depths, _, twin = item.removeprefix("adaptive@").partition("=")
        reasoning, answer = (int(x) for x in depths.split(":"))
        if not (0 <= reasoning <= max_depth and 0 <= answer <= max_depth):
            raise SystemExit(f"policy {item}: depths must be in 0..{max_depth}")
        if capped and twin:
            raise SystemExit(f"policy {item}: an A/A twin is a static policy's")
        policies.append(Policy(reasoning, answer, adaptive=capped, twin=twin, capped=capped))
    return policies


async def run_cell(
    engine: Any,
    board: Any,
    policy: Policy,
    concurrency: int,
    rep: int,
    cfg: argparse.Namespace,
    prompts: list[tuple[str, dict[str, Any]]],
    end_len: int,
    reference: dict[int, list[int]] | None,
) -> tuple[Cell, list[list[Any]], list[list[int]]]:
    from vllm.sampling_params import SamplingParams

    from proxy.observer import XARG_DEPTH, XARG_POLICY, XARG_STATS

    max_tokens = cfg.reasoning_budget + end_len + cfg.answer_tokens
    gate = asyncio.Semaphore(concurrency)
    cell = Cell(policy, concurrency, rep, 0.0, 0, requests=len(prompts))
    outputs: list[list[int]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            min_tokens=max_tokens,
            thinking_token_budget=cfg.reasoning_budget,
            extra_args={
                XARG_DEPTH + "reasoning": policy.reasoning,
                XARG_DEPTH + "answer": policy.answer,
                # A tool call goes as the answer does (left out, it would run at the server's
                # tool-call depth, K, under every static policy, "none" included).
                XARG_DEPTH + "tool_call": policy.answer,
                XARG_POLICY: "adaptive" if policy.adaptive else "static",
                XARG_STATS: 1,
            },
        )
        rid = f"bench-{policy.name}-c{concurrency}-r{rep}-{i}"
        async with gate:
            # The chat template opened <think>: tell the observer, as vLLM's chat server does.
            async for output in engine.generate(prompts[i][1], params, rid, reasoning_ended=False):
                outputs[i] = list(output.outputs[0].token_ids)
        report = board.take(rid, has_usage=True, is_last=True) or {}
        cell.unended += not report.get("phases", {}).get("answer", {}).get("tokens")
        kind = cell.kinds.setdefault(prompts[i][0], {})
        for name, counters in report.get("phases", {}).items():
            add_phase(cell.phases.setdefault(name, {}), counters)
            add_phase(kind.setdefault(name, {}), counters)
        if policy.adaptive:
            keys = ("decisions", "decisions_total", "explored_steps")
            cell.decisions.append({"request": i, **{key: report.get(key) for key in keys}})

    arm = cfg.arms.get(policy.twin) if policy.adaptive and policy.twin else None
    restore = await engine.configure_controller(**arm) if arm else {}
    try:
        return await measure_cell(engine, policy, cell, one, prompts, outputs, reference)
    finally:
        if arm:
            await engine.configure_controller(**{key: restore[key] for key in arm})


async def measure_cell(
    engine: Any,
    policy: Policy,
    cell: Cell,
    one: Any,
    prompts: list[tuple[str, dict[str, Any]]],
    outputs: list[list[int]],
    reference: dict[int, list[int]] | None,
) -> tuple[Cell, list[list[Any]], list[list[int]]]:
    """Run a cell's requests (``one`` each) and read what the engine counted over them."""
    concurrency = cell.concurrency
    await engine.drain_step_log()
    await engine.controller_state(reset_window=True)
    probe_before = await engine.cpu_probe()
    hook_before = await engine.spec_hook_path()
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    cell.wall_s = time.perf_counter() - start
    hook_after = await engine.spec_hook_path()
    cell.probe_s = (probe_before + await engine.cpu_probe()) / 2
    hook_steps = cell.engine_steps = hook_after["hook_steps"] - hook_before["hook_steps"]
    if hook_steps:
        cell.hook_us_per_step = 1e6 * (hook_after["hook_cpu_s"] - hook_before["hook_cpu_s"]) / hook_steps
    cell.draft_steps, cell.draft_passes, cell.draft_passes_unverified = (
        hook_after[key] - hook_before[key] for key in ("draft_steps", "draft_passes", "draft_passes_unverified")
    )
    cell.schedule_s, cell.update_s, cell.process_cpu_s = (
        hook_after[key] - hook_before[key] for key in ("schedule_s", "update_s", "process_cpu_s")
    )
    cell.tokens = sum(len(o) for o in outputs)
    if reference is not None:
        cell.matches_uncapped = sum(outputs[i] == reference.get(i) for i in range(len(prompts)))
        for i, output in enumerate(outputs):
            ref = reference.get(i) or []
            if output != ref:
                first = next((j for j, (a, b) in enumerate(zip(output, ref, strict=False)) if a != b), len(ref))
                log(f"  {policy.name} prompt {i}: differs from the uncapped output at token {first}")
    if cell.unended:
        log(f"  {policy.name} c={concurrency}: {cell.unended} of {len(prompts)} requests never ended their reasoning")
    if policy.adaptive:
        window = (await engine.controller_state(reset_window=True))["phases"]
        cell.chosen = {name: stats["steps_by_depth"] for name, stats in window.items() if sum(stats["steps_by_depth"])}
    steps = [[concurrency, *step, policy.name] for step in await engine.drain_step_log()]
    cell.timed_steps, cell.timed_s = len(steps), sum(step[4] for step in steps)
    return cell, steps, outputs


async def main_async(cfg: argparse.Namespace) -> Path:
    from config import Settings
    from engine.args import apply_environment, build_vllm_namespace, hook_options, request_defaults
    from engine.runtime import open_engine
    from proxy.app import attach_observers
    from proxy.observer import StatsBoard

    settings = Settings()
    settings.vllm_args = [*settings.vllm_args, *json.loads(cfg.vllm_args)]
    if cfg.emulate:
        settings.engine.emulate_step_ms = cfg.emulate
        settings.engine.emulate_scale = cfg.emulate_scale
    apply_environment(settings)
    args = build_vllm_namespace(settings)
    out = cfg.out or Path("load/results") / time.strftime("policies-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    board = StatsBoard(cap=100_000)
    cells: list[Cell] = []
    steps: list[list[Any]] = []
    emulation, state = None, {}
    async with open_engine(args, request_defaults(settings), hook_options(settings)) as engine:
        attach_observers(engine, args, settings, board)
        if json.loads(cfg.controller):
            await engine.configure_controller(**json.loads(cfg.controller))
        k = engine.max_spec_depth
        policies = parse_policies(cfg.policies, k, cfg.arms)
        reasoning = engine.vllm_config.reasoning_config
        end_len = len(reasoning.reasoning_end_token_ids or ()) if reasoning is not None else 0
        concurrencies = [int(c) for c in cfg.concurrency.split(",")]

        # A cell sends max(--prompts, requests-per-slot x concurrency) requests: every slot is used.
        def requests(conc: int) -> int:
            return int(max(cfg.prompts, cfg.requests_per_slot * conc))

        prompts = []
        for i in range(max(requests(c) for c in concurrencies)):
            kind, text = workload_prompt(cfg.workload, i)
            prompts.append((kind, chat_prompt(engine, text)))
        # Greedy reference: the uncapped engine (depth K everywhere), concurrency 1.
        ref_cell, _, ref_outputs = await run_cell(
            engine, board, Policy(k, k), 1, -1, cfg, prompts[: cfg.prompts], end_len, None
        )
        reference = dict(enumerate(ref_outputs))
        log(f"reference run: {ref_cell.tok_s:.1f} tok/s; {len(policies)} policies x {concurrencies} x {cfg.reps} reps")
        adaptive = [p for p in policies if p.adaptive]
        for _, conc, policy in itertools.product(range(cfg.warmup), concurrencies, adaptive):
            warm, _, _ = await run_cell(engine, board, policy, conc, -1, cfg, prompts[: requests(conc)], end_len, None)
            log(f"warm-up c={conc:<3} {policy.name:<9} {warm.tok_s:7.1f} tok/s (discarded)")
        await engine.drain_step_log()
        for rep, conc in itertools.product(range(cfg.reps), concurrencies):
            # A fresh order per repetition (seeded: reproducible). A rotation kept each
            # policy's neighbours, and on a drifting machine neighbours share their speed:
            # in run H adaptive / the policy before it was 1.007, against 5-10% four cells apart.
            order = random.Random(f"{rep}-{conc}").sample(policies, len(policies))
            for policy in order:
                cell, cell_steps, _ = await run_cell(
                    engine,
                    board,
                    policy,
                    conc,
                    rep,
                    cfg,
                    prompts[: requests(conc)],
                    end_len,
                    reference if conc == 1 else None,
                )
                cells.append(cell)
                steps.extend(cell_steps)
                log(f"rep {rep} c={conc:<3} {policy.name:<9} {cell.tok_s:7.1f} tok/s {cell.chosen or ''}")
            write_tables(out, cells, steps, await engine.controller_state())
        state = await engine.controller_state()
        emulation = state.get("emulation")
    rows, curve = write_tables(out, cells, steps, state)
    (out / "config.json").write_text(json.dumps({**vars(cfg), "out": str(out), "max_depth": k}, indent=2, default=str))
    write_chart(out / "policies.png", rows, curve)
    if emulation:
        log(f"EMULATED step cost {emulation['step_ms']} ms: {emulation['overrun_share']:.2%} of steps overran it")
    print_summary(rows)
    if cfg.workload != "copy":
        print_kinds(cells)
    if any(p.adaptive for p in policies):
        print("\n".join(adaptive_targets(read_cells([out]))))
    log(f"wrote {out}")
    return out


def write_tables(
    out: Path, cells: list[Cell], steps: list[list[Any]], state: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cells so far, their steps and decisions, and the controller's state (after every
    repetition's concurrency as well as at the end: a machine lost mid-run keeps what ran)."""
    rows = summarize(cells)
    curve = cost_curve(steps)
    write_csv(out / "policies.csv", rows)
    write_csv(out / "cost_curve.csv", curve)
    write_csv(out / "cost_by_policy.csv", cost_curve(steps, by_policy=True))
    write_csv(out / "cost_by_batch.csv", cost_curve(steps, by_policy=True, by_requests=True))
    write_csv(
        out / "cells.csv",
        [
            {
                "concurrency": c.concurrency,
                "policy": c.policy.name,
                "rep": c.rep,
                "tok_s": round(c.tok_s, 2),
                "wall_s": round(c.wall_s, 3),
                "tokens": c.tokens,
                "unended": c.unended,
                "hook_us_per_step": None if c.hook_us_per_step is None else round(c.hook_us_per_step, 1),
                "engine_steps": c.engine_steps,
                "ms_per_engine_step": round(1e3 * c.wall_s / c.engine_steps, 3) if c.engine_steps else None,
                "tokens_per_engine_step": round(c.tokens / c.engine_steps, 3) if c.engine_steps else None,
                "timed_steps": c.timed_steps,
                "timed_ms_per_step": round(1e3 * c.timed_s / c.timed_steps, 3) if c.timed_steps else None,
                "timed_share_of_wall": round(c.timed_s / c.wall_s, 3) if c.wall_s > 0 else None,
                "draft_passes_per_step": round(c.draft_passes / c.draft_steps, 3) if c.draft_steps else None,
                "unverified_passes_per_step": (
                    round(c.draft_passes_unverified / c.draft_steps, 3) if c.draft_steps else None
                ),
                "schedule_us_per_step": round(1e6 * c.schedule_s / c.engine_steps, 1) if c.engine_steps else None,
                "update_us_per_step": round(1e6 * c.update_s / c.engine_steps, 1) if c.engine_steps else None,
                "cpu_probe_ms": round(1e3 * c.probe_s, 3),
                "process_cpu_share": round(c.process_cpu_s / c.wall_s, 3) if c.wall_s > 0 else None,
                "phases": json.dumps(c.phases),
                "chosen": json.dumps(c.chosen),
                "kinds": json.dumps(c.kinds),
            }
            for c in cells
        ],
    )
    with (out / "decisions.jsonl").open("w") as f:  # what each adaptive request decided, and why
        for c in cells:
            for entry in c.decisions:
                f.write(json.dumps({"concurrency": c.concurrency, "rep": c.rep, **entry}) + "\n")
    (out / "controller.json").write_text(json.dumps(state, indent=2))
    return rows, curve


SUMMARY_COLUMNS = [
    ("concurrency", "conc", 4),
    ("policy", "policy", 9),
    ("tok_s", "tok/s", 7),
    ("spread", "spread", 6),
    ("vs_none", "vs none", 7),
    ("vs_best_fixed_here", "vs best fixed here", 18),
    ("vs_best_fixed_overall", "vs best fixed all", 17),
    ("vs_best_static_here", "vs best static here", 19),
    ("vs_user_map", "vs map-1-2", 10),
    ("vs_twin", "A/A", 6),
    ("reasoning_acceptance", "acc R", 6),
    ("answer_acceptance", "acc A", 6),
    ("outputs_match_uncapped", "match", 6),
]


def print_summary(rows: list[dict[str, Any]]) -> None:
    print(" ".join(f"{title:>{width}}" for _, title, width in SUMMARY_COLUMNS))
    for row in rows:
        print(" ".join(f"{'-' if row[key] is None else row[key]!s:>{width}}" for key, _, width in SUMMARY_COLUMNS))


def print_kinds(cells: list[Cell]) -> None:
    """Acceptance (accepted / drafted) per kind of request and phase, summed over each policy's cells."""
    totals: dict[tuple[int, str, str, str], list[int]] = {}
    for c in cells:
        for kind, phases in c.kinds.items():
            for phase, counters in phases.items():
                into = totals.setdefault((c.concurrency, c.policy.name, kind, phase), [0, 0])
                into[0] += counters.get("num_accepted_tokens", 0)
                into[1] += counters.get("num_draft_tokens", 0)
    print("conc policy kind phase acceptance (accepted/drafted)")
    for (conc, policy, kind, phase), (accepted, drafted) in sorted(totals.items()):
        if drafted:
            print(f"{conc} {policy} {kind} {phase} {accepted / drafted:.3f} ({accepted}/{drafted})")


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    from proxy.logs import configure_logging

    configure_logging("warning", json_output=True)
    logging.getLogger("phasespec").setLevel(logging.WARNING)
    asyncio.run(main_async(cfg))


if __name__ == "__main__":
    main()
