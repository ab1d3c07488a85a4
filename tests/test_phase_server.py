"""Phase tracking on the real server: depths per phase, stats, log line, metrics, overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from load.workload import copy_prompt

K = 3
ALL_K = {"depths": {"reasoning": K, "answer": K, "tool_call": K}}


def chat(base_url: str, model: str, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": copy_prompt(0)}],
        "max_tokens": 110,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def max_drafted(phase: dict[str, Any]) -> int:
    return max((n for n, steps in enumerate(phase["steps_by_drafted"]) if steps), default=0)


def test_reasoning_runs_at_depth_one_and_answer_at_two(base_url: str, model_name: str) -> None:
    reply = chat(base_url, model_name, phasespec={"stats": True}).json()
    report = reply["phasespec"]
    reasoning, answer = report["phases"]["reasoning"], report["phases"]["answer"]
    assert reasoning["tokens"] > 0 and answer["tokens"] > 0
    assert reasoning["steps"] > 0 and answer["steps"] > 0
    assert max_drafted(reasoning) == 1
    assert max_drafted(answer) == 2
    assert [entry[1:] for entry in report["depth_timeline"]] == [["reasoning", 1], ["answer", 2]]
    assert report["ttft_s"] <= report["time_to_first_answer_s"] <= report["duration_s"]
    assert (
        report["phases"]["reasoning"]["tokens"] + report["phases"]["answer"]["tokens"]
        == reply["usage"]["completion_tokens"]
    )


def test_stream_carries_stats_in_its_usage_chunk(base_url: str, model_name: str) -> None:
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": copy_prompt(1)}],
        "max_tokens": 100,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "phasespec": {"stats": True, "depths": {"reasoning": 0}},
    }
    reports, usage = [], None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "phasespec" in chunk:
                    reports.append(chunk)
                usage = chunk.get("usage") or usage
    assert len(reports) == 1 and reports[0]["usage"] is not None
    phases = reports[0]["phasespec"]["phases"]
    assert phases["reasoning"]["drafted"] == 0, "the override set reasoning depth 0"
    assert max_drafted(phases["answer"]) == 2
    assert usage is not None
    assert phases["reasoning"]["tokens"] + phases["answer"]["tokens"] == usage["completion_tokens"]


def test_phase_switching_leaves_reasoning_and_answer_unchanged(base_url: str, model_name: str) -> None:
    switched = chat(base_url, model_name).json()["choices"][0]["message"]
    fixed = chat(base_url, model_name, phasespec=ALL_K).json()["choices"][0]["message"]
    assert switched["reasoning"] == fixed["reasoning"]
    assert switched["content"] == fixed["content"]


def test_phase_switching_leaves_tool_calls_unchanged(base_url: str, model_name: str) -> None:
    from tests.test_api import NAMED_CHOICE, WEATHER_TOOL

    extra = {"tools": [WEATHER_TOOL], "tool_choice": NAMED_CHOICE, "max_tokens": 150}
    switched = chat(base_url, model_name, **extra, phasespec={"stats": True}).json()
    fixed = chat(base_url, model_name, **extra, phasespec=ALL_K).json()
    assert (
        switched["choices"][0]["message"]["tool_calls"][0]["function"]
        == fixed["choices"][0]["message"]["tool_calls"][0]["function"]
    )
    assert switched["choices"][0]["message"]["reasoning"] == fixed["choices"][0]["message"]["reasoning"]
    assert "reasoning" in switched["phasespec"]["phases"]


def test_canonical_log_line_and_metrics_carry_phases(base_url: str, model_name: str, server_log: Path) -> None:
    reply = chat(base_url, model_name, max_tokens=90).json()
    text = server_log.read_text().splitlines()
    records = [json.loads(row) for row in text if row.startswith("{") and reply["id"] in row]
    finished = [r for r in records if r["event"] == "request_finished"]
    assert len(finished) == 1
    line = finished[0]
    assert line["request_id"] == reply["id"] and line["model"] == model_name
    assert line["finish_reason"] == reply["choices"][0]["finish_reason"]
    assert set(line["phases"]) == {"reasoning", "answer"}
    for key in (
        "tokens",
        "duration_s",
        "decode_tok_s",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_acceptance_length",
    ):
        assert key in line["phases"]["answer"]
    metrics = httpx.get(f"{base_url}/metrics").text
    for name in (
        "phasespec_tokens_total",
        "phasespec_spec_draft_tokens_total",
        "phasespec_spec_accepted_tokens_total",
        "phasespec_depth_switches_total",
        "phasespec_decode_tokens_per_second_count",
    ):
        assert f'{name}{{phase="answer"}}' in metrics, name


@pytest.mark.parametrize(
    ("override", "param"),
    [
        ({"depths": {"reasoning": 4}}, "phasespec.depths.reasoning"),
        ({"depths": {"answer": -1}}, "phasespec.depths.answer"),
        ({"depths": {"answer": "2"}}, "phasespec.depths.answer"),
        ({"depths": {"thinking": 1}}, "phasespec.depths.thinking"),
        ({"depths": [1, 2]}, "phasespec.depths"),
        ({"stats": "yes"}, "phasespec.stats"),
        ({"speed": 1}, "phasespec.speed"),
        ("fast", "phasespec"),
    ],
)
def test_bad_override_is_an_openai_400_naming_the_field(
    base_url: str, model_name: str, override: Any, param: str
) -> None:
    response = chat(base_url, model_name, phasespec=override)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == 400 and error["type"] == "BadRequestError"
    assert param.split(".")[-1] in error["message"] or "phasespec" in error["message"]
