# ruff: noqa: RUF001  (the fullwidth bars in DeepSeek markers are the real tokens)
"""phasespec's phases agree with vLLM's own streaming parser, for every supported family.

The harness (tests/phase_agreement.py) runs vLLM's composed parser as the
oracle on realistic responses cut into speculative-step-sized deltas.
"""

from __future__ import annotations

import logging
import random

import pytest

from proxy.phase_plan import PhasePlan, plan_from_vllm
from proxy.phases import Phase
from tests import phase_agreement as harness


@pytest.mark.parametrize("row", harness.ROWS, ids=[row.name for row in harness.ROWS])
def test_tracker_agrees_with_vllms_parser_delta_by_delta(row: harness.Row) -> None:
    result = harness.run_row(row, seeds=2)
    assert result.responses >= 48 and result.compared > 1000
    assert result.passed, (result.disagreements[:5], result.tool_mismatches, result.count_mismatches)


def test_deepseek_v4_tool_calls_are_missed_by_parser_attribute_markers() -> None:
    """The harness can fail: the earlier tracker (tool markers from parser attribute
    names) finds none on deepseek_v4 and tracks its DSML tool calls as answer."""
    row = harness.ROWS[0]
    plan = harness._plan(row)
    attribute_only = PhasePlan(plan.markers, plan.tokenizer)  # no parser engines: token markers only
    harness._PLANS[row.name] = attribute_only
    try:
        result = harness.Result(row)
        tokenizer = harness._tokenizer(row)
        pieces = harness.dsml()(harness.REASONING[0], harness.ANSWERS[1], harness.CALLS[1])
        harness.check_response(row, tokenizer, pieces, random.Random(0), result)
    finally:
        harness._PLANS[row.name] = plan
    assert result.tool_mismatches == result.responses > 0
    assert result.disagreements


def test_a_tool_call_split_into_single_tokens_is_tracked_from_its_marker() -> None:
    row = harness.ROWS[0]
    tokenizer = harness._tokenizer(row)
    text = 'Done thinking.</think>Checking.<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    ids = tokenizer.encode(text, add_special_tokens=False)
    tracker = harness._plan(row).tracker(reasoning_ended=False)
    phases = []
    for i in range(len(ids)):
        piece = harness._delta_texts(tokenizer, ids, [i, i + 1])[1] if i else tokenizer.decode(ids[:1])
        tracker.feed(ids[i : i + 1], piece)
        phases.append(tracker.phase)
    opener = tokenizer.encode("<｜DSML｜tool_calls>", add_special_tokens=False)
    assert len(opener) == 6, "the DSML opener is six tokens"
    first_tool = phases.index(Phase.TOOL_CALL)
    assert Phase.ANSWER in phases[:first_tool] and set(phases[first_tool:]) == {Phase.TOOL_CALL}
    assert tracker.reasoning_tokens == len(tokenizer.encode("Done thinking.", add_special_tokens=False))


def test_startup_names_a_tool_parser_it_cannot_track(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = harness._tokenizer(harness.ROWS[-1])
    with caplog.at_level(logging.WARNING, logger="phasespec.phases"):
        plan = plan_from_vllm(_NoReasoning(), tokenizer, None, "pythonic")
    assert plan.description["tool_call"]["tracked_by"] is None
    assert any("'pythonic'" in record.getMessage() for record in caplog.records)
    assert "pythonic" in plan.describe()["warnings"][0]


def test_startup_lists_the_markers_per_phase() -> None:
    plan = harness._plan(harness.ROWS[0])
    described = plan.describe()
    assert described["reasoning"]["markers"] == ["<think>", "</think>"]
    assert "<｜DSML｜tool_calls>" in described["tool_call"]["markers"]
    assert "<｜DSML｜toolcalls>" in described["tool_call"]["markers"]
    assert described["warnings"] == []


class _NoReasoning:
    reasoning_config = None
