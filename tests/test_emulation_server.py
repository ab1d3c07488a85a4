"""The step-cost emulation as a user of the server sees it: a startup warning, ``/phasespec/state``,
the response's stats block, the request log line and the per-phase summary all name it. The same
server runs with ``--engine.kv_cache_gib 1`` (half the default), which vLLM must receive, and
starts on a model cache left incomplete by an interrupted build, which it must rebuild."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.default_model import MODEL_NAME, is_complete
from load.server import ServerProcess
from load.workload import copy_prompt

pytestmark = pytest.mark.engine

SPEC = "0+150*tokens"
STEP_MS = "1 * (0 + 150 * tokens)"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache an interrupted first start left behind: a model folder without its build marker
    (one file written), and the staging folder of the build."""
    cache = tmp_path_factory.mktemp("cache")
    (cache / MODEL_NAME).mkdir()
    (cache / MODEL_NAME / "config.json").write_text("{}")
    (cache / f".{MODEL_NAME}.building").mkdir()
    return cache


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[ServerProcess]:
    # An in-process engine of an earlier test leaves vLLM's own variable in this environment,
    # and a variable the user set wins over the setting (engine/args.py): not here.
    with pytest.MonkeyPatch.context() as env:
        env.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        proc = server(cache_dir, tmp_path_factory.mktemp("emulated") / "server.log")
    proc.start()
    yield proc
    proc.stop()


def server(cache_dir: Path, log_path: Path) -> ServerProcess:
    return ServerProcess(
        "--engine.emulate_step_ms",
        SPEC,
        "--adaptive.summary_interval_s",
        "1",
        "--engine.kv_cache_gib",
        "1",
        log_path=log_path,
        env={"PHASESPEC_ENGINE__CACHE_DIR": str(cache_dir)},
    )


def records(server: ServerProcess) -> list[dict[str, Any]]:
    lines = server.log_path.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_an_emulated_server_says_so_wherever_a_user_looks(emulated: ServerProcess, model_name: str) -> None:
    warnings = [r for r in records(emulated) if "STEP-COST EMULATION ON" in str(r.get("event"))]
    assert warnings and warnings[0]["level"] == "warning" and STEP_MS in warnings[0]["event"]

    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": copy_prompt(0)}],
        "max_tokens": 24,
        "temperature": 0,
        "phasespec": {"stats": True},
    }
    reply = httpx.post(f"{emulated.base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["phasespec"]["emulation"]["spec"] == SPEC

    emulation = httpx.get(f"{emulated.base_url}/phasespec/state").json()["emulation"]
    assert emulation["spec"] == SPEC and emulation["step_ms"] == STEP_MS
    # 24 tokens, at most K + 1 = 4 a step: at least 6 decode steps, each padded or overrun.
    assert emulation["padded_steps"] > 0 and emulation["padded_steps"] + emulation["overrun_steps"] >= 6

    finished: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for _ in range(30):  # the summary comes every second while there was traffic
        logged = records(emulated)
        finished = [r for r in logged if r.get("event") == "request_finished"]
        summaries = [r for r in logged if r.get("event") == "spec_summary"]
        if finished and summaries:
            break
        time.sleep(1)
    assert finished and finished[-1]["emulation"]["spec"] == SPEC
    assert summaries and all(s["emulation"] == STEP_MS for s in summaries)


def test_the_kv_cache_setting_reaches_vllm(emulated: ServerProcess) -> None:
    events = [str(r.get("event")) for r in records(emulated)]
    assert any(e.startswith("Explicitly set (1.0/") and "GiB for KV cache" in e for e in events), "vLLM's CPU worker"
    sizes = [int(m[1].replace(",", "")) for e in events if (m := re.search(r"KV cache size: ([0-9,]+) tokens", e))]
    # 2 GiB (the default) held 46,592 tokens of the embedded model on vLLM 0.32.0.
    assert sizes and 22_000 <= sizes[0] <= 24_000, sizes


def test_an_incomplete_model_cache_is_rebuilt_at_start(emulated: ServerProcess, cache_dir: Path) -> None:
    assert "preparing the embedded default model" in emulated.log_path.read_text(errors="replace")
    assert is_complete(cache_dir / MODEL_NAME)
    assert sorted(p.name for p in cache_dir.iterdir()) == [MODEL_NAME], "the staging folder is gone"
