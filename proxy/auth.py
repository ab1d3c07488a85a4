"""API keys: ``Authorization: Bearer <key>`` on every /v1 route and /metrics.

``/health`` is never guarded (load balancers probe it); ``/metrics`` can be
opened with a setting. Keys are compared with ``hmac.compare_digest`` against
every configured key, so timing says nothing about which key or how much of
it matched.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import openai_error


def is_guarded(path: str, guard_metrics: bool) -> bool:
    if path == "/health":
        return False
    if path == "/metrics" or path.startswith("/metrics/"):
        return guard_metrics
    return True


def key_matches(header: bytes | None, keys: list[bytes]) -> bool:
    if header is None or header[:7].lower() != b"bearer ":
        return False
    presented = header[7:].strip()
    matched = False
    for key in keys:  # no early exit: the time spent does not depend on which key matched
        matched |= hmac.compare_digest(presented, key)
    return matched


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: list[str], guard_metrics: bool = True) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.guard_metrics = guard_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not is_guarded(scope["path"], self.guard_metrics):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization")
        if not key_matches(header, self.keys):
            message = "missing API key" if header is None else "invalid API key"
            await openai_error(
                send, 401, f"{message}: send 'Authorization: Bearer <key>'", None, [(b"www-authenticate", b"Bearer")]
            )
            return
        await self.app(scope, receive, send)
