"""Admission control: bounded in-flight generation and request body size.

Past ``max_inflight`` concurrent generation requests (POST under /v1) the
server answers 429 with ``Retry-After`` at once, rather than queueing without
bound: a client can back off, and the requests already admitted keep their
latency. A request stays in flight until its response is complete or its
client has gone (the ASGI call returns only then), so disconnects free their
slot. Bodies over ``max_body_bytes`` get a 413 before anything parses them,
on every route: a declared length is checked at once; a chunked body (no
Content-Length) is read here, up to the limit, and replayed to the app.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.body import BodyTooLarge, ClientGone, read_body, replay, with_length
from proxy.errors import openai_error


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, max_inflight: int, max_body_bytes: int, retry_after_s: int = 1) -> None:
        self.app = app
        self.max_inflight = max_inflight
        self.max_body_bytes = max_body_bytes
        self.retry_after = str(retry_after_s).encode()
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        generation = scope["path"].startswith("/v1/")
        if generation and self.inflight >= self.max_inflight:
            await openai_error(
                send,
                429,
                f"server busy: {self.inflight} requests in flight (limit {self.max_inflight}); retry later",
                None,
                [(b"retry-after", self.retry_after)],
            )
            return
        if declared is None:
            try:
                body = await read_body(receive, self.max_body_bytes)
            except BodyTooLarge:
                await self._too_large(send)
                return
            except ClientGone:
                return
            scope, receive = with_length(scope, body), replay(body, receive)
        self.inflight += generation
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= generation

    async def _too_large(self, send: Send) -> None:
        await openai_error(send, 413, f"request body exceeds {self.max_body_bytes} bytes", None)
