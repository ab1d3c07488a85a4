"""Sampling fidelity at a size ``make test`` cannot afford: arms of seeded temperature-1 samples
under different depth policies, each compared with the depth-0 arm (total-variation distance,
permutation p-value; load/distribution.py). The test version: tests/test_sampling_fidelity.py.

    .venv/bin/python -m load.bench_fidelity --samples 1600 --out load/results/fidelity
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from engine.default_model import MODEL_NAME
from load.distribution import permutation_p_value, tv_distance
from load.server import ServerProcess

PROMPT = "red apple, green car, red apple, green car, red apple, green car, red apple, green"
"""Raw completion text the ngram drafter matches from the first generated token on."""
PER_REQUEST = 8
ARMS: dict[str, list[dict[str, Any]]] = {
    "depth 0": [{"depths": {"answer": 0}}],
    "depth 0 (A/A)": [{"depths": {"answer": 0}}],
    "depth 1": [{"depths": {"answer": 1}}],
    "depth 3": [{"depths": {"answer": 3}}],
    # Requests at depth 1 and 3 in turn, four at a time: batches whose requests verify different
    # numbers of drafts, as adaptive's do, without the controller.
    "depths 1 and 3": [{"depths": {"answer": 1}}, {"depths": {"answer": 3}}],
    "adaptive": [{"policy": "adaptive"}],
}


def sample_arm(
    base_url: str,
    samples: int,
    first_seed: int,
    specs: Sequence[dict[str, Any] | None],
    tokens: int,
    model: str = MODEL_NAME,
) -> list[str]:
    """``samples`` seeded samples of ``PROMPT``, request i under ``specs[i % len(specs)]`` (None: the
    server's own policy), ``PER_REQUEST`` per request (vLLM seeds them seed, seed + 1, ...)."""

    def some(i: int) -> list[str]:
        body: dict[str, Any] = {
            "model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 1.0, "n": PER_REQUEST,
            "seed": first_seed + PER_REQUEST * i,
        }  # fmt: skip
        spec = specs[i % len(specs)]
        if spec is not None:
            body["phasespec"] = spec
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        response.raise_for_status()
        return [str(choice["text"]) for choice in response.json()["choices"]]

    with ThreadPoolExecutor(4) as pool:
        return [text for texts in pool.map(some, range(samples // PER_REQUEST)) for text in texts]


def pooled(a: list[str], b: list[str], min_count: int) -> tuple[list[str], list[str]]:
    counts = Counter([*a, *b])
    keep = lambda text: text if counts[text] >= min_count else "<rare>"  # noqa: E731
    return [keep(t) for t in a], [keep(t) for t in b]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1600, help="samples per arm")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--min-count", type=int, default=10, help="rarer outputs are pooled")
    parser.add_argument("--host", help="a running phasespec server (default: start one on the embedded model)")
    parser.add_argument("--out", type=Path, default=Path("load/results/fidelity"))
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms (depth 0 always runs)")
    args = parser.parse_args(argv)
    chosen = {name: ARMS[name] for name in ARMS if name == "depth 0" or name in args.arms.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    server = None if args.host else ServerProcess(log_path=args.out / "server.log")
    if server is not None:
        server.start()
    base_url = args.host or server.base_url  # type: ignore[union-attr]
    try:
        arms = {
            name: sample_arm(base_url, args.samples, 1_000_000 * (k + 1), spec, args.tokens)
            for k, (name, spec) in enumerate(chosen.items())
        }
    finally:
        if server is not None:
            server.stop()
    rows = []
    for name, texts in arms.items():
        if name == "depth 0":
            continue
        a, b = pooled(arms["depth 0"], texts, args.min_count)
        row = {"arm": name, "tv": round(tv_distance(a, b), 4), "p": round(permutation_p_value(a, b), 4),
               "outcomes": len(set(a) | set(b)), "samples": len(texts)}  # fmt: skip
        rows.append(row)
        print(f"{name:>14} vs depth 0: TV {row['tv']:.4f}  p {row['p']:.4f}  ({row['outcomes']} outcomes)")
    report = {"args": {**vars(args), "out": str(args.out)}, "rows": rows}
    (args.out / "fidelity.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
