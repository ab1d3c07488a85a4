"""The adaptive controller and the step-cost emulation on the real engine.

One engine whose decode steps are padded to ``0 + 200 ms * tokens``. The
profile must stay well above this machine's own step time: where a one-token
step overruns its padding, the first draft costs only the difference and
depth 1 can truly pay (with 60 ms a token the controller learned, rightly,
84 ms a step plus 52 ms a draft on 2026-12-02: depth 1 pays above 62%
acceptance, and it chose depth 1 or 2 on most steps; at 120 ms, on a slow day, 159 ms a step plus
107 ms a draft, where depth 1 pays too). At 200 ms a draft costs as much as
the token it might save, so depth 0 is right at any acceptance below 1, and
the controller must learn the cost and stop drafting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from config import Settings
from config.settings import EngineSettings
from engine.emulation import StepEmulation
from engine.llm import PhasespecLLM, SpecRequest
from load.workload import copy_prompt
from tests.engine_fixture import engine_context, run

pytestmark = pytest.mark.engine

SPEC = "0+200*tokens"
NO_BUDGET = 10_000
EMULATION = StepEmulation.parse(SPEC)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine() -> AsyncIterator[PhasespecLLM]:
    settings = Settings(engine=EngineSettings(emulate_step_ms=SPEC))
    async with engine_context(settings) as llm:
        yield llm


@pytest.mark.asyncio(loop_scope="session")
async def test_decode_steps_are_padded_to_the_profile_and_overruns_counted(engine: PhasespecLLM) -> None:
    await engine.drain_step_log()
    result = await run(engine, copy_prompt(0), "emu-pad", SpecRequest(depth=3))
    steps = await engine.drain_step_log()
    assert len(steps) > 20
    for _, tokens, _, seconds in steps:
        assert seconds >= EMULATION.target_s(tokens) - 1e-3
    emulation = (await engine.controller_state())["emulation"]
    assert emulation["spec"] == SPEC and emulation["padded_steps"] > 0
    assert emulation["padded_steps"] + emulation["overrun_steps"] >= len(steps)
    assert result.spec.final is not None and result.spec.final["emulation"]["spec"] == SPEC


@pytest.mark.asyncio(loop_scope="session")
async def test_controller_learns_the_steep_cost_and_stops_drafting(engine: PhasespecLLM) -> None:
    # No thinking budget in reach: near one an adaptive request holds its depth
    # (engine/hook.py), and with the fixture's budget of 24 only the first 8
    # tokens of each request were planned: too few random steps to learn from.
    spec = SpecRequest(depth=3, adaptive=True, phase="reasoning")
    for i in range(3):  # warm-up: the cost slope and the phase acceptance
        await run(engine, copy_prompt(i), f"emu-warm-{i}", replace(spec), thinking_budget=NO_BUDGET)
    cost = (await engine.controller_state())["cost"]["1"]
    assert 100 <= cost["per_draft_ms"] <= 300, cost  # padded: 200 ms per verified token
    await engine.controller_state(reset_window=True)
    for i in range(3, 6):
        await run(engine, copy_prompt(i), f"emu-{i}", replace(spec), thinking_budget=NO_BUDGET)
    window = (await engine.controller_state(reset_window=True))["phases"]
    steps = window["reasoning"]["steps_by_depth"]
    # Random steps (5%) move a decided depth 0 to 0 or 1; every decided step should be depth 0.
    assert steps[0] >= 0.8 * sum(steps), (cost, window)
