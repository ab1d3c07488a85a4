"""A second server of its own: settings from the CLI, and a clean SIGTERM."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil

from tests.server import ServerProcess


def test_cli_settings_apply_and_sigterm_leaves_no_process(tmp_path: Path, model_name: str) -> None:
    server = ServerProcess(
        "--engine.default_thinking_budget", "6", "--max-num-seqs", "4", log_path=tmp_path / "server.log"
    )
    server.start()
    try:
        assert server.proc is not None
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert children, "vLLM's engine core runs as a child process"
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 40,
            "temperature": 0,
            "logprobs": True,
        }
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120).json()
        tokens = [t["token"] for t in reply["choices"][0]["logprobs"]["content"]]
        # A 6-token budget: </think> is forced right after it plus the end phrase.
        assert "</think>" in tokens[:6 + 12]
        assert reply["choices"][0]["message"]["content"]
    finally:
        code = server.stop()
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete.
    assert code in (0, -15), server.log_tail()
    assert "Application shutdown complete" in server.log_tail()
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [(p.pid, p.name()) for p in alive]
