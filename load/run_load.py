"""Headless Locust run: start the server (or use --host), load it, summarize on one screen.

    .venv/bin/python -m load.run_load --users 8 --seconds 300          # soak on the embedded default
    .venv/bin/python -m load.run_load --users 8 --seconds 20 --server-flag=--server.max_inflight --server-flag=2

Writes Locust's CSVs, the server's resident-memory samples and summary.json
into --out; exits non-zero if any request failed with a 5xx or the engine
still holds requests afterwards.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from load.server import ROOT, ServerProcess

LOCUSTFILE = ROOT / "load" / "locustfile.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument(
        "--spawn-rate", type=float, default=None, help="users started per second (default: all at once)"
    )
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--host", default=None, help="an already running server; default: start one")
    parser.add_argument("--server-flag", action="append", default=[], help="flag for the started server (repeatable)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


class MemorySampler(threading.Thread):
    """Resident memory of the server and its children (the engine core), every few seconds."""

    def __init__(self, pid: int, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                return
            self.samples.append((round(time.monotonic() - start, 1), round(rss / 2**20, 1)))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()


def read_stats(prefix: Path) -> list[dict[str, str]]:
    path = Path(f"{prefix}_stats.csv")
    return list(csv.DictReader(path.open())) if path.exists() else []


def read_failures(prefix: Path) -> list[dict[str, str]]:
    path = Path(f"{prefix}_failures.csv")
    return list(csv.DictReader(path.open())) if path.exists() else []


def summarize(
    stats: list[dict[str, str]],
    failures: list[dict[str, str]],
    state: dict[str, Any],
    memory: list[tuple[float, float]],
) -> dict[str, Any]:
    rows = {f"{r['Type']} {r['Name']}": r for r in stats}
    chat = rows.get("POST chat (stream)", {})
    server_errors = sum(int(f["Occurrences"]) for f in failures if "HTTP 5" in f.get("Error", ""))
    metrics = {
        name.removeprefix("METRIC "): {
            "count": int(r["Request Count"]),
            "p50_ms": float(r["50%"]),
            "p95_ms": float(r["95%"]),
            "mean_ms": round(float(r["Average Response Time"]), 1),
            "mean_length": round(float(r["Average Content Size"]), 1),
        }
        for name, r in rows.items()
        if name.startswith("METRIC ")
    }
    engine = state.get("engine")
    warm = [rss for t, rss in memory if t >= 30] or [rss for _, rss in memory]
    return {
        "requests": int(chat.get("Request Count", 0)),
        "failures": int(chat.get("Failure Count", 0)),
        "rejected_429": metrics.get("rejected_429", {}).get("count", 0),
        "server_errors_5xx": server_errors,
        "requests_per_s": float(chat.get("Requests/s", 0) or 0),
        "metrics": metrics,
        "engine_after": engine,
        "leaked_requests": None
        if engine is None
        else int(engine.get("running", 0)) + int(engine.get("waiting", 0)) + int(engine.get("live", 0)),
        "rss_mib_after_warmup": {"first": warm[0], "last": warm[-1], "max": max(warm)} if warm else None,
    }


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"requests {summary['requests']}  failures {summary['failures']}  429s {summary['rejected_429']}  "
        f"5xx {summary['server_errors_5xx']}  {summary['requests_per_s']:.2f} req/s  "
        f"leaked {summary['leaked_requests']}"
    )
    for name, m in summary["metrics"].items():
        print(
            f"  {name:<28} n={m['count']:<5} p50={m['p50_ms']:>8.0f}ms p95={m['p95_ms']:>8.0f}ms "
            f"mean={m['mean_ms']:>8.1f}ms len={m['mean_length']}"
        )
    if summary["rss_mib_after_warmup"]:
        print(f"  server RSS after warm-up (MiB): {summary['rss_mib_after_warmup']}")


def wait_idle(host: str, headers: dict[str, str], timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = httpx.get(f"{host}/phasespec/state", headers=headers, timeout=10)
        if response.status_code != 200:
            return {}  # not a phasespec server (e.g. plain vLLM): state unknown
        state = response.json()
        engine = state["engine"]
        if not (engine["running"] or engine["waiting"] or engine["live"] or state["frontend_unfinished"]):
            break
        time.sleep(0.5)
    return state


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    out = cfg.out or ROOT / "load" / "results" / time.strftime("load-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    server = None
    if cfg.host is None:
        server = ServerProcess(*cfg.server_flag, log_path=out / "server.log")
        server.start()
    host = cfg.host or (server.base_url if server else "")
    sampler = MemorySampler(server.proc.pid) if server and server.proc else None
    if sampler:
        sampler.start()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    prefix = out / "locust"
    try:
        cmd = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--only-summary",
            "-u",
            str(cfg.users),
            "-r",
            str(cfg.spawn_rate or cfg.users),
            "-t",
            f"{cfg.seconds}s",
            "--host",
            host,
            "--csv",
            str(prefix),
            "--stop-timeout",
            "60",
            "--exit-code-on-error",
            "0",
        ]
        env = {"PHASESPEC_LOAD_API_KEY": cfg.api_key, "PHASESPEC_LOAD_MAX_TOKENS": str(cfg.max_tokens)}
        subprocess.run(
            cmd,
            cwd=ROOT,
            env={**os.environ, **env},
            check=True,
            stdout=(out / "locust.log").open("w"),
            stderr=subprocess.STDOUT,
            timeout=cfg.seconds + 300,
        )
        state = wait_idle(host, headers)
    finally:
        if sampler:
            sampler.stop()
        if server:
            server.stop()
    summary = summarize(read_stats(prefix), read_failures(prefix), state, sampler.samples if sampler else [])
    summary["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()}
    if sampler:
        summary["rss_samples_mib"] = sampler.samples
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    print(f"wrote {out}")
    return summary


def main(argv: list[str] | None = None) -> None:
    summary = run(parse_args(argv))
    if summary["server_errors_5xx"] or summary["leaked_requests"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
