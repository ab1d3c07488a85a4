"""The ``phasespec`` field of a request body (applied by proxy/body.py).

A client may steer its own request::

    {"phasespec": {"policy": "adaptive", "depths": {"reasoning": 0, "answer": 3}, "stats": true}}

(under ``adaptive`` the depths are caps).

The field is validated here (a bad value is an OpenAI-style 400 naming the
field), then moved into ``vllm_xargs``, vLLM's own channel for extra
per-request arguments, which reaches ``SamplingParams.extra_args`` and so the
request's observer. Bodies without the field pass through untouched.
"""

from __future__ import annotations

from typing import Any

from engine.spec_stats import PHASES
from proxy.observer import XARG_DEPTH, XARG_EXPECT_USAGE, XARG_FORCED_TOOL, XARG_POLICY, XARG_STATS

FIELD = "phasespec"
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


def mark_forced_tool_call(data: dict[str, Any]) -> bool:
    """Tag a chat request whose ``tool_choice`` forces a tool call (``required`` or a named
    function) for its observer (proxy/phases.py, ``ForcedToolCall``); False if it does not."""
    choice = data.get("tool_choice")
    if not data.get("tools") or not (choice == "required" or isinstance(choice, dict)):
        return False
    _add_xargs(data, {XARG_FORCED_TOOL: 1})
    return True


def apply_overrides(data: dict[str, Any], max_depth: int) -> bool:
    """Move ``phasespec`` into ``vllm_xargs`` in place (raises OverrideError); False if absent."""
    if FIELD not in data:
        return False
    options = data.get("stream_options") or {}
    stream_usage = bool(data.get("stream")) and isinstance(options, dict) and bool(options.get("include_usage"))
    _add_xargs(data, override_xargs(data.pop(FIELD), max_depth, stream_usage))
    return True


def _add_xargs(data: dict[str, Any], xargs: dict[str, int | str]) -> None:
    """Merge into the body's ``vllm_xargs`` (vLLM's channel to ``SamplingParams.extra_args``)."""
    existing = data.get("vllm_xargs") or {}
    if not isinstance(existing, dict):
        raise OverrideError("'vllm_xargs' must be an object", "vllm_xargs")
    data["vllm_xargs"] = {**existing, **xargs}
