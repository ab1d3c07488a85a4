"""OpenAI-style error responses written straight to ASGI (for middleware)."""

from __future__ import annotations

import json
from http import HTTPStatus

from starlette.types import Send


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError"}.get(
        status, HTTPStatus(status).phrase.replace(" ", "") + "Error"
    )
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()


async def openai_error(
    send: Send, status: int, message: str, param: str | None = None, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = error_body(status, message, param)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
