"""An in-process PhasespecLLM on the embedded model, for the depth-hook tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from vllm.sampling_params import SamplingParams

from config import Settings
from engine.args import apply_environment, build_vllm_namespace, hook_options, request_defaults
from engine.compat import find_vllm, structured_output_follows_reasoning
from engine.llm import PhasespecLLM, SpecRequest
from engine.runtime import open_engine
from load.workload import chat_prompt

GRAMMAR_AFTER_REASONING_ESCAPES = pytest.mark.xfail(
    not structured_output_follows_reasoning(find_vllm().version),
    reason="vLLM before 0.26 (PR #44297) samples drafts after </think> and the bonus token after a rejected "
    "draft without the grammar: the named call's JSON stays open until max_tokens, plain vLLM 0.23.0 too at K=1 "
    "and K=3 (load/structured_probe.py, H200, docs/vllm.md), and what it says depends on the drafts verified, so "
    "switching depth changes it; 0.26.0 and 0.27.1-0.32.0 close it",
    strict=False,
)


def engine_context(settings: Settings | None = None) -> Any:
    settings = settings if settings is not None else Settings()
    apply_environment(settings)
    return open_engine(build_vllm_namespace(settings), request_defaults(settings), hook_options(settings))


@dataclass(slots=True)
class Run:
    token_ids: list[int] = field(default_factory=list)
    spec: SpecRequest = field(default_factory=SpecRequest)


async def run(
    engine: PhasespecLLM,
    text: str,
    request_id: str,
    spec: SpecRequest,
    max_tokens: int = 48,
    thinking_budget: int = 24,
    on_tokens: Callable[[int], Any] | None = None,
) -> Run:
    """Greedy generation; ``on_tokens(n)`` is awaited after each output with n tokens so far."""
    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        thinking_token_budget=thinking_budget,
        min_tokens=min(max_tokens, thinking_budget + 12),
    )
    result = Run(spec=spec)
    async for output in engine.generate(chat_prompt(engine, text), params, request_id, spec=spec):
        result.token_ids = list(output.outputs[0].token_ids)
        if on_tokens is not None:
            awaited = on_tokens(len(result.token_ids))
            if asyncio.iscoroutine(awaited):
                await awaited
    return result


async def probe_shadow_acceptance(engine: PhasespecLLM, requests: int, max_tokens: int) -> dict[str, Any]:
    """Run ``requests`` copy prompts at once with every step at depth 1 or K drawn at random
    (the drafter proposing K); return the controller's acceptance by depth verified."""
    from load.workload import copy_prompt

    k = engine.max_spec_depth
    old = await engine.configure_controller(
        explore_share=1.0, settled_explore_share=1.0, explore_depths=[1, k], warmup_steps=0
    )
    await engine.controller_state(reset_window=True)
    try:
        await asyncio.gather(
            *(
                # No thinking budget in reach: no depth hold (engine/hook.py).
                run(engine, copy_prompt(i), f"probe-{i}", SpecRequest(depth=k, adaptive=True), max_tokens, 10_000)
                for i in range(requests)
            )
        )
        by_depth: dict[str, Any] = (await engine.controller_state(reset_window=True))["by_verified_depth"]
    finally:
        await engine.configure_controller(**old)
    return by_depth


def max_drafted(final: dict[str, Any]) -> int:
    """The largest number of drafts any verify step of the request checked."""
    largest = 0
    for counters in final["phases"].values():
        for n_drafts, steps in enumerate(counters["steps_by_drafted"]):
            if steps:
                largest = max(largest, n_drafts)
    return largest


def total(final: dict[str, Any], key: str) -> int:
    return sum(int(c[key]) for c in final["phases"].values())


SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
"""vLLM's Prometheus totals of drafted and accepted tokens (this process's registry)."""


def spec_counters() -> list[float]:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    values = [0.0] * len(SPEC_COUNTERS)
    for metric in get_prometheus_registry().collect():
        for sample in metric.samples:
            if sample.name in SPEC_COUNTERS:
                values[SPEC_COUNTERS.index(sample.name)] += sample.value
    return values


async def spec_counter_growth(before: list[float], expected: list[int]) -> list[float]:
    """How much vLLM's counters grew since ``before``, once they reach ``expected`` (vLLM records
    a step's stats just after handing out its outputs) or after 5 s."""
    for _ in range(50):
        deltas = [now - then for now, then in zip(spec_counters(), before, strict=True)]
        if deltas == expected:
            break
        await asyncio.sleep(0.1)
    return deltas


async def counted_and_vllm_growth(
    engine: PhasespecLLM, requests: int, prefix: str, max_tokens: int = 48, thinking_budget: int = 24
) -> tuple[list[int], list[float]]:
    """Run ``requests`` copy prompts at once at depths 0..K in turn; return their summed per-request
    (drafted, accepted) and how much vLLM's Prometheus counters grew meanwhile."""
    from load.workload import copy_prompt

    before = spec_counters()
    runs = await asyncio.gather(
        *(
            run(engine, copy_prompt(i), f"{prefix}-{i}", SpecRequest(depth=i % (engine.max_spec_depth + 1)),
                max_tokens, thinking_budget)
            for i in range(requests)
        )
    )  # fmt: skip
    keys = ("num_draft_tokens", "num_accepted_tokens")
    ours = [sum(total(r.spec.final, key) for r in runs if r.spec.final) for key in keys]
    return ours, await spec_counter_growth(before, ours)
