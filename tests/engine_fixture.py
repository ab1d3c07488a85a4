"""An in-process PhasespecLLM on the embedded model, for the depth-hook tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm.sampling_params import SamplingParams

from config import Settings
from engine.args import apply_environment, build_vllm_namespace, request_defaults
from engine.llm import PhasespecLLM, SpecRequest
from engine.runtime import open_engine
from load.workload import chat_prompt


def engine_context(settings: Settings | None = None) -> Any:
    settings = settings if settings is not None else Settings()
    apply_environment(settings)
    return open_engine(build_vllm_namespace(settings), request_defaults(settings))


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
