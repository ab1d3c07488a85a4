"""Turn phasespec settings into the argparse namespace `vllm serve` builds.

vLLM's serving layer (``build_app``, ``init_app_state``) and its engine args
are all driven by that namespace, so building it with vLLM's own parser is
what keeps every ``vllm serve`` flag working unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from config import Settings
from engine.compat import serving
from engine.default_model import MODEL_NAME, ensure_default_model
from engine.emulation import EmulationError, StepEmulation
from engine.llm import RequestDefaults

# The embedded model's engine defaults. They come before the user's flags, so
# any of them can be overridden by passing the same `vllm serve` flag.
EMBEDDED_SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
# It ends at </think>: tokens forced after it would fight structured output
# (a named tool_choice's JSON grammar starts right after reasoning ends).
EMBEDDED_REASONING_END = "\nOkay, I am done thinking.\n</think>"
EMBEDDED_THINKING_BUDGET = 48

logger = logging.getLogger("phasespec.engine")

# Flags that phasespec owns; given to vLLM they would be silently ignored.
_OWNED_FLAGS = {"--host": "--server.host", "--port": "--server.port"}
# `vllm serve` flags that configure vLLM's own HTTP server (uvicorn), which phasespec replaces
# with its own. These phasespec hands to its uvicorn as `vllm serve` does (uvicorn_options):
UVICORN_FLAGS = ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "ssl_ciphers")
# and these it sets on uvicorn's config after building it, as vLLM's launcher does:
H11_LIMITS = ("h11_max_incomplete_event_size", "h11_max_header_count")
# and these it refuses when set, never silently dropping them.
HTTP_SERVER_FLAGS = (
    "enable_ssl_refresh", "uds", "root_path", "uvicorn_log_level", "disable_access_log_for_endpoints",
)  # fmt: skip


class SettingsError(ValueError):
    """A setting or passed-through vLLM flag that cannot work."""


def embedded_speculative_config(drafter: str, cache_dir: Path) -> dict[str, Any]:
    if drafter == "self-draft":
        from engine.self_draft import ensure_self_draft

        draft = ensure_self_draft(cache_dir)
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    return EMBEDDED_SPECULATIVE_CONFIG


def embedded_engine_flags(speculative_config: dict[str, Any] = EMBEDDED_SPECULATIVE_CONFIG) -> list[str]:
    return [
        "--enforce-eager",
        # float32: greedy outputs do not depend on how many tokens a step verifies
        # (bf16 logits shift with the batch shape and flip near-ties).
        "--dtype", "float32",
        "--max-model-len", "2048",
        "--speculative-config", json.dumps(speculative_config),
        "--reasoning-parser", "deepseek_r1",
        "--reasoning-config", json.dumps({"reasoning_end_str": EMBEDDED_REASONING_END}),
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--served-model-name", MODEL_NAME,
    ]  # fmt: skip


def vllm_parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = serving("make_arg_parser")(
        FlexibleArgumentParser(prog="phasespec (vLLM engine flags)")
    )
    return parser


def engine_argv(settings: Settings) -> list[str]:
    """The `vllm serve` flags of this engine: the model (the embedded one with its flags and
    drafter, or ``--model``), then the user's vLLM flags. Plain vLLM started with them runs
    the same engine (the benchmarks against vLLM do)."""
    for flag in settings.vllm_args:
        name = flag.split("=", 1)[0]
        if name in _OWNED_FLAGS:
            raise SettingsError(f"{name} is a phasespec setting: use {_OWNED_FLAGS[name]}")
    if settings.uses_embedded_model:
        model = str(ensure_default_model(settings.engine.cache_dir))
        speculative = embedded_speculative_config(settings.engine.drafter, settings.engine.cache_dir)
        argv = ["--model", model, *embedded_engine_flags(speculative)]
    elif settings.engine.drafter != "ngram":
        raise SettingsError(
            f"--engine.drafter {settings.engine.drafter} builds a drafter for the embedded model only; "
            "give your model's drafter with --speculative-config"
        )
    else:
        argv = ["--model", settings.model]
    return [*argv, *settings.vllm_args]


def build_vllm_namespace(settings: Settings) -> argparse.Namespace:
    """Parse the engine flags exactly as `vllm serve` would."""
    validate_parsed_serve_args = serving("validate_parsed_serve_args")
    argv = engine_argv(settings)
    parser = vllm_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the reason
        raise SettingsError(f"invalid vLLM flags: {settings.vllm_args}") from exc
    unsupported = [
        "--" + dest.replace("_", "-")
        for dest in HTTP_SERVER_FLAGS
        if hasattr(args, dest) and getattr(args, dest) != parser.get_default(dest)
    ]
    if unsupported:
        raise SettingsError(
            f"{', '.join(unsupported)} configure vLLM's HTTP server, which phasespec replaces with its own; "
            "not supported (TLS certificates without reloading, --ssl-*, are; serve a socket or a path "
            "prefix through a proxy in front of phasespec; --server.log_level sets the log level)"
        )
    args.host = settings.server.host
    args.port = settings.server.port
    validate_parsed_serve_args(args)
    return args


def uvicorn_options(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The HTTP-server options of a `vllm serve` namespace, as vLLM's launcher hands them to uvicorn:
    keyword arguments of ``uvicorn.Config``, then attributes set on it (the h11 header limits)."""
    kwargs = {dest: getattr(args, dest) for dest in UVICORN_FLAGS if getattr(args, dest, None) is not None}
    kwargs["access_log"] = not getattr(args, "disable_uvicorn_access_log", False)
    limits = {dest: getattr(args, dest) for dest in H11_LIMITS if getattr(args, dest, None) is not None}
    return kwargs, limits


def apply_environment(settings: Settings) -> None:
    """Process-wide settings vLLM reads from the environment, set before it starts."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{settings.engine.kv_cache_gib:g}")
    # vLLM's CLI sets this too: the engine core must not fork a process that has
    # already started threads (uvicorn, tokenizers).
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def hook_options(settings: Settings) -> dict[str, Any]:
    """What the depth hook needs in the engine core: controller settings and the step emulation."""
    # Every adaptive setting is a ControllerSettings field (step_depth: auto/on/off, resolved in
    # the engine core), except the summary period, which the front end keeps.
    options: dict[str, Any] = {"adaptive": settings.adaptive.model_dump(exclude={"summary_interval_s"})}
    spec = settings.engine.emulate_step_ms
    if spec:
        try:
            emulation = StepEmulation.parse(spec, settings.engine.emulate_scale)
        except EmulationError as exc:
            raise SettingsError(str(exc)) from exc
        options["emulate"] = {"spec": emulation.spec, "scale": emulation.scale}
        logger.warning(
            "STEP-COST EMULATION ON (benchmarks only): every decode step is padded to %s ms; "
            "throughput is not this machine's",
            emulation.describe()["step_ms"],
        )
    return options


def request_defaults(settings: Settings) -> RequestDefaults:
    """Per-request reasoning defaults: the settings, else the embedded model's."""
    engine, embedded = settings.engine, settings.uses_embedded_model
    budget = engine.default_thinking_budget
    if budget is None and embedded:
        budget = EMBEDDED_THINKING_BUDGET
    elif budget == -1:
        budget = None
    hold = engine.hold_eos_while_thinking
    return RequestDefaults(thinking_token_budget=budget, hold_eos_while_thinking=embedded if hold is None else hold)
