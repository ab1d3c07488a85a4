"""The engine's life: created inside the app lifespan, shut down in ``finally``."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from engine.compat import require_vllm
from engine.llm import PhasespecLLM, RequestDefaults
from engine.spec_stats import EXTRA_KEY
from engine.vllm_fixes import WORKER_EXTENSION


@asynccontextmanager
async def open_engine(
    args: argparse.Namespace, defaults: RequestDefaults, hook_options: dict[str, Any] | None = None
) -> AsyncIterator[PhasespecLLM]:
    """Start vLLM's engine core (its own child process) and stop it on exit.

    Mirrors ``vllm serve``'s ``build_async_engine_client_from_engine_args`` so
    the engine sees the same configuration it would under ``vllm serve``.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    engine_args = AsyncEngineArgs.from_cli_args(args)
    usage = UsageContext.OPENAI_API_SERVER
    vllm_config = engine_args.create_engine_config(usage_context=usage)
    install_depth_hook(vllm_config, hook_options or {})
    engine = cast(
        PhasespecLLM,
        PhasespecLLM.from_vllm_config(
            vllm_config=vllm_config,
            usage_context=usage,
            enable_log_requests=engine_args.enable_log_requests,
            aggregate_engine_logging=engine_args.aggregate_engine_logging,
            disable_log_stats=engine_args.disable_log_stats,
        ),
    )
    try:
        engine.configure(defaults)
        if vllm_config.parallel_config.worker_extension_cls == WORKER_EXTENSION:
            fixes = await engine.collective_rpc("phasespec_vllm_fixes")
            engine.vllm_fixes = tuple(sorted({name for worker in fixes for name in worker}))
        await engine.reset_mm_cache()
        yield engine
    finally:
        engine.shutdown(timeout=vllm_config.shutdown_timeout)


def install_depth_hook(vllm_config: Any, options: dict[str, Any]) -> None:
    """Make vLLM build phasespec's scheduler (engine/hook.py) in the engine core.

    Naming a scheduler class stops vLLM from picking its async scheduler by
    itself, so the hook's twin is chosen from the resolved setting. The hook's
    options (controller, emulation) travel in ``additional_config``, which
    vLLM hands to the engine core with the rest of its config.
    """
    require_vllm()  # before the hook imports any vLLM internal: names whatever is missing
    from engine.hook import scheduler_class

    if not isinstance(vllm_config.additional_config, dict):
        raise ValueError("phasespec's depth hook needs additional_config to be a dict")
    vllm_config.additional_config[EXTRA_KEY] = options
    sched = vllm_config.scheduler_config
    if sched.scheduler_cls is not None:
        raise ValueError(f"--scheduler-cls {sched.scheduler_cls!r} cannot be combined with phasespec's depth hook")
    sched.scheduler_cls = scheduler_class(bool(sched.async_scheduling))
    install_sampler_fixes(vllm_config)


def install_sampler_fixes(vllm_config: Any) -> None:
    """Load engine/vllm_fixes.py into vLLM's workers as their extension where a fix may be needed.

    The CPU engine (its expand fix's probe runs in the worker), and an engine whose thinking-budget
    holder fails a probe (vLLM 0.23-0.26 on GPUs). A worker extension of the
    user's own cannot be combined with it, and is refused rather than dropped."""
    from vllm.platforms import current_platform

    from engine.vllm_fixes import worker_fixes_wanted

    reasoning = vllm_config.reasoning_config is not None
    speculative = vllm_config.speculative_config is not None
    if not worker_fixes_wanted(current_platform.is_cpu(), reasoning, speculative):
        return
    parallel = vllm_config.parallel_config
    if parallel.worker_extension_cls:
        raise ValueError(
            f"--worker-extension-cls {parallel.worker_extension_cls!r} cannot be combined with phasespec here: "
            "phasespec's own worker extension fixes vLLM's sampling (engine/vllm_fixes.py: CPU speculative "
            "sampling, or thinking budgets in steps without drafts)"
        )
    parallel.worker_extension_cls = WORKER_EXTENSION
