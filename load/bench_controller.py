"""What the adaptive controller costs per engine step, at a given batch size.

    .venv/bin/python -m load.bench_controller --batch 64 --steps 2000
    .venv/bin/python -m load.bench_controller --batch 64 --step-depth    # one depth per step (model drafters)
    .venv/bin/python -m load.bench_controller --batch 64 --static 1      # static depth 1: the baseline

Runs the hook's per-step pure work outside the engine, on synthetic drafts:
``DepthController.plan`` for the batch, then per request what
``update_from_output`` does (a proposal booked, vLLM's accepted count noted,
the proposal matched against the new tokens, the estimates updated). Prints
the mean and p99 time per step; compare with the engine's step time at that
batch size (the policy benchmark's cost curve).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from engine.acceptance import ShadowBook
from engine.controller import ControllerSettings, DepthController
from engine.spec_stats import RequestLedger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--step-depth", action="store_true", help="the adaptive policy's one depth per step")
    parser.add_argument("--static", type=int, default=None, metavar="DEPTH", help="static requests at DEPTH")
    cfg = parser.parse_args()
    rng = random.Random(0)
    k = cfg.k
    ctrl = DepthController(k, ControllerSettings(seed=1, step_depth=cfg.step_depth))
    ids = [f"req-{i}" for i in range(cfg.batch)]
    phases = {rid: rng.choice(("reasoning", "answer")) for rid in ids}
    requests = {rid: RequestLedger(rid, k, phases[rid], k, engine_id=rid) for rid in ids}
    for r in requests.values():
        r.set_mode(k if cfg.static is None else cfg.static, adaptive=cfg.static is None)
    books = {rid: ShadowBook() for rid in ids}
    outputs: dict[str, list[int]] = {rid: [] for rid in ids}
    timings = []
    for step in range(cfg.steps):
        # The synthetic drafts and outcomes are drawn before the clock starts.
        drafts = {rid: [rng.randrange(100) for _ in range(k)] for rid in ids}
        runs = {rid: sum(1 for _ in range(k) if rng.random() < 0.6) for rid in ids}
        bonus = {rid: 100 + rng.randrange(100) for rid in ids}
        t0 = time.perf_counter()
        for rid in ids:
            requests[rid].proposed = len(drafts[rid])
        plan = ctrl.plan(list(requests.values()))
        for rid in ids:
            depth = plan.depths.get(rid, requests[rid].verified_depth)
            out = outputs[rid]
            books[rid].propose(len(out), drafts[rid], k, depth, phases[rid])
            accepted = min(runs[rid], depth)
            books[rid].verified(accepted)
            out.extend([*drafts[rid][:accepted], bonus[rid]])
            for resolved in books[rid].feed(out):
                ctrl.observe(requests[rid], resolved)
            ctrl.count(phases[rid], depth, accepted + 1)
        ctrl.step_done(cfg.batch, sum(plan.depths.values()), 0.2 + 0.001 * sum(plan.depths.values()), plan)
        timings.append(time.perf_counter() - t0)
        if step % 200 == 0:  # keep outputs short, as requests finish and new ones arrive
            outputs = {rid: [] for rid in ids}
            books = {rid: ShadowBook() for rid in ids}
    timings.sort()
    mean_ms = statistics.fmean(timings) * 1e3
    p99_ms = timings[int(0.99 * len(timings))] * 1e3
    policy = f"static {cfg.static}" if cfg.static is not None else "step depth" if cfg.step_depth else "adaptive"
    what = f"{policy}: controller + shadow bookkeeping per step"
    print(f"batch {cfg.batch}, K={k}: {what}: mean {mean_ms:.3f} ms, p99 {p99_ms:.3f} ms")


if __name__ == "__main__":
    main()
