"""``GET /phasespec/state``: what the server holds right now (for operators and tests)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from engine.compat import require_vllm

router = APIRouter()


@router.get("/phasespec/state")
async def state(request: Request) -> dict[str, Any]:
    engine = request.app.state.engine
    settings = request.app.state.settings
    controller = await engine.controller_state() if engine.max_spec_depth else None
    observers = engine.observer_factory
    return {
        "vllm": {**asdict(found := require_vllm()), "tested": found.tested},
        "policy": settings.phases.policy,
        "speculation": {"max_depth": engine.max_spec_depth, "per_request_depth": engine.max_spec_depth > 0},
        "phases": observers.phases.describe() if observers is not None else None,
        "emulation": (controller or {}).get("emulation"),
        "controller": controller,
        "engine": await engine.spec_hook_state(),
        "hook": await engine.spec_hook_path(),
        "frontend_unfinished": engine.output_processor.get_num_unfinished_requests(),
        "stats_board": len(request.app.state.board),
    }
