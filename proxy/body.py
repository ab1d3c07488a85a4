"""Request bodies in pure ASGI: read once (bounded), check, rewrite, replay to the app."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy import strict
from proxy.errors import openai_error
from proxy.overrides import OverrideError, apply_overrides, mark_forced_tool_call

PATHS = (strict.CHAT, strict.COMPLETIONS)


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


async def read_body(receive: Receive, limit: int | None = None) -> bytes:
    """The whole body; BodyTooLarge past ``limit`` bytes (chunked bodies declare no length)."""
    chunks: list[bytes] = []
    seen = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        seen += len(chunk)
        if limit is not None and seen > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app ``body`` first, then passes on (disconnect notices)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def with_length(scope: Scope, body: bytes) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}


class BodyMiddleware:
    """The completion routes: OpenAI-strict checks (proxy/strict.py), then the ``phasespec`` field."""

    def __init__(
        self, app: ASGIApp, max_depth: Callable[[], int], budget_refusal: Callable[[], str | None] = lambda: None
    ) -> None:
        self.app = app
        self.max_depth = max_depth
        self.budget_refusal = budget_refusal
        """Why the engine cannot honour ``thinking_token_budget`` (None: it can)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive)
        except ClientGone:
            return
        try:
            data = strict.parse(body)
            strict.check(scope["path"], data)
            refusal = self.budget_refusal()
            if refusal is not None and data.get("thinking_token_budget") is not None:
                raise strict.Invalid(f"thinking_token_budget: {refusal}", "thinking_token_budget")
            forced = scope["path"] == strict.CHAT and mark_forced_tool_call(data)
            if apply_overrides(data, self.max_depth()) or forced:
                body = json.dumps(data).encode()
                scope = with_length(scope, body)
        except (strict.Invalid, OverrideError) as exc:
            await openai_error(send, 400, str(exc), exc.param)
            return
        await self.app(scope, replay(body, receive), send)
