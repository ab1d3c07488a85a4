"""Server-sent events as phasespec (and vLLM) stream them, for load clients.

``SSEParser`` turns raw body chunks (split anywhere) into events;
``StreamTimer`` turns a chat stream's events into what a chat user feels:
time to first token, time to first answer token, gaps between tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SSEParser:
    _buffer: str = ""

    def feed(self, chunk: bytes | str) -> list[str]:
        """The ``data`` payloads of the events completed by this chunk."""
        self._buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        self._buffer = self._buffer.replace("\r\n", "\n")
        *complete, self._buffer = self._buffer.split("\n\n")
        payloads = []
        for event in complete:
            data = [line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:")]
            if data:
                payloads.append("\n".join(data))
        return payloads


@dataclass(slots=True)
class StreamTimer:
    """Per-request timings of a streamed chat completion (seconds, from ``start``)."""

    start: float
    first_token: float | None = None
    first_answer: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    chunks: int = 0
    usage: dict[str, Any] | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    done: bool = False

    def add(self, payload: str, now: float) -> None:
        if payload == "[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = str(chunk["error"])
            return
        self.usage = chunk.get("usage") or self.usage
        self.report = chunk.get("phasespec") or self.report
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            answer = bool(delta.get("content")) or bool(delta.get("tool_calls"))
            if not (answer or delta.get("reasoning")):
                continue
            self.chunks += 1
            if self.first_token is None:
                self.first_token = now - self.start
            elif self.last_token is not None:
                self.gaps.append(now - self.start - self.last_token)
            self.last_token = now - self.start
            if answer and self.first_answer is None:
                self.first_answer = now - self.start

    @property
    def mean_gap(self) -> float | None:
        return sum(self.gaps) / len(self.gaps) if self.gaps else None

    @property
    def max_gap(self) -> float | None:
        return max(self.gaps) if self.gaps else None
