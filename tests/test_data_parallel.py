"""Data parallelism on the real engine: two engine cores (one per CPU core), one front end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from load.server import ServerProcess
from load.workload import copy_prompt
from tests.test_disconnects_and_bad_input import wait_idle

pytestmark = pytest.mark.engine

REQUESTS = 8


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess("--data-parallel-size", "2", log_path=tmp_path_factory.mktemp("dp") / "server.log")
    proc.start()
    yield proc
    proc.stop()


def metric_sum(text: str, name: str, label: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def max_drafted(phase: dict[str, Any]) -> int:
    return max((n for n, steps in enumerate(phase["steps_by_drafted"]) if steps), default=0)


@pytest.mark.asyncio(loop_scope="session")
async def test_depths_counters_and_phase_metrics_hold_on_both_ranks(dp_server: ServerProcess, model_name: str) -> None:
    base = dp_server.base_url
    async with httpx.AsyncClient(timeout=120) as client:
        before = (await client.get(f"{base}/metrics")).text

        async def one(i: int) -> dict[str, Any]:
            body = {
                "model": model_name,
                "messages": [{"role": "user", "content": copy_prompt(i)}],
                "max_tokens": 80,
                "temperature": 0,
                "phasespec": {"depths": {"reasoning": 1, "answer": 2}, "stats": True},
            }
            response = await client.post(f"{base}/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return dict(response.json()["phasespec"])

        reports = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
        after = (await client.get(f"{base}/metrics")).text
    assert {r["engine_rank"] for r in reports} == {0, 1}, "requests landed on both ranks"
    for report in reports:
        phases = report["phases"]
        assert max_drafted(phases["reasoning"]) == 1, "reasoning verified at depth 1"
        assert max_drafted(phases["answer"]) == 2, "the switch to 2 reached the request's rank"
    for ours, vllms in (("num_draft_tokens", "draft_tokens"), ("num_accepted_tokens", "accepted_tokens")):
        per_request = sum(p[ours] for r in reports for p in r["phases"].values())
        name = f"vllm:spec_decode_num_{vllms}_total"
        assert per_request == metric_sum(after, name) - metric_sum(before, name), f"{ours}: exact over both ranks"
    for phase in ("reasoning", "answer"):
        tokens = sum(r["phases"][phase]["tokens"] for r in reports)
        label = f'phase="{phase}"'
        counted = metric_sum(after, "phasespec_tokens_total", label) - metric_sum(
            before, "phasespec_tokens_total", label
        )
        assert counted == tokens


@pytest.mark.asyncio(loop_scope="session")
async def test_disconnects_free_state_on_both_ranks(dp_server: ServerProcess, model_name: str) -> None:
    base = dp_server.base_url

    async def leave(i: int, client: httpx.AsyncClient) -> None:
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": copy_prompt(i)}],
            "max_tokens": 1000,
            "min_tokens": 1000,
            "stream": True,
        }
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            events = 0
            async for line in response.aiter_lines():
                events += bool(line)
                if events >= 5:
                    break  # leaving mid-stream closes the connection

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(leave(i, client) for i in range(6)))
        state = await wait_idle(client, base)
    assert not any(state["engine"].values()), state["engine"]  # summed over both ranks, each >= 0
    assert state["frontend_unfinished"] == 0
    assert len(state["controller"]["ranks"]) == 2
