"""phasespec's overhead against plain vLLM: the same Locust scenario, servers alternating.

    .venv/bin/python -m load.bench_overhead --users 1,16 --seconds 30 --rounds 2

Three servers on the embedded default with the same engine flags: vLLM's own
(``python -m vllm.entrypoints.openai.api_server``), phasespec with phase
switching off (every request at K, like vLLM) and phasespec with it on. Each
round starts each server in turn (rotated order) and runs every user count
against it; requests carry an explicit thinking budget and min_tokens, so all
servers generate the same tokens. Reports ratios against vLLM of TTFT p50,
mean inter-token gap and request throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from load.run_load import parse_args as load_args
from load.run_load import run as run_load
from load.server import ROOT, ServerProcess


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", default="1,16")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--thinking-budget", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def servers(phasespec_flags: Sequence[str] = ()) -> dict[str, tuple[list[str], bool]]:
    """Flags per server: plain vLLM gets the engine flags phasespec builds from the same settings
    (the embedded model, its drafter, ``PHASESPEC_VLLM_ARGS``), so both run one engine;
    ``phasespec_flags`` go to both phasespec servers."""
    from config import Settings
    from engine.args import engine_argv

    settings = Settings()
    return {
        "vllm": (engine_argv(settings), True),
        "phasespec-off": (["--phases.policy", "off", *phasespec_flags], False),
        "phasespec-on": (list(phasespec_flags), False),
    }


def rotated_servers(
    names: list[str], rounds: int, out: Path, phasespec_flags: Sequence[str] = ()
) -> Iterator[tuple[int, str, ServerProcess]]:
    """Each round, each named server started in turn (order rotated by round), stopped after use."""
    flags_of = servers(phasespec_flags)  # once: it builds the embedded model (and its drafter) if missing
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            flags, is_vllm = flags_of[name]
            server = ServerProcess(*flags, log_path=out / f"{name}-r{round_}.log", vllm_server=is_vllm)
            server.start()
            try:
                yield round_, name, server
            finally:
                server.stop()


def side_by_side_servers(
    names: list[str], rounds: int, out: Path, phasespec_flags: Sequence[str] = ()
) -> Iterator[tuple[int, str, ServerProcess]]:
    """Every named server started once (one after another: engines profile memory at start) and kept
    up; each round visits them in rotated order. Saves a start per server and round (80-140 s on
    the H200), and no server is the one started first in some rounds only."""
    flags_of = servers(phasespec_flags)
    started: dict[str, ServerProcess] = {}
    try:
        for name in names:
            flags, is_vllm = flags_of[name]
            started[name] = ServerProcess(*flags, log_path=out / f"{name}.log", vllm_server=is_vllm)
            started[name].start()
        for round_ in range(rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                yield round_, name, started[name]
    finally:
        for server in started.values():
            server.stop()


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    out = cfg.out or ROOT / "load" / "results" / time.strftime("overhead-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PHASESPEC_LOAD_STATS"] = "0"
    os.environ["PHASESPEC_LOAD_THINKING_BUDGET"] = str(cfg.thinking_budget)
    users = [int(u) for u in cfg.users.split(",")]
    runs: list[dict[str, Any]] = []
    for round_, name, server in rotated_servers(list(servers()), cfg.rounds, out):
        for n in users:
            summary = run_load(
                load_args(
                    [
                        "--host",
                        server.base_url,
                        "--users",
                        str(n),
                        "--seconds",
                        str(cfg.seconds),
                        "--max-tokens",
                        str(cfg.max_tokens),
                        "--out",
                        str(out / f"{name}-u{n}-r{round_}"),
                    ]
                )
            )
            metrics = summary["metrics"]
            runs.append(
                {
                    "server": name,
                    "users": n,
                    "round": round_,
                    "requests": summary["requests"],
                    "failures": summary["failures"],
                    "req_s": summary["requests_per_s"],
                    "ttft_p50_ms": metrics.get("ttft", {}).get("p50_ms"),
                    "gap_mean_ms": metrics.get("inter_token_gap_mean", {}).get("mean_ms"),
                }
            )
            print(f"[overhead] round {round_} {name:<14} users {n:<3} {runs[-1]}", flush=True)
    report = ratios(runs)
    (out / "overhead.json").write_text(
        json.dumps({"runs": runs, "ratios": report, "config": vars(cfg)}, indent=2, default=str)
    )
    for row in report:
        print(row)


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over rounds per (server, users), and each phasespec variant / vLLM."""

    def mean(server: str, users: int, key: str) -> float:
        return statistics.fmean(r[key] for r in runs if r["server"] == server and r["users"] == users)

    rows = []
    for users in sorted({r["users"] for r in runs}):
        for server in ("phasespec-off", "phasespec-on"):
            row: dict[str, Any] = {"users": users, "server": server}
            for key in ("ttft_p50_ms", "gap_mean_ms", "req_s"):
                row[f"{key}_ratio"] = round(mean(server, users, key) / mean("vllm", users, key), 3)
                row[f"{key}_vllm"] = round(mean("vllm", users, key), 2)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
