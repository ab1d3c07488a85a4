"""The bad day: the engine core dies while streams are in flight (a server of its own)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from load.server import ServerProcess
from load.workload import copy_prompt
from tests.streams import all_streaming, start_streams

pytestmark = pytest.mark.engine

STREAMS = 3


@pytest.fixture(scope="module")
def doomed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(log_path=tmp_path_factory.mktemp("doomed") / "server.log")
    proc.start()
    yield proc
    proc.stop()


def long_chat(model: str, i: int, **extra: Any) -> dict[str, Any]:
    """A request that runs far longer than the test takes to kill the engine under it."""
    content = copy_prompt(i)
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1500,
            "min_tokens": 1500, "temperature": 0, **extra}  # fmt: skip


def stream(base_url: str, model: str, i: int, events: list[str], ended: dict[int, float]) -> None:
    body = long_chat(model, i, stream=True)
    try:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line:
                    events.append(line)
    except httpx.HTTPError as exc:
        events.append(f"closed: {type(exc).__name__}")
    finally:
        ended[i] = time.monotonic()


def complete(base_url: str, model: str, replies: list[httpx.Response | str]) -> None:
    """A non-streaming request in flight when the engine dies: its reply is the error."""
    body = long_chat(model, STREAMS)
    try:
        replies.append(httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120))
    except httpx.HTTPError as exc:
        replies.append(f"closed: {type(exc).__name__}")


def engine_core(server: ServerProcess) -> psutil.Process:
    assert server.proc is not None
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        if "EngineCore" in child.name() or any("EngineCore" in part for part in child.cmdline()):
            return child
    raise AssertionError("no EngineCore child process")


def test_engine_death_ends_streams_fails_requests_and_exits_nonzero(doomed: ServerProcess, model_name: str) -> None:
    events: list[list[str]] = [[] for _ in range(STREAMS)]
    ended: dict[int, float] = {}
    threads = start_streams(stream, [(doomed.base_url, model_name, i, events[i], ended) for i in range(STREAMS)])
    replies: list[httpx.Response | str] = []
    threads += start_streams(complete, [(doomed.base_url, model_name, replies)])
    assert all_streaming(events, 3), "every stream is producing tokens"
    core = engine_core(doomed)
    core.kill()
    killed_at = time.monotonic()
    for thread in threads:
        thread.join(timeout=30)
    assert len(ended) == STREAMS and max(ended.values()) - killed_at < 15, "no client hangs"
    for e in events:
        assert e[-1] != "data: [DONE]" or any('"error"' in line for line in e), e[-3:]
    # vLLM's own error for a dead engine, not a 500 from its handler failing (it stops the server
    # it expects at app.state.server: proxy/app.py gives it one)
    [reply] = replies
    assert isinstance(reply, httpx.Response), reply
    assert reply.status_code >= 500 and "EngineCore" in reply.json()["error"]["message"], reply.text
    after: dict[str, Any] = {}
    try:
        reply = httpx.post(
            f"{doomed.base_url}/v1/chat/completions",
            json={"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            timeout=10,
        )
        after["status"] = reply.status_code
        after["health"] = httpx.get(f"{doomed.base_url}/health", timeout=5).status_code
    except httpx.HTTPError as exc:  # the server is already gone: also what a client must see
        after["gone"] = type(exc).__name__
    assert "gone" in after or (after["status"] >= 500 and after["health"] != 200), after
    assert doomed.proc is not None
    code = doomed.proc.wait(timeout=max(1.0, 30 - (time.monotonic() - killed_at)))
    assert code == 1, "a supervisor must see a failure: exit 1, as docs/operations.md promises"
    log = Path(doomed.log_path).read_text(errors="replace")
    assert "engine_dead" in log
