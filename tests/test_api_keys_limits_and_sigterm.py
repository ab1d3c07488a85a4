"""A second server of its own: API keys, a small in-flight bound, CLI settings, SIGTERM.

The tests run in file order; the last one stops the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from load.run_load import parse_args, run
from load.server import ServerProcess

pytestmark = pytest.mark.engine

KEYS = ("key-one", "key-two")
BOUND = 2


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        "--server.api_keys",
        f'["{KEYS[0]}","{KEYS[1]}"]',
        "--server.max_inflight",
        str(BOUND),
        "--engine.default_thinking_budget",
        "6",
        "--max-num-seqs",
        "4",
        log_path=tmp_path_factory.mktemp("guarded") / "server.log",
    )
    server.start()
    yield server
    server.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_health_needs_no_key(guarded: ServerProcess) -> None:
    assert httpx.get(f"{guarded.base_url}/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/phasespec/state"])
@pytest.mark.parametrize("headers", [{}, auth("wrong"), {"Authorization": "key-one"}])
def test_missing_or_wrong_key_is_an_openai_401(guarded: ServerProcess, path: str, headers: dict[str, str]) -> None:
    response = httpx.get(f"{guarded.base_url}{path}", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == 401 and error["type"] == "AuthenticationError" and "API key" in error["message"]


def test_chat_without_key_is_refused_before_parsing(guarded: ServerProcess) -> None:
    response = httpx.post(f"{guarded.base_url}/v1/chat/completions", content=b"not json")
    assert response.status_code == 401


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_works(guarded: ServerProcess, key: str, model_name: str) -> None:
    assert httpx.get(f"{guarded.base_url}/v1/models", headers=auth(key)).json()["data"][0]["id"] == model_name
    assert "vllm:" in httpx.get(f"{guarded.base_url}/metrics", headers=auth(key)).text


def test_cli_settings_reach_the_engine(guarded: ServerProcess, model_name: str) -> None:
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": True,
    }
    reply = httpx.post(f"{guarded.base_url}/v1/chat/completions", json=body, headers=auth(KEYS[0]), timeout=120).json()
    tokens = [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]
    # A 6-token budget (--engine.default_thinking_budget 6): </think> is forced
    # right after it and the transition phrase.
    assert "</think>" in tokens[: 6 + 12]


def test_four_times_the_bound_gets_429s_and_never_a_5xx(guarded: ServerProcess, tmp_path: Path) -> None:
    summary = run(
        parse_args(
            [
                "--host",
                guarded.base_url,
                "--users",
                str(4 * BOUND),
                "--seconds",
                "15",
                "--api-key",
                KEYS[1],
                "--max-tokens",
                "48",
                "--out",
                str(tmp_path),
            ]
        )
    )
    assert summary["requests"] > 0
    assert summary["rejected_429"] > 0
    assert summary["failures"] == 0 and summary["server_errors_5xx"] == 0
    assert summary["leaked_requests"] == 0
    busy = httpx.post(f"{guarded.base_url}/v1/chat/completions", json={}, headers=auth(KEYS[0]))
    assert busy.status_code == 400, "once the load is gone, requests are admitted again"


def test_sigterm_shuts_down_and_leaves_no_process(guarded: ServerProcess) -> None:
    assert guarded.proc is not None
    children = psutil.Process(guarded.proc.pid).children(recursive=True)
    assert children, "vLLM's engine core runs as a child process"
    code = guarded.stop()
    # A drained SIGTERM is a clean stop (proxy/cli.py): status 0, as docs/operations.md promises.
    assert code == 0, guarded.log_tail()
    assert "Application shutdown complete" in guarded.log_tail()
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [(p.pid, p.name()) for p in alive]
