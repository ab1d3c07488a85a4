"""Draining shutdown: finish what is in flight, within a grace period, then cut.

On SIGTERM (proxy/cli.py) the HTTP server stops listening, so new connections
are refused and a load balancer's health check fails over, and uvicorn closes
idle keep-alive connections on its next tick (0.1 s); a request that lands
before that tick gets 503 with ``Retry-After``.
Requests in flight run on for up to the grace period, which is vLLM's own
``--shutdown-timeout`` (0, vLLM's default, means abort at once, as ``vllm
serve`` does). When it expires, every response still running is cut here: a
stream gets a final OpenAI-style error event and ``[DONE]``, as vLLM ends a
stream that fails; a response not yet started gets a 503. Cancelling the
handler makes vLLM abort the engine request, so nothing stays in the engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import error_body, openai_error

SHUTTING_DOWN = "the server is shutting down; retry on another instance"


@dataclass(slots=True)
class Drain:
    grace_s: float = 0.0
    draining: bool = False
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.AbstractEventLoop | None = None
    """The server's event loop (set at startup): signal handlers hand over to it."""

    def request(self) -> None:
        """From a signal handler: begin draining on the server's loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.start)

    def start(self) -> None:
        """Begin draining (idempotent); in-flight responses are cut after the grace period."""
        if self.draining:
            return
        self.draining = True
        asyncio.get_running_loop().call_later(self.grace_s, self.cut.set)


class DrainMiddleware:
    def __init__(self, app: ASGIApp, drain: Drain, retry_after_s: int = 1) -> None:
        self.app = app
        self.drain = drain
        self.retry_after = str(retry_after_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await openai_error(send, 503, SHUTTING_DOWN, None, [(b"retry-after", self.retry_after)])
            return
        started: list[Message] = []

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.append(message)
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, receive, tracked))
        cut = asyncio.ensure_future(self.drain.cut.wait())
        try:
            await asyncio.wait((handler, cut), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
        if handler.done():
            handler.result()  # re-raise what the app raised
            return
        handler.cancel()  # vLLM aborts the engine request when its handler is cancelled
        await asyncio.wait((handler,))
        if not started:
            await openai_error(send, 503, SHUTTING_DOWN, None, [(b"retry-after", self.retry_after)])
        elif _is_stream(started[0]):
            event = b"data: " + error_body(503, SHUTTING_DOWN) + b"\n\ndata: [DONE]\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _is_stream(start: Message) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in start["headers"])
