"""``GET /phasespec/state``: what the server holds right now (for operators and tests)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/phasespec/state")
async def state(request: Request) -> dict[str, Any]:
    engine = request.app.state.engine
    return {
        "engine": await engine.spec_hook_state(),
        "frontend_unfinished": engine.output_processor.get_num_unfinished_requests(),
        "stats_board": len(request.app.state.board),
    }
