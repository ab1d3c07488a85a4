"""PhasespecLLM: vLLM's AsyncLLM with phasespec's per-request defaults.

vLLM's serving layer only ever calls ``generate``; subclassing keeps every
other ``EngineClient`` method vLLM's own, so the OpenAI handlers see exactly
the engine ``vllm serve`` would give them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """Applied to requests that leave these fields unset."""

    thinking_token_budget: int | None = None
    hold_eos_while_thinking: bool = False


def with_defaults(params: SamplingParams, defaults: RequestDefaults, reasoning_end_len: int) -> SamplingParams:
    """A copy of ``params`` with the server's reasoning defaults filled in."""
    budget = params.thinking_token_budget
    if budget is not None or defaults.thinking_token_budget is None:
        return params
    params = params.clone()
    params.thinking_token_budget = defaults.thinking_token_budget
    if defaults.hold_eos_while_thinking and params.min_tokens == 0:
        # The forced end string follows the budget; one answer token after it.
        wanted = defaults.thinking_token_budget + reasoning_end_len + 1
        params.min_tokens = wanted if params.max_tokens is None else min(wanted, params.max_tokens)
    return params


class PhasespecLLM(AsyncLLM):
    """AsyncLLM whose ``generate`` applies phasespec's request defaults."""

    request_defaults: RequestDefaults = RequestDefaults()

    def configure(self, defaults: RequestDefaults) -> None:
        reasoning = self.vllm_config.reasoning_config
        if defaults.thinking_token_budget is not None and (reasoning is None or not reasoning.enabled):
            # vLLM rejects a budget without a reasoning config; so do we, at startup.
            raise ValueError("a default thinking budget needs --reasoning-parser (and --reasoning-config)")
        self.request_defaults = defaults
        end_ids = reasoning.reasoning_end_token_ids if reasoning is not None else None
        self._reasoning_end_len = len(end_ids or ())

    async def generate(  # type: ignore[override]
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        **kwargs: Any,
    ) -> AsyncGenerator[RequestOutput, None]:
        params = with_defaults(sampling_params, self.request_defaults, getattr(self, "_reasoning_end_len", 0))
        async for output in super().generate(prompt, params, request_id, **kwargs):
            yield output
