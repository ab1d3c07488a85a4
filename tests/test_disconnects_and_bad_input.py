"""Clients that leave, and bad input, on the real server: nothing is lost or leaked."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from load.workload import copy_prompt

N_DISCONNECTS = 100


async def wait_idle(client: httpx.AsyncClient, base_url: str, timeout_s: float = 30) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for _ in range(int(timeout_s / 0.25)):
        state = (await client.get(f"{base_url}/phasespec/state")).json()
        engine = state["engine"]
        if not any(engine.values()) and not state["frontend_unfinished"]:
            break
        await asyncio.sleep(0.25)
    return state


@pytest.mark.asyncio(loop_scope="session")
async def test_hundred_disconnects_at_random_points_leave_nothing_behind(base_url: str, model_name: str) -> None:
    rng = random.Random(7)
    gate = asyncio.Semaphore(8)
    points: list[int] = []

    async def leave(i: int, client: httpx.AsyncClient) -> None:
        events_before_leaving = rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21, 34])
        points.append(events_before_leaving)
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": copy_prompt(i)}],
            "max_tokens": 64,
            "stream": True,
        }

        async def consume() -> None:
            seen = 0
            async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    seen += line.startswith("data:")
                    if events_before_leaving and seen >= events_before_leaving:
                        return  # closing the stream drops the connection mid-response

        async with gate:
            if events_before_leaving == 0:  # gone before the first token
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(consume(), timeout=rng.uniform(0.02, 0.3))
            else:
                await consume()

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(leave(i, client) for i in range(N_DISCONNECTS)))
        state = await wait_idle(client, base_url)
        assert state["engine"] == {
            "live": 0,
            "groups": 0,
            "finishing": 0,
            "finished_unread": 0,
            "running": 0,
            "waiting": 0,
        }
        assert state["frontend_unfinished"] == 0
        assert state["stats_board"] == 0
        assert points.count(0) >= 10 and len(set(points)) >= 8
        # And the server still serves.
        body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 70}
        assert (await client.post(f"{base_url}/v1/chat/completions", json=body)).status_code == 200


JSON = {"content-type": "application/json"}


async def chunked(size: int) -> AsyncIterator[bytes]:
    """A body sent with Transfer-Encoding: chunked (no Content-Length)."""
    block = b"x" * 2**16
    for _ in range(size // len(block)):
        yield block


def bad_requests(model: str) -> list[tuple[str, str, dict[str, Any], int, str]]:
    """(name, path, httpx kwargs, expected status, a word the error must contain)."""
    chat = "/v1/chat/completions"
    cmpl = "/v1/completions"
    msg = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

    def body(**fields: Any) -> dict[str, Any]:
        return {"json": {"model": model, "messages": msg, "max_tokens": 8, **fields}}

    def raw(field: bytes) -> dict[str, Any]:
        """A body with one field written as raw JSON text (values json.dumps cannot produce)."""
        text = json.dumps({"model": model, "messages": msg}).encode()
        return {"content": text[:-1] + b", " + field + b"}", "headers": JSON}

    def without(key: str) -> dict[str, Any]:
        data = body()["json"]
        del data[key]
        return {"json": data}

    return [
        ("invalid json", chat, {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "json"),
        ("json array body", chat, {"json": [1, 2]}, 400, "object"),
        ("missing messages", chat, without("messages"), 400, "messages"),
        ("messages is a string", chat, body(messages="hi"), 400, "messages"),
        ("empty messages", chat, body(messages=[]), 400, "message"),
        ("message without role", chat, body(messages=[{"content": "hi"}]), 400, "role"),
        ("message is a bare string", chat, body(messages=["hi"]), 400, "messages"),
        ("content is a number", chat, body(messages=[{"role": "user", "content": 5}]), 400, "content"),
        ("unknown model", chat, {"json": {"model": "nope", "messages": msg}}, 404, "nope"),
        ("model is a number", chat, {"json": {"model": 7, "messages": msg}}, 400, "model"),
        ("negative max_tokens", chat, body(max_tokens=-5), 400, "max_tokens"),
        ("huge max_tokens", chat, body(max_tokens=10**9), 400, "max"),
        ("max_tokens is text", chat, body(max_tokens="ten"), 400, "max_tokens"),
        ("negative temperature", chat, body(temperature=-1), 400, "temperature"),
        ("temperature is text", chat, body(temperature="hot"), 400, "temperature"),
        ("top_p above 1", chat, body(top_p=1.5), 400, "top_p"),
        ("n is zero", chat, body(n=0), 400, "n"),
        (
            "prompt beyond max model len",
            chat,
            body(messages=[{"role": "user", "content": "word " * 4000}]),
            400,
            "length",
        ),
        ("bad depth override", chat, body(phasespec={"depths": {"answer": 9}}), 400, "phasespec.depths.answer"),
        ("tool without function", chat, body(tools=[{"type": "function"}]), 400, "function"),
        ("tools is an object", chat, body(tools={"type": "function"}), 400, "tools"),
        ("invalid tool_choice", chat, body(tools=[tool], tool_choice="sometimes"), 400, "tool_choice"),
        (
            "tool_choice names unknown tool",
            chat,
            body(tools=[tool], tool_choice={"type": "function", "function": {"name": "g"}}),
            400,
            "tool_choice",
        ),
        (
            "named tool_choice without tools",
            chat,
            body(tool_choice={"type": "function", "function": {"name": "f"}}),
            400,
            "tool",
        ),
        ("oversized body", chat, body(messages=[{"role": "user", "content": "x" * (5 * 2**20)}]), 413, "exceeds"),
        (
            "wrong content type",
            chat,
            {"content": json.dumps(body()["json"]), "headers": {"content-type": "text/plain"}},
            400,
            "media type",
        ),
        ("stream is a list", chat, body(stream=[1]), 400, "stream"),
        ("stream_options without stream", chat, body(stream_options={"include_usage": True}), 400, "stream"),
        ("top_logprobs too large", chat, body(logprobs=True, top_logprobs=1000), 400, "logprobs"),
        ("stop is a number", chat, body(stop=123), 400, "stop"),
        ("seed is text", chat, body(seed="abc"), 400, "seed"),
        ("bad response_format", chat, body(response_format={"type": "yaml"}), 400, "response_format"),
        ("completions without prompt", cmpl, {"json": {"model": model, "max_tokens": 4}}, 400, "prompt"),
        ("completions prompt is an object", cmpl, {"json": {"model": model, "prompt": {"a": 1}}}, 400, "prompt"),
        # Where vLLM is lax and the OpenAI API is not (proxy/strict.py).
        ("unknown message role", chat, body(messages=[{"role": "wizard", "content": "hi"}]), 400, "role"),
        ("stream is a string", chat, body(stream="yes"), 400, "stream"),
        ("max_tokens is a numeric string", chat, body(max_tokens="8"), 400, "max_tokens"),
        ("max_tokens overflows to infinity", chat, raw(b'"max_tokens": 1e400'), 400, "max_tokens"),
        ("n is a string", chat, body(n="2"), 400, "n"),
        ("temperature above 2", chat, body(temperature=5), 400, "temperature"),
        ("temperature is NaN", chat, raw(b'"temperature": NaN'), 400, "nan"),
        ("logprobs is a string", chat, body(logprobs="true"), 400, "logprobs"),
        ("stop has a number", chat, body(stop=["a", 1]), 400, "stop"),
        ("user is an object", chat, body(user={"id": 1}), 400, "user"),
        ("message is null", chat, body(messages=[None]), 400, "messages[0]"),
        ("message is a number", chat, body(messages=[3]), 400, "messages[0]"),
        ("empty body", chat, {"content": b"", "headers": JSON}, 400, "json"),
        ("body is null", chat, {"content": b"null", "headers": JSON}, 400, "object"),
        ("body is a string", chat, {"content": b'"hi"', "headers": JSON}, 400, "object"),
        ("invalid utf-8", chat, {"content": b'{"model": "\xc3\x28"}', "headers": JSON}, 400, "utf-8"),
        ("utf-16 body", chat, {"content": json.dumps(body()["json"]).encode("utf-16"), "headers": JSON}, 400, "utf-8"),
        ("deep nesting", chat, {"content": b"[" * 100_000 + b"]" * 100_000, "headers": JSON}, 400, "deeply"),
        ("chunked body over the limit", chat, {"content": chunked(6 * 2**20), "headers": JSON}, 413, "exceeds"),
        ("chunked body over the limit, other route", "/tokenize", {"content": chunked(6 * 2**20)}, 413, "exceeds"),
        ("completions echo is a string", cmpl, {"json": {"model": model, "prompt": "hi", "echo": "yes"}}, 400, "echo"),
        ("completions prompt mixes types", cmpl, {"json": {"model": model, "prompt": [1, "a"]}}, 400, "prompt"),
        (
            "completions logprobs above 5",
            cmpl,
            {"json": {"model": model, "prompt": "hi", "logprobs": 6}},
            400,
            "logprobs",
        ),
        ("completions unknown model", cmpl, {"json": {"model": "nope", "prompt": "hi"}}, 404, "nope"),
        (
            "completions negative max_tokens",
            cmpl,
            {"json": {"model": model, "prompt": "hi", "max_tokens": -1}},
            400,
            "max_tokens",
        ),
    ]


@pytest.mark.asyncio(loop_scope="session")
async def test_bad_requests_get_openai_4xx_while_good_ones_succeed(base_url: str, model_name: str) -> None:
    cases = bad_requests(model_name)
    assert len(cases) >= 50
    stop = asyncio.Event()
    good: list[int] = []

    async def keep_serving(client: httpx.AsyncClient) -> None:
        body = {"model": model_name, "messages": [{"role": "user", "content": copy_prompt(3)}], "max_tokens": 64}
        while not stop.is_set():
            response = await client.post(f"{base_url}/v1/chat/completions", json=body)
            good.append(response.status_code)

    async with httpx.AsyncClient(timeout=120) as client:
        workers = [asyncio.create_task(keep_serving(client)) for _ in range(2)]
        problems = []
        for name, path, kwargs, status, word in cases:
            response = await client.post(f"{base_url}{path}", **kwargs)
            try:
                error = response.json()["error"]
                text = f"{error['message']} {error.get('param') or ''}".lower()
                if response.status_code != status or error["code"] != status or word.lower() not in text:
                    problems.append(f"{name}: {response.status_code} {error}")
            except (ValueError, KeyError, TypeError):
                problems.append(f"{name}: {response.status_code} {response.text[:200]}")
        stop.set()
        await asyncio.gather(*workers)
    assert not problems, "\n".join(problems)
    assert good and set(good) == {200}
