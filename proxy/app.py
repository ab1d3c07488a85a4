"""The app factory: vLLM's OpenAI serving layer around phasespec's engine.

vLLM's ``build_app`` gives the routes, error handlers and middleware that
``vllm serve`` has. phasespec's own app mounts it, owns the lifespan (the
engine is created here, in this process, and shut down when the app stops)
and puts its middleware in front.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import structlog
from fastapi import FastAPI

from config import Settings
from engine.args import apply_environment, build_vllm_namespace, hook_options, request_defaults
from engine.compat import (
    find_vllm,
    require_vllm,
    serving,
    structured_output_follows_reasoning,
)
from engine.llm import BUDGET_IGNORED, PhasespecLLM
from engine.runtime import open_engine
from engine.spec_stats import PHASES as PHASE_NAMES
from engine.vllm_fixes import budget_forcing_skips_rows
from proxy.admission import AdmissionMiddleware
from proxy.auth import ApiKeyMiddleware
from proxy.body import BodyMiddleware
from proxy.chat_rewrite import ChatRewriteMiddleware, alias_reasoning_content, attach_stats, fill_reasoning_tokens
from proxy.drain import Drain, DrainMiddleware
from proxy.observer import ObserverFactory, StatsBoard
from proxy.phase_plan import plan_from_vllm
from proxy.policy import ADAPTIVE, PhaseDepths
from proxy.state import router as state_router
from proxy.summary import run_summaries

log = structlog.get_logger("phasespec.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings if settings is not None else Settings()
    require_vllm()
    apply_environment(settings)
    args = build_vllm_namespace(settings)
    _load_parser_plugins(args)

    init_app_state = serving("init_app_state")
    vllm_app = serving("build_app")(args, ("generate",), None)
    defaults = request_defaults(settings)
    options = hook_options(settings)

    board = StatsBoard()
    max_depth = 0
    budget_refusal: str | None = None
    drain = Drain(grace_s=float(args.shutdown_timeout or 0))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal max_depth, budget_refusal
        drain.loop = asyncio.get_running_loop()
        # A mounted app's own lifespan never runs: start vLLM's from here,
        # once its state (engine, OpenAI handlers) exists.
        async with open_engine(args, defaults, options) as engine:
            max_depth = engine.max_spec_depth
            budget_refusal = None if engine.applies_thinking_budget else BUDGET_IGNORED
            warn_spec_limits(engine, await engine.spec_hook_path())
            attach_observers(engine, args, settings, board)
            tasks = await engine.get_supported_tasks()
            await init_app_state(engine, vllm_app.state, args, tasks)
            app.state.engine = engine
            app.state.board = board
            tasks_running = [asyncio.create_task(watch_engine(engine, app))]
            if max_depth:
                tasks_running.append(asyncio.create_task(run_summaries(engine, settings.adaptive.summary_interval_s)))
            try:
                async with vllm_app.router.lifespan_context(vllm_app):
                    yield
            finally:
                for task in tasks_running:
                    task.cancel()

    app = FastAPI(title="phasespec", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.engine_died = False
    app.state.drain = drain
    app.state.vllm_args = args  # the HTTP-server flags among them configure uvicorn (proxy/cli.py)
    app.state.request_exit = lambda: None  # the HTTP server (proxy/cli.py) sets it
    app.add_middleware(
        ChatRewriteMiddleware,
        edits=[alias_reasoning_content, fill_reasoning_tokens(board), attach_stats(board)],
        on_end=board.forget,
    )
    app.add_middleware(BodyMiddleware, max_depth=lambda: max_depth, budget_refusal=lambda: budget_refusal)
    server = settings.server
    app.add_middleware(AdmissionMiddleware, max_inflight=server.max_inflight, max_body_bytes=server.max_body_bytes)
    app.add_middleware(ApiKeyMiddleware, keys=server.api_keys, guard_metrics=server.guard_metrics)
    app.add_middleware(DrainMiddleware, drain=drain)
    app.include_router(state_router)
    # vLLM's engine-error handler stops the server it finds here (its launcher puts its uvicorn
    # there); without it, a request that meets a dead engine gets a 500 about a missing attribute.
    vllm_app.state.server = DeadEngineExit(app)
    app.mount("/", vllm_app)
    return app


class DeadEngineExit:
    """What vLLM's engine-error handler sees as the HTTP server: setting ``should_exit`` (vLLM does
    once the engine core is dead) stops phasespec's server with exit status 1, as ``watch_engine``
    does a second later, so that a supervisor restarts the process."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    @property
    def should_exit(self) -> bool:
        return bool(self._app.state.engine_died)

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            exit_for_dead_engine(self._app)


def exit_for_dead_engine(app: FastAPI) -> None:
    if not app.state.engine_died:
        log.error("engine_dead", detail="the engine core process died; shutting down (exit status 1)")
    app.state.engine_died = True
    app.state.request_exit()


