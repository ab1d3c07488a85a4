"""The periodic per-phase summary: one log line per phase and Prometheus gauges.

In the spirit of vLLM's own ``SpecDecoding metrics`` line: every
``--adaptive.summary_interval_s`` the engine's controller state is read
(engine/controller.py) and, per phase, the acceptance by draft position, the
tokens per second, the distribution of depths over engine steps and the
estimated cost of one more verified draft are logged and exported; the line
also carries the phase estimate's measured worth in a request's own proposals
(``request_weight``, engine/acceptance.py WeightChooser).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from engine.llm import PhasespecLLM
from proxy.metrics import phase_metrics

log = structlog.get_logger("phasespec.summary")


def phase_lines(state: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
    """The per-phase summary fields from one controller snapshot (window of ``seconds``)."""
    cost = state.get("cost") or {}
    lines = []
    for phase, stats in sorted((state.get("phases") or {}).items()):
        steps = stats["steps_by_depth"]
        if not sum(steps):
            continue
        lines.append(
            {
                "phase": phase,
                "acceptance_by_position": stats["acceptance_by_position"],
                "tok_s": round(stats["tokens"] / seconds, 2) if seconds > 0 else None,
                "steps_by_depth": steps,
                "per_draft_ms": {batch: c["per_draft_ms"] for batch, c in cost.items()},
                "request_weight": {name: w["weight"] for name, w in stats["request_weight"].items()},
                "emulation": (state.get("emulation") or {}).get("step_ms"),
            }
        )
    return lines


def export(state: dict[str, Any], lines: list[dict[str, Any]]) -> None:
    metrics = phase_metrics()
    for line in lines:
        phase = line["phase"]
        for position, rate in enumerate(line["acceptance_by_position"], start=1):
            metrics.acceptance.labels(phase, str(position)).set(rate)
        if line["tok_s"] is not None:
            metrics.phase_rate.labels(phase).set(line["tok_s"])
        for depth, n in enumerate(line["steps_by_depth"]):
            if n:
                metrics.depth_steps.labels(phase, str(depth)).inc(n)
    for batch, cost in (state.get("cost") or {}).items():
        metrics.cost_per_draft.labels(batch).set(cost["per_draft_ms"])


async def run_summaries(engine: PhasespecLLM, interval_s: float) -> None:
    """Log and export a summary every ``interval_s`` until cancelled."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(interval_s)
        state = await engine.controller_state(reset_window=True)
        now = time.monotonic()
        lines = phase_lines(state, now - last)
        last = now
        export(state, lines)
        for line in lines:
            log.info("spec_summary", **line)
