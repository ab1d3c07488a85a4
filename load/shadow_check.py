"""Shadow drafts against verification, like with like, on a large sample.

    .venv/bin/python -m load.shadow_check --requests 400 --max-tokens 128

Every engine step draws each request's depth at random, 1 or K (and the
drafter proposes K on every step), so steps verified at depth 1 and at depth K
start at the same kind of places. For positions 2..K the depth-1 steps only
have shadow drafts (cut drafts matched against the tokens that followed);
the depth-K steps verified them. The two acceptance curves must agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math


async def main_async(cfg: argparse.Namespace) -> None:
    from tests.engine_fixture import engine_context, probe_shadow_acceptance

    async with engine_context() as engine:
        k = engine.max_spec_depth
        by_depth = await probe_shadow_acceptance(engine, cfg.requests, cfg.max_tokens)
    shallow, deep = by_depth["1"], by_depth[str(k)]
    print(json.dumps(by_depth, indent=1))
    print("position  shadow@1  verified@K  diff   2*se")
    for j, (a, b) in enumerate(zip(shallow["acceptance_by_position"], deep["acceptance_by_position"], strict=True)):
        se = math.sqrt(a * (1 - a) / shallow["steps"] + b * (1 - b) / deep["steps"])
        print(f"{j + 1:>8}  {a:8.4f}  {b:10.4f}  {a - b:+.4f} {2 * se:.4f}")
    print(f"steps: depth 1 {shallow['steps']}, depth {k} {deep['steps']} (steps with a proposal)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=128)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
