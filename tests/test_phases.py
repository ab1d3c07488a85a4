"""Phase tracking and the depth policy (pure logic; real tokenizer where it matters)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.phases import Phase, PhaseMarkers, PhaseTracker
from proxy.policy import PhaseDepths, choose_depth

THINK, END, TOOL, TOOL_END = 3, 4, 5, 6
MARKERS = PhaseMarkers((THINK,), (END,), (TOOL,), (TOOL_END,))


def phases_of(tracker: PhaseTracker, deltas: list[list[int]]) -> list[tuple[int, str]]:
    return [(t.index, t.phase.value) for delta in deltas for t in tracker.feed(delta)]


def test_prompt_opened_reasoning_ends_mid_delta() -> None:
    tracker = PhaseTracker(MARKERS, MARKERS.initial_phase(reasoning_ended=False))
    assert tracker.phase is Phase.REASONING
    # One speculative step emits 4 tokens with </think> in the middle.
    assert phases_of(tracker, [[10, 11], [12, END, 13, 14]]) == [(4, "answer")]
    assert tracker.tokens == {Phase.REASONING: 4, Phase.ANSWER: 2, Phase.TOOL_CALL: 0}


def test_model_opens_think_itself_and_never_closes_it() -> None:
    tracker = PhaseTracker(MARKERS, MARKERS.initial_phase(reasoning_ended=True))
    assert phases_of(tracker, [[THINK, 10, 11, 12, 13]]) == [(0, "reasoning")]
    assert tracker.phase is Phase.REASONING
    assert tracker.tokens[Phase.REASONING] == 5


def test_model_that_skips_thinking_stays_in_answer() -> None:
    tracker = PhaseTracker(MARKERS, MARKERS.initial_phase(reasoning_ended=True))
    assert phases_of(tracker, [[10, 11], [12]]) == []
    assert tracker.tokens[Phase.ANSWER] == 3


def test_tool_call_then_interleaved_thinking() -> None:
    tracker = PhaseTracker(MARKERS, Phase.REASONING)
    deltas = [[10, END, 11, TOOL, 20, 21, TOOL_END], [THINK, 30, END, 40]]
    assert phases_of(tracker, deltas) == [
        (2, "answer"),
        (3, "tool_call"),
        (7, "answer"),
        (7, "reasoning"),
        (10, "answer"),
    ]
    assert tracker.tokens == {Phase.REASONING: 5, Phase.ANSWER: 2, Phase.TOOL_CALL: 4}


def test_tool_marker_inside_reasoning_is_reasoning_text() -> None:
    tracker = PhaseTracker(MARKERS, Phase.REASONING)
    assert phases_of(tracker, [[TOOL, 10, TOOL_END]]) == []


def test_multi_token_markers_split_across_deltas() -> None:
    markers = PhaseMarkers(reasoning_end=(7, 8, 9))
    tracker = PhaseTracker(markers, Phase.REASONING)
    assert phases_of(tracker, [[1, 7], [8], [9, 2]]) == [(4, "answer")]
    assert tracker.tokens[Phase.ANSWER] == 1


def test_no_reasoning_parser_means_answer_only() -> None:
    markers = PhaseMarkers()
    assert markers.initial_phase(reasoning_ended=None) is Phase.ANSWER
    assert markers.initial_phase(reasoning_ended=False) is Phase.ANSWER


def test_embedded_tokenizer_stream_is_tracked(embedded_tokenizer: Any) -> None:
    tok = embedded_tokenizer
    ids = tok.encode(
        "let me think about it\nOkay, I am done thinking.\n</think>\n\nThe answer.", add_special_tokens=False
    )
    markers = PhaseMarkers(
        reasoning_start=tuple(tok.encode("<think>", add_special_tokens=False)),
        reasoning_end=tuple(tok.encode("</think>", add_special_tokens=False)),
    )
    assert len(markers.reasoning_end) == 1, "</think> is a single token in the embedded model"
    tracker = PhaseTracker(markers, Phase.REASONING)
    changes = [t for i in range(0, len(ids), 4) for t in tracker.feed(ids[i : i + 4])]
    end = ids.index(markers.reasoning_end[0])
    assert [(c.index, c.phase) for c in changes] == [(end + 1, Phase.ANSWER)]
    assert tracker.tokens[Phase.REASONING] == end + 1


@pytest.mark.parametrize(
    ("phase", "depths", "k", "want"),
    [
        (Phase.REASONING, PhaseDepths(), 3, 1),
        (Phase.ANSWER, PhaseDepths(), 3, 2),
        (Phase.TOOL_CALL, PhaseDepths(), 3, 3),
        (Phase.ANSWER, PhaseDepths(answer=5), 3, 3),
        (Phase.REASONING, PhaseDepths(reasoning=0), 3, 0),
        (Phase.ANSWER, PhaseDepths(), 1, 1),
        (Phase.REASONING, None, 3, 3),
        (Phase.ANSWER, PhaseDepths(), 0, 0),
    ],
)
def test_choose_depth(phase: Phase, depths: PhaseDepths | None, k: int, want: int) -> None:
    assert choose_depth(phase, depths, k) == want
