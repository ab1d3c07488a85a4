"""SSE parsing and stream timing for the load clients (pure)."""

from __future__ import annotations

import json

from load.sse import SSEParser, StreamTimer


def chunk(**delta: object) -> str:
    return json.dumps({"id": "x", "choices": [{"index": 0, "delta": delta}]})


def test_events_split_anywhere_are_reassembled() -> None:
    raw = f"data: {chunk(reasoning='a')}\n\ndata: {chunk(content='b')}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n".encode()
    parser = SSEParser()
    payloads = [p for i in range(0, len(raw), 7) for p in parser.feed(raw[i : i + 7])]
    assert payloads == [chunk(reasoning="a"), chunk(content="b"), "[DONE]"]


def test_multi_line_data_is_joined() -> None:
    assert SSEParser().feed("data: a\ndata: b\n\n") == ["a\nb"]


def test_timer_separates_first_token_first_answer_and_gaps() -> None:
    timer = StreamTimer(start=10.0)
    timer.add(chunk(role="assistant", content=""), 10.1)  # the role chunk carries no token
    timer.add(chunk(reasoning="think"), 10.5)
    timer.add(chunk(reasoning="more"), 10.7)
    timer.add(chunk(content="answer"), 11.0)
    timer.add(
        json.dumps({"id": "x", "choices": [], "usage": {"completion_tokens": 3}, "phasespec": {"phases": {}}}), 11.1
    )
    timer.add("[DONE]", 11.2)
    assert timer.first_token == 0.5
    assert timer.first_answer == 1.0
    assert [round(g, 3) for g in timer.gaps] == [0.2, 0.3]
    assert timer.max_gap is not None and round(timer.max_gap, 3) == 0.3
    assert timer.usage == {"completion_tokens": 3} and timer.report == {"phases": {}}
    assert timer.done and timer.error is None


def test_timer_records_stream_errors() -> None:
    timer = StreamTimer(start=0.0)
    timer.add(json.dumps({"error": {"message": "boom", "code": 500}}), 0.1)
    assert timer.error is not None and "boom" in timer.error