def warn_spec_limits(engine: PhasespecLLM, hook: dict[str, Any]) -> None:
    """Say at startup what per-request depth cannot do on this engine (``hook``: its path)."""
    if not engine.applies_thinking_budget:
        log.warning("thinking_token_budget is refused with a 400 (model runner v2): " + BUDGET_IGNORED)
    if engine.max_spec_depth == 0:
        log.warning(
            "no speculative decoding (K = 0): phasespec serves as plain vLLM and sets no depths; "
            "give a --speculative-config to use it"
        )
        return
    if hook["model_runner"] == "v2" and not hook["runner_honours_batch_k"]:
        log.warning(
            "vLLM's V2 model runner before 0.32 drafts K tokens every step whatever the depths "
            "(it ignores num_spec_tokens_to_schedule): depths cap what each request verifies, not what is drafted"
        )
    release = find_vllm().version
    reasoning = engine.vllm_config.reasoning_config is not None
    if reasoning and budget_forcing_skips_rows() and "thinking_budget_without_drafts" not in engine.vllm_fixes:
        log.warning(
            "vLLM %s forces a thinking budget's end string on the first request of a step without drafts only "
            "(engine/vllm_fixes.py), and phasespec's fix is not in the workers: concurrent requests may reason "
            "past their budget",
            release,
        )
    structured = getattr(engine.vllm_config, "structured_outputs_config", None)
    if getattr(structured, "reasoning_parser", None) and not structured_output_follows_reasoning(release):
        log.warning(
            "vLLM %s (before 0.26) with speculative decoding and a reasoning parser: a named or required "
            "tool call or response_format may escape its grammar after the reasoning (vLLM PR #44297 fixes "
            "it), and what it says then depends on the drafts verified, plain vLLM too (docs/vllm.md)",
            release,
        )
    mode = getattr(engine.vllm_config.compilation_config, "cudagraph_mode", None)
    if getattr(mode, "name", None) == "FULL_DECODE_ONLY":
        # vLLM captures FULL graphs for uniform decode batches of exactly 1 + K tokens per request
        # (V1: v1/worker/gpu_model_runner.py _is_uniform_decode; V2: v1/worker/gpu/cudagraph_utils.py,
        # decode_query_len); FULL_DECODE_ONLY has no graphs for other batches, so they run eagerly.
        # V1's model drafters graph only PIECEWISE (v1/spec_decode/llm_base_proposer.py
        # initialize_cudagraph_keys), none under this mode; the fork's V2 DSpark graphs FULL.
        from engine.hook import step_depth_wanted  # after require_vllm, as engine/runtime.py does

        drafter = ""
        if hook["model_runner"] == "v1" and step_depth_wanted("auto", engine.vllm_config):  # a model drafter
            drafter = "; on vLLM's V1 model runner the drafter runs without graphs in every step in this mode"
        log.warning(
            "cudagraph_mode FULL_DECODE_ONLY: a step where any request verifies fewer than K drafts "
            "runs without CUDA graphs (vLLM graphs only decode batches of 1 + K tokens per request)"
            + drafter
            + "; FULL_AND_PIECEWISE keeps piecewise graphs for those steps"
        )


async def watch_engine(engine: PhasespecLLM, app: FastAPI, interval_s: float = 1.0) -> None:
    """Stop the server when the engine core dies, so that a supervisor restarts the process.

    vLLM already ends open streams with an error and answers new requests and
    /health with 5xx once its engine core is gone; but the front end would go on
    running with a dead engine. ``vllm serve`` exits in that case; so does
    phasespec, with status 1 (proxy/cli.py)."""
    while not engine.errored:
        await asyncio.sleep(interval_s)
    exit_for_dead_engine(app)


def attach_observers(engine: PhasespecLLM, args: argparse.Namespace, settings: Settings, board: StatsBoard) -> None:
    """Give every request of ``engine`` a phase observer (policy from settings)."""
    engine.observer_factory = ObserverFactory(
        model=args.served_model_name[0] if args.served_model_name else args.model,
        phases=plan_from_vllm(engine.vllm_config, engine.get_tokenizer(), args.reasoning_parser, args.tool_call_parser),
        depths=phase_depths(settings),
        policies={name: phase_depths(settings, name) for name in ("static", "adaptive")},
        max_depth=engine.max_spec_depth,
        board=board,
    )


def phase_depths(settings: Settings, policy: str | None = None) -> PhaseDepths | None:
    """The server's policy (or ``policy`` instead of the configured one).

    The per-phase depths the user set are depths (static) or caps (adaptive);
    unset phases take the policy's defaults (PhaseDepths(), ADAPTIVE)."""
    phases = settings.phases
    policy = policy or phases.policy
    if policy == "off":
        return None
    given = {name: value for name in PHASE_NAMES if (value := getattr(phases, name)) is not None}
    return replace(ADAPTIVE if policy == "adaptive" else PhaseDepths(), **given)


def _load_parser_plugins(args: argparse.Namespace) -> None:
    """What ``vllm serve`` does before it starts: plugin parsers, then validation."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    if args.tool_parser_plugin:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin:
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
    # vLLM fills structured_outputs_config.reasoning_parser when it builds the
    # engine config; the check wants it now.
    if args.reasoning_parser and not args.structured_outputs_config.reasoning_parser:
        args.structured_outputs_config.reasoning_parser = args.reasoning_parser
    serving("validate_api_server_args")(args)
