"""Pure-ASGI middleware for the ``phasespec`` field of a request body.

A client may steer its own request::

    {"phasespec": {"policy": "adaptive", "depths": {"reasoning": 0, "answer": 3}, "stats": true}}

(under ``adaptive`` the depths are caps).

The field is validated here (a bad value is an OpenAI-style 400 naming the
field), then moved into ``vllm_xargs``, vLLM's own channel for extra
per-request arguments, which reaches ``SamplingParams.extra_args`` and so the
request's observer. Bodies without the field pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import openai_error
from proxy.observer import XARG_DEPTH, XARG_EXPECT_USAGE, XARG_POLICY, XARG_STATS

PATHS = ("/v1/chat/completions", "/v1/completions")
FIELD = "phasespec"
PHASES = ("reasoning", "answer", "tool_call")
POLICIES = ("static", "adaptive")


class OverrideError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def override_xargs(value: Any, max_depth: int, stream_usage: bool) -> dict[str, int | str]:
    """Validate the ``phasespec`` field; return the vllm_xargs entries it becomes."""
    if not isinstance(value, dict):
        raise OverrideError("'phasespec' must be an object", FIELD)
    unknown = set(value) - {"depths", "stats", "policy"}
    if unknown:
        raise OverrideError(f"unknown field(s) {sorted(unknown)} in 'phasespec'", f"{FIELD}.{sorted(unknown)[0]}")
    xargs: dict[str, int | str] = {}
    if "policy" in value:
        policy = value["policy"]
        if policy not in POLICIES:
            raise OverrideError(
                f"'{FIELD}.policy' must be one of {', '.join(POLICIES)}, got {policy!r}", f"{FIELD}.policy"
            )
        xargs[XARG_POLICY] = policy
    depths = value.get("depths", {})
    if not isinstance(depths, dict):
        raise OverrideError("'phasespec.depths' must be an object of phase: depth", f"{FIELD}.depths")
    for phase, depth in depths.items():
        param = f"{FIELD}.depths.{phase}"
        if phase not in PHASES:
            raise OverrideError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}", param)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= max_depth:
            raise OverrideError(f"'{param}' must be an integer in 0..{max_depth}, got {depth!r}", param)
        xargs[XARG_DEPTH + phase] = depth
    stats = value.get("stats", False)
    if not isinstance(stats, bool):
        raise OverrideError(f"'{FIELD}.stats' must be a boolean, got {stats!r}", f"{FIELD}.stats")
    if stats:
        xargs[XARG_STATS] = 1
        xargs[XARG_EXPECT_USAGE] = int(stream_usage)
    return xargs


def rewrite_body(body: bytes, max_depth: int) -> bytes:
    """The body with ``phasespec`` moved into ``vllm_xargs`` (raises OverrideError)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body  # vLLM answers malformed JSON itself
    if not isinstance(data, dict) or FIELD not in data:
        return body
    options = data.get("stream_options") or {}
    stream_usage = bool(data.get("stream")) and isinstance(options, dict) and bool(options.get("include_usage"))
    xargs = override_xargs(data.pop(FIELD), max_depth, stream_usage)
    existing = data.get("vllm_xargs") or {}
    if not isinstance(existing, dict):
        raise OverrideError("'vllm_xargs' must be an object", "vllm_xargs")
    data["vllm_xargs"] = {**existing, **xargs}
    return json.dumps(data).encode()


class OverrideMiddleware:
    def __init__(self, app: ASGIApp, max_depth: Callable[[], int]) -> None:
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if b'"' + FIELD.encode() + b'"' in body:
            try:
                body = rewrite_body(body, self.max_depth())
            except OverrideError as exc:
                await openai_error(send, 400, str(exc), exc.param)
                return
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later: disconnect notifications

    return replay
