"""Locust: streaming chat users against phasespec (or any OpenAI-compatible server).

    locust -f load/locustfile.py --host http://127.0.0.1:8000

Besides the request itself, each stream reports through Locust's own stats
(request type ``METRIC``, times in ms, lengths in tokens): time to first
token, time to first answer token, mean and max inter-token gap, and per
phase its tokens and acceptance (x1000) from phasespec's stats block.
Environment: PHASESPEC_LOAD_MODEL, PHASESPEC_LOAD_MAX_TOKENS, PHASESPEC_LOAD_API_KEY,
PHASESPEC_LOAD_STATS (0: no phasespec field), PHASESPEC_LOAD_THINKING_BUDGET (sets
thinking_token_budget and min_tokens = max tokens, for servers without phasespec's defaults).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from locust import HttpUser, between, events, task

from load.sse import SSEParser, StreamTimer
from load.workload import copy_prompt

MODEL = os.environ.get("PHASESPEC_LOAD_MODEL", "phasespec-smollm2-135m-think")
MAX_TOKENS = int(os.environ.get("PHASESPEC_LOAD_MAX_TOKENS", "96"))
API_KEY = os.environ.get("PHASESPEC_LOAD_API_KEY", "")
# For runs against plain vLLM: no phasespec field, explicit reasoning budget.
ASK_STATS = os.environ.get("PHASESPEC_LOAD_STATS", "1") == "1"
THINKING_BUDGET = int(os.environ.get("PHASESPEC_LOAD_THINKING_BUDGET", "0"))


def metric(name: str, value_ms: float | None, length: int = 0) -> None:
    if value_ms is not None:
        events.request.fire(
            request_type="METRIC", name=name, response_time=value_ms, response_length=length, exception=None, context={}
        )


def report_stream(timer: StreamTimer) -> None:
    metric("ttft", _ms(timer.first_token))
    metric("time_to_first_answer", _ms(timer.first_answer))
    metric("inter_token_gap_mean", _ms(timer.mean_gap))
    metric("inter_token_gap_max", _ms(timer.max_gap))
    for phase, stats in ((timer.report or {}).get("phases") or {}).items():
        metric(f"{phase}_tokens", 0.0, int(stats.get("tokens") or 0))
        if stats.get("acceptance_rate") is not None:
            metric(f"{phase}_acceptance_x1000", 1000 * float(stats["acceptance_rate"]))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


class ChatUser(HttpUser):
    wait_time = between(0.05, 0.3)

    @task
    def streamed_chat(self) -> None:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": copy_prompt(random.randrange(24))}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ASK_STATS:
            body["phasespec"] = {"stats": True}
        if THINKING_BUDGET:
            body["thinking_token_budget"] = THINKING_BUDGET
            body["min_tokens"] = MAX_TOKENS
        headers = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
        start = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions", json=body, headers=headers, stream=True, catch_response=True, name="chat (stream)"
        ) as response:
            if response.status_code == 429:
                response.success()  # the server shed load as designed; counted apart
                metric("rejected_429", 1000 * (time.perf_counter() - start))
                return
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            parser, timer = SSEParser(), StreamTimer(start)
            for chunk in response.iter_content(chunk_size=None):
                for payload in parser.feed(chunk):
                    timer.add(payload, time.perf_counter())
            if timer.error or not timer.done:
                response.failure(timer.error or "stream ended without [DONE]")
                return
            response.success()
        report_stream(timer)
