"""A deploy restarts the server: SIGTERM drains in-flight streams within vLLM's --shutdown-timeout."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from load.server import ServerProcess
from load.workload import copy_prompt
from tests.streams import all_streaming, start_streams

pytestmark = pytest.mark.engine

GRACE_S = 20
SHORT_TOKENS = 60
LONG_TOKENS = 1500  # far more than the grace period allows here (about 40 s)


@pytest.fixture(scope="module")
def draining(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess("--shutdown-timeout", str(GRACE_S), log_path=tmp_path_factory.mktemp("drain") / "server.log")
    proc.start()
    yield proc
    proc.stop()


def chat_body(model: str, i: int, tokens: int) -> dict[str, Any]:
    """Exactly ``tokens`` greedy tokens for prompt i."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": copy_prompt(i)}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
    }


def stream(base_url: str, model: str, i: int, tokens: int, events: list[str]) -> None:
    body = {**chat_body(model, i, tokens), "stream": True, "stream_options": {"include_usage": True}}
    try:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
            events.extend(line for line in response.iter_lines() if line)
    except httpx.HTTPError as exc:
        events.append(f"closed: {type(exc).__name__}")


def whole(base_url: str, model: str, i: int, tokens: int, into: list[httpx.Response | str]) -> None:
    """A non-streamed request: its response starts only when it is complete."""
    try:
        into.append(httpx.post(f"{base_url}/v1/chat/completions", json=chat_body(model, i, tokens), timeout=120))
    except httpx.HTTPError as exc:
        into.append(f"closed: {type(exc).__name__}")


def completion_tokens(events: list[str]) -> int | None:
    for line in reversed(events):
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["completion_tokens"])
    return None


def test_sigterm_finishes_streams_within_grace_cuts_the_rest_and_exits_zero(
    draining: ServerProcess, model_name: str
) -> None:
    plan = [SHORT_TOKENS] * 3 + [LONG_TOKENS]
    events: list[list[str]] = [[] for _ in plan]
    threads = start_streams(stream, [(draining.base_url, model_name, i, n, events[i]) for i, n in enumerate(plan)])
    unstarted: list[httpx.Response | str] = []
    threads += start_streams(whole, [(draining.base_url, model_name, 9, LONG_TOKENS, unstarted)])
    # A keep-alive connection, idle when the drain begins.
    idle = httpx.Client(base_url=draining.base_url, timeout=10)
    assert idle.get("/health").status_code == 200
    assert all_streaming(events, 2), "every stream is producing tokens before SIGTERM"
    assert draining.proc is not None
    draining.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()

    # uvicorn closes its listener and every idle keep-alive connection on its next tick
    # (0.1 s): a late request finds no server, on a new connection or the idle one.
    time.sleep(0.5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{draining.base_url}/health", timeout=10)
    with pytest.raises(httpx.TransportError):
        idle.get("/health")

    for thread in threads:
        thread.join(timeout=GRACE_S + 30)
    for i in range(3):
        assert completion_tokens(events[i]) == SHORT_TOKENS, events[i][-3:]
        assert events[i][-1] == "data: [DONE]"
    long = events[3]
    assert completion_tokens(long) is None, "the long stream was cut, not finished"
    error = json.loads(long[-2][6:])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert long[-1] == "data: [DONE]"
    # The non-streamed request had not started its response at the cut: a 503 to retry.
    (response,) = unstarted
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 503 and response.headers["retry-after"] == "1", response.text
    assert "shutting down" in response.json()["error"]["message"]
    code = draining.proc.wait(timeout=GRACE_S + 30)
    assert code == 0, draining.log_tail()
    assert time.monotonic() - sent >= GRACE_S - 1, "the long stream ran until the grace period ended"
