"""phasespec settings.

Precedence: CLI flags > ``PHASESPEC_*`` environment variables > defaults.
Nested sections use ``__`` in env names (``PHASESPEC_ENGINE__KV_CACHE_GIB``)
and ``.`` on the command line (``--engine.kv_cache_gib``). Every flag that is
not a phasespec setting is a ``vllm serve`` engine flag and goes to vLLM
unchanged, so a ``vllm serve MODEL ...`` launch line becomes
``phasespec --model MODEL ...``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, CliUnknownArgs, SettingsConfigDict

from engine.controller import ControllerSettings

_CONTROLLER = ControllerSettings()
"""The controller's own defaults: the adaptive settings below start from them."""


class ServerSettings(BaseModel):
    """The HTTP side."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
    api_keys: list[str] = Field(default_factory=list)
    """Accepted API keys (Bearer); empty: no authentication."""
    guard_metrics: bool = True
    """Require a key on /metrics too (when keys are set)."""
    max_inflight: int = Field(default=64, ge=1)
    """Concurrent generation requests; more get a 429 with Retry-After."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body; larger gets a 413."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"debug", "info", "warning", "error", "critical"}:
            raise ValueError(f"unknown log level {value!r}")
        return level


class EngineSettings(BaseModel):
    """The embedded engine. Anything vLLM itself configures is a vLLM flag."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    cache_dir: Path = Path("~/.cache/phasespec").expanduser()
    """Where the embedded default model (and its self-draft) is prepared."""
    drafter: Literal["ngram", "self-draft"] = "ngram"
    """The embedded model's drafter: vLLM's ngram (proposes only where the text repeats; cheap) or
    self-draft (a 4-bit copy of the model through vLLM's draft_model method: proposes every step,
    costs a forward per draft). Your own model takes a ``--speculative-config`` instead."""
    kv_cache_gib: float = Field(default=2.0, gt=0)
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE), unless that is set."""
    default_thinking_budget: int | None = Field(default=None, ge=-1)
    """Reasoning tokens before vLLM forces the end of thinking, for requests
    that set no ``thinking_token_budget``. The embedded model uses 48; -1 (as
    in vLLM: unlimited) sets none, the embedded model included."""

    @field_validator("default_thinking_budget")
    @classmethod
    def _budget_or_unlimited(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("a default thinking budget of 0 would end every reasoning at once; -1 sets none")
        return value

    emulate_step_ms: str | None = None
    """BENCHMARKS ONLY: pad every decode step to another machine's cost shape,
    'A+B*tokens' (ms) or a profile ('moe-offload'). Off by default."""
    emulate_scale: float = Field(default=1.0, gt=0)
    """Multiplies the emulated step time (keeps its shape), so that this
    machine's real steps stay under it."""
    hold_eos_while_thinking: bool | None = None
    """Raise ``min_tokens`` to cover the request's thinking budget (its own or
    the default), so a model that would stop inside ``<think>`` reasons to the
    budget first. On by default for the embedded model only (it never ends
    reasoning itself). A request's own ``min_tokens`` wins."""


class PhaseSettings(BaseModel):
    """Per-phase speculative depth (clamped to 0..K).

    Unset phases take the policy's default: static reasoning 1, answer 2,
    tool call K; adaptive caps every phase at K. Under the adaptive policy a
    depth set here is a cap (the controller chooses 0..cap)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    policy: Literal["off", "static", "adaptive"] = "static"
    """off: every request at K (as plain vLLM); static: a depth per phase; adaptive: chosen every
    engine step from measured acceptance and step cost (the per-phase depths are caps)."""
    switching: bool | None = Field(default=None, exclude=True)
    """Replaced by ``--phases.policy off``; refused when given."""

    @field_validator("switching")
    @classmethod
    def _switching_is_gone(cls, value: bool | None) -> None:
        if value is not None:
            raise ValueError("--phases.switching was replaced by --phases.policy (off runs every request at K)")
        return None

    reasoning: int | None = Field(default=None, ge=0)
    """Depth (adaptive: cap) while the model reasons (inside <think>); static default 1."""
    answer: int | None = Field(default=None, ge=0)
    """Depth (adaptive: cap) in the final answer; static default 2."""
    tool_call: int | None = Field(default=None, ge=0)
    """Depth (adaptive: cap) inside a tool call; default K."""


class AdaptiveSettings(BaseModel):
    """The adaptive depth controller (engine/controller.py)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    explore_share: float = Field(default=_CONTROLLER.explore_share, ge=0.0, le=1.0)
    """Share of steps whose depths move at random by up to one: what the step-cost slope is learned from.
    With one depth per step: about the share of windows that re-time a depth the choice passes over."""
    settled_explore_share: float = Field(default=_CONTROLLER.settled_explore_share, ge=0.0, le=1.0)
    """The share once the slope's standard error is worth under 0.05 tokens per draft."""
    shadow_share: float = Field(default=_CONTROLLER.shadow_share, ge=0.0, le=1.0)
    """Share of steps after which the drafter proposes all K drafts (shadow drafts)."""
    warmup_steps: int = Field(default=_CONTROLLER.warmup_steps, ge=0)
    """Random steps taken first (depths drawn from 0..cap), before any cost slope is learned."""
    step_depth: Literal["auto", "on", "off"] = "auto"
    """One depth for the whole step, chosen from the step time measured at each depth, instead of a
    depth per request priced per draft. auto: on for model drafters (draft_model, EAGLE, MTP, DSpark:
    a forward pass per draft position for the whole batch), off for ngram and suffix."""
    step_max_patience: float = Field(default=_CONTROLLER.step_max_patience, ge=1.0)
    """With one depth per step: how long a depth far below the best rate waits before it is timed
    again, in units of its wait. Lower: a depth mispriced once (a slow moment) recovers sooner;
    higher: fewer steps spent re-running depths that cost more than they bring."""
    seed: int | None = None
    summary_interval_s: float = Field(default=10.0, gt=0)
    """Period of the per-phase summary log line and gauges."""


class Settings(BaseSettings):
    """phasespec: an OpenAI-compatible vLLM server with per-phase speculative
    depth. Flags not listed here are `vllm serve` flags, passed to vLLM
    unchanged (`phasespec --vllm-help` lists them)."""

    model_config = SettingsConfigDict(
        env_prefix="PHASESPEC_",
        env_nested_delimiter="__",
        cli_prog_name="phasespec",
        cli_ignore_unknown_args=True,
        cli_kebab_case=False,
        nested_model_default_partial_update=True,
        use_attribute_docstrings=True,
    )

    model: str = ""
    """Model path or name; empty serves the embedded default model."""
    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    phases: PhaseSettings = PhaseSettings()
    adaptive: AdaptiveSettings = AdaptiveSettings()
    vllm_args: CliUnknownArgs
    """`vllm serve` flags passed through (from the CLI, or ``PHASESPEC_VLLM_ARGS`` as a JSON list)."""

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _vllm_args_from_json(cls, value: object) -> object:
        # CliUnknownArgs is not JSON-decoded from the environment (NoDecode): do it here.
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"PHASESPEC_VLLM_ARGS must be a JSON list of strings: {exc}") from exc

    @property
    def uses_embedded_model(self) -> bool:
        return not self.model

    @classmethod
    def from_command_line(cls, argv: list[str]) -> Settings:
        """The settings the ``phasespec`` command runs with.

        With CLI parsing on, pydantic-settings takes ``vllm_args`` from the command
        line alone (an empty list when it has no vLLM flags), so ``PHASESPEC_VLLM_ARGS``
        would be dropped: it is put first here, and flags on the command line, which
        come after it, win (a later vLLM flag overrides an earlier one).
        """
        settings = cls(_cli_parse_args=argv)
        from_env = cls._vllm_args_from_json(os.environ.get("PHASESPEC_VLLM_ARGS", "[]"))
        if not isinstance(from_env, list) or not all(isinstance(arg, str) for arg in from_env):
            raise ValueError("PHASESPEC_VLLM_ARGS must be a JSON list of strings")
        settings.vllm_args = [*from_env, *settings.vllm_args]
        return settings
