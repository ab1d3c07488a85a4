"""Pure-ASGI middleware that edits (chat) completion payloads on their way out.

vLLM returns reasoning as ``reasoning``; many clients still read the older
``reasoning_content``. Rather than fork vLLM's 1,300-line chat handler we copy
the field in the serialized response: streamed events are edited one SSE
event at a time (never re-chunked, so streaming latency is unchanged), and
JSON bodies once, with Content-Length fixed up.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.observer import StatsBoard

Payload = dict[str, Any]
PayloadEdit = Callable[[Payload], None]

PATHS = ("/v1/chat/completions", "/v1/completions")


def alias_reasoning_content(payload: Payload) -> None:
    """Add ``reasoning_content`` next to every ``reasoning`` vLLM wrote."""
    for choice in payload.get("choices") or ():
        for key in ("message", "delta"):
            part = choice.get(key)
            # A delta without reasoning says nothing; a message always has the field.
            if isinstance(part, dict) and "reasoning" in part and (key == "message" or part["reasoning"] is not None):
                part["reasoning_content"] = part["reasoning"]


def attach_stats(board: StatsBoard) -> PayloadEdit:
    """Put a finished request's phase report (if the client asked) into the
    payload that ends it: the usage chunk of a stream, or the response."""

    def edit(payload: Payload) -> None:
        request_id = payload.get("id")
        if not isinstance(request_id, str) or not len(board):
            return
        choices = payload.get("choices") or ()
        is_last = any(c.get("finish_reason") for c in choices)
        report = board.take(request_id, payload.get("usage") is not None, is_last)
        if report is not None:
            payload["phasespec"] = report

    return edit


def fill_reasoning_tokens(board: StatsBoard) -> PayloadEdit:
    """``usage.completion_tokens_details.reasoning_tokens`` from phasespec's count
    where vLLM's is missing or zero (vLLM 0.32 counts 0 when the prompt, not the
    output, opens ``<think>``, as the embedded model's template does)."""

    def edit(payload: Payload) -> None:
        usage, request_id = payload.get("usage"), payload.get("id")
        if not isinstance(usage, dict) or not isinstance(request_id, str):
            return
        tokens = board.take_reasoning(request_id)
        details = usage.get("completion_tokens_details")
        if not tokens or (isinstance(details, dict) and details.get("reasoning_tokens")):
            return
        usage["completion_tokens_details"] = {
            **(details if isinstance(details, dict) else {}),
            "reasoning_tokens": tokens,
        }

    return edit


def _dump(payload: Payload) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def edit_sse_event(event: bytes, edits: Sequence[PayloadEdit], ids: set[str] | None = None) -> bytes:
    """Edit one ``data: {...}`` event; anything else passes through as is."""
    if not event.startswith(b"data: {"):
        return event
    payload = json.loads(event[6:])
    for edit in edits:
        edit(payload)
    if ids is not None:
        _note_id(payload, ids)
    return b"data: " + _dump(payload)


def _note_id(payload: Any, ids: set[str]) -> None:
    if isinstance(payload, dict) and isinstance(payload.get("id"), str):
        ids.add(payload["id"])


class ChatRewriteMiddleware:
    """Apply payload edits to successful chat-completion responses."""

    def __init__(self, app: ASGIApp, edits: list[PayloadEdit], on_end: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.edits = edits
        self.on_end = on_end
        """Called with each response id once its response has ended (to free what it left)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PATHS or not self.edits:
            await self.app(scope, receive, send)
            return
        mode: str | None = None  # "sse", "json" or None (pass through)
        start: Message = {}
        pending = b""
        ids: set[str] = set()

        async def rewrite(message: Message) -> None:
            nonlocal mode, start, pending
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if message["status"] == 200 and content_type.startswith(b"text/event-stream"):
                    mode = "sse"
                elif message["status"] == 200 and content_type.startswith(b"application/json"):
                    mode, start = "json", message
                    return  # sent with the body, once its length is known
                await send(message)
                return
            if message["type"] != "http.response.body" or mode is None:
                await send(message)
                return
            pending += message.get("body", b"")
            more = message.get("more_body", False)
            if mode == "json":
                if more:
                    return
                payload = json.loads(pending) if pending else None
                _note_id(payload, ids)
                body = _dump(self._edited(payload)) if payload is not None else pending
                headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            *events, pending = pending.split(b"\n\n")
            if not more and pending:
                events.append(pending)
                pending = b""
            out = b"".join(edit_sse_event(e, self.edits, ids) + b"\n\n" for e in events)
            await send({"type": "http.response.body", "body": out, "more_body": more})

        try:
            await self.app(scope, receive, rewrite)
        finally:
            if self.on_end is not None:
                for request_id in ids:
                    self.on_end(request_id)

    def _edited(self, payload: Payload) -> Payload:
        for edit in self.edits:
            edit(payload)
        return payload
