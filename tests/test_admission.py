"""The admission middleware's promises (429 with Retry-After past the in-flight bound, 413 past
the body limit), on the real middleware in front of a stand-in app that holds requests open.
The same middleware under Locust against the real engine: tests/test_api_keys_limits_and_sigterm.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from proxy.admission import AdmissionMiddleware


class HeldApp:
    """Answers 200 once released, so requests stay in flight as long as a test wants."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.asyncio
async def test_past_the_bound_a_generation_request_gets_429_with_retry_after_at_once() -> None:
    app = HeldApp()
    transport = httpx.ASGITransport(app=AdmissionMiddleware(app, max_inflight=2, max_body_bytes=1024))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        held = [asyncio.create_task(client.post("/v1/chat/completions", json={})) for _ in range(2)]
        await asyncio.sleep(0.05)
        busy = await asyncio.wait_for(client.post("/v1/chat/completions", json={}), timeout=1)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == 429 and "limit 2" in busy.json()["error"]["message"]
        app.release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert (await client.post("/v1/chat/completions", json={})).status_code == 200, "slots free again"


@pytest.mark.asyncio
async def test_a_body_over_the_limit_gets_413_declared_or_chunked() -> None:
    app = HeldApp()
    app.release.set()
    transport = httpx.ASGITransport(app=AdmissionMiddleware(app, max_inflight=2, max_body_bytes=1024))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        declared = await client.post("/tokenize", content=b"x" * 2048)
        assert declared.status_code == 413 and declared.json()["error"]["code"] == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length
            for _ in range(4):
                yield b"x" * 512

        chunked = await client.post("/v1/completions", content=chunks())
        assert chunked.status_code == 413
        assert (await client.post("/v1/completions", content=b"x" * 1000)).status_code == 200
