"""OpenAI-strict checks of completion request bodies, where vLLM is lax.

vLLM's request models are pydantic in lax mode: ``"stream": "yes"`` becomes
True, ``"max_tokens": "8"`` becomes 8, any message role is accepted. The
OpenAI API answers all of these with 400 naming the parameter, and so does
phasespec: this module checks the *types, shapes and ranges* of the OpenAI
fields of the two completion routes before vLLM sees the body. Everything
else (vLLM's extra fields such as ``chat_template_kwargs``,
``thinking_token_budget``, ``vllm_xargs``; semantic checks such as the model
name or the context length) is left to vLLM, so well-formed requests pass
unchanged.
"""

from __future__ import annotations

import json
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class Invalid(ValueError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def parse(body: bytes) -> Any:
    """The JSON body, or Invalid: bad UTF-8, bad JSON and absurd nesting are all 400s."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid(f"request body is not valid UTF-8 (byte {exc.start})", None) from None
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise Invalid(f"request body is not valid JSON: {exc}", None) from None
    except RecursionError:
        raise Invalid("request body nests JSON too deeply", None) from None


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null"
    )


# field: (kind, low, high); None bounds are unchecked (vLLM checks them).
COMMON: dict[str, tuple[str, float | None, float | None]] = {
    "model": ("string", None, None),
    "stream": ("boolean", None, None),
    "max_tokens": ("integer", None, None),
    "n": ("integer", 1, 128),
    "seed": ("integer", None, None),
    "temperature": ("number", 0, 2),
    "top_p": ("number", 0, 1),
    "presence_penalty": ("number", -2, 2),
    "frequency_penalty": ("number", -2, 2),
    "user": ("string", None, None),
    "stream_options": ("object", None, None),
    "logit_bias": ("object", None, None),
}
CHAT_FIELDS = {
    **COMMON,
    "messages": ("array", None, None),
    "logprobs": ("boolean", None, None),
    "top_logprobs": ("integer", 0, 20),
    "max_completion_tokens": ("integer", None, None),
    "parallel_tool_calls": ("boolean", None, None),
    "store": ("boolean", None, None),
    "tools": ("array", None, None),
    "response_format": ("object", None, None),
    "metadata": ("object", None, None),
}
COMPLETION_FIELDS = {
    **COMMON,
    "echo": ("boolean", None, None),
    "logprobs": ("integer", 0, 5),
    "best_of": ("integer", 1, 20),
    "suffix": ("string", None, None),
}
KINDS = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": _is_int,
    "number": _is_number,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def check(path: str, data: Any) -> None:
    """Raise Invalid (message, param) for what the OpenAI API would reject with a 400."""
    if not isinstance(data, dict):
        raise Invalid(f"the request body must be a JSON object, got {_type_name(data)}", None)
    fields = CHAT_FIELDS if path == CHAT else COMPLETION_FIELDS
    for name, (kind, low, high) in fields.items():
        value = data.get(name)
        if value is None:
            continue  # absent, or null: OpenAI's "use the default"
        if not KINDS[kind](value):
            raise Invalid(f"'{name}' must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, got {value!r:.40}", name)
        if (low is not None and value < low) or (high is not None and value > high):
            raise Invalid(f"'{name}' must be between {low:g} and {high:g}, got {value!r}", name)
    _check_stop(data.get("stop"))
    _check_stream_options(data)
    if path == CHAT:
        _check_messages(data.get("messages"))
    else:
        _check_prompt(data.get("prompt"))


def _check_stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise Invalid(f"'stop' must be a string or an array of strings, got {stop!r:.40}", "stop")


def _check_stream_options(data: dict[str, Any]) -> None:
    options = data.get("stream_options") or {}
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise Invalid(f"'stream_options.include_usage' must be a boolean, got {usage!r:.40}", "stream_options")


def _check_messages(messages: Any) -> None:
    for i, message in enumerate(messages or []):
        if not isinstance(message, dict):
            raise Invalid(f"'messages[{i}]' must be an object, got {_type_name(message)}", f"messages[{i}]")
        role = message.get("role")
        if role is not None and role not in ROLES:
            raise Invalid(
                f"'messages[{i}].role' must be one of {', '.join(ROLES)}, got {role!r:.40}", f"messages[{i}].role"
            )
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise Invalid(f"'messages[{i}].name' must be a string, got {name!r:.40}", f"messages[{i}].name")


def _check_prompt(prompt: Any) -> None:
    if prompt is None or isinstance(prompt, str):
        return
    if isinstance(prompt, list) and (
        all(isinstance(p, str) for p in prompt)
        or all(_is_int(p) for p in prompt)
        or all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt)
    ):
        return
    raise Invalid(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of token-id arrays",
        "prompt",
    )
