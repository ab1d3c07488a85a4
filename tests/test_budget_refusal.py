"""A thinking budget the engine cannot honour (vLLM's V2 model runner before 0.31: the user's fork
with DSpark) is refused, not dropped: a 400 naming the field from the body middleware (proxy/body.py,
in front of a stand-in app that records what reaches it), a ValueError from the engine's
``generate``, a failed start for a default budget. On the real engine (V1 runner) budgets are
honoured and pass (tests/test_api.py's budget tests)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from starlette.types import Receive, Scope, Send
from vllm.sampling_params import SamplingParams

from engine import llm
from engine.llm import BUDGET_IGNORED, PhasespecLLM, RequestDefaults
from proxy.body import BodyMiddleware


class Recorder:
    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_budget_the_runner_ignores_is_a_400_and_reaches_nothing(path: str) -> None:
    app = Recorder()
    completion = {"model": "m", "prompt": "hi", "thinking_token_budget": 32}
    body = chat(thinking_token_budget=32) if "chat" in path else completion
    middleware = BodyMiddleware(app, max_depth=lambda: 3, budget_refusal=lambda: BUDGET_IGNORED)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://test") as client:
        refused = await client.post(path, json=body)
        plain = await client.post(path, json={k: v for k, v in body.items() if k != "thinking_token_budget"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "thinking_token_budget" and "V2 model runner" in error["message"]
    assert plain.status_code == 200 and app.seen == 1


@pytest.mark.asyncio
async def test_a_budget_the_runner_applies_passes() -> None:
    app = Recorder()
    middleware = BodyMiddleware(app, max_depth=lambda: 3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://test") as client:
        reply = await client.post("/v1/chat/completions", json=chat(thinking_token_budget=32))
    assert reply.status_code == 200 and app.seen == 1


def engine_on_a_runner_without_budgets(monkeypatch: pytest.MonkeyPatch) -> PhasespecLLM:
    monkeypatch.setattr(llm, "runner_applies_thinking_budget", lambda vllm_config: False)
    engine = object.__new__(PhasespecLLM)
    reasoning = SimpleNamespace(enabled=True, reasoning_end_token_ids=[7])
    engine.vllm_config = SimpleNamespace(reasoning_config=reasoning, speculative_config=None)  # type: ignore[assignment]
    return engine


def test_a_default_budget_on_a_runner_that_ignores_budgets_fails_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_on_a_runner_without_budgets(monkeypatch)
    with pytest.raises(ValueError, match="default_thinking_budget: this engine runs vLLM's V2 model runner"):
        engine.configure(RequestDefaults(thinking_token_budget=48))
    engine.configure(RequestDefaults())
    assert engine.applies_thinking_budget is False


@pytest.mark.asyncio
async def test_a_budget_reaching_the_engine_directly_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_on_a_runner_without_budgets(monkeypatch)
    engine.configure(RequestDefaults())
    with pytest.raises(ValueError, match="thinking_token_budget: this engine runs"):
        await anext(engine.generate("hi", SamplingParams(thinking_token_budget=8), "r1"))
