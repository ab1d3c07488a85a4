"""Engine-core utility calls: how the front end reaches the depth hook between engine steps.

vLLM runs a utility call (``EngineCoreClient.call_utility_async``) in the engine-core
process between two steps, so these functions read and change the scheduler's state
without locking. ``install_utilities`` adds them to vLLM's ``EngineCore`` as
``phasespec_*`` methods; ``DepthScheduler`` calls it when the engine core builds it,
before any call can arrive.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vllm.v1.engine.core import EngineCore

from engine.spec_stats import SpecLedger

if TYPE_CHECKING:
    from engine.controller import DepthController
    from engine.hook import DepthScheduler


def _ledger(core: EngineCore) -> SpecLedger:
    ledger = getattr(core.scheduler, "spec_ledger", None)
    if not isinstance(ledger, SpecLedger):
        raise RuntimeError("phasespec's depth hook is not installed in this engine")
    return ledger


def _set_depth(self: EngineCore, group: str, depth: int, phase: str | None, adaptive: bool = False) -> bool:
    scheduler = self.scheduler
    return _ledger(self).set_depth(group, depth, phase, scheduler.current_step, adaptive)  # type: ignore[attr-defined]


def _controller_state(self: EngineCore, reset_window: bool) -> dict[str, Any]:
    _ledger(self)  # raises if the hook is missing
    scheduler: DepthScheduler = self.scheduler  # type: ignore[assignment]
    state = scheduler.controller.snapshot(reset_window)
    emulation = scheduler.emulation
    state["emulation"] = {**emulation.describe(), **scheduler.pads.as_dict()} if emulation is not None else None
    return state


def _stats(self: EngineCore, group: str) -> dict[str, Any] | None:
    return _ledger(self).snapshot(group)


def _pop_stats(self: EngineCore, group: str) -> dict[str, Any] | None:
    return _ledger(self).pop(group)


def _hook_state(self: EngineCore) -> dict[str, int]:
    running, waiting = self.scheduler.get_request_counts()
    return {**_ledger(self).sizes(), "running": running, "waiting": waiting}


def _hook_path(self: EngineCore) -> dict[str, Any]:
    _ledger(self)  # raises if the hook is missing
    scheduler: DepthScheduler = self.scheduler  # type: ignore[assignment]
    return scheduler.describe()


def _drain_steps(self: EngineCore) -> list[tuple[int, int, int, float]]:
    scheduler = self.scheduler
    _ledger(self)  # raises if the hook is missing
    steps = list(scheduler.step_log)  # type: ignore[attr-defined]
    scheduler.step_log.clear()  # type: ignore[attr-defined]
    return steps


def _configure_controller(self: EngineCore, changes: dict[str, Any]) -> dict[str, Any]:
    """Change controller settings at run time (benchmarks and tests); returns the old values."""
    _ledger(self)
    controller: DepthController = self.scheduler.controller  # type: ignore[attr-defined]
    old = {name: getattr(controller.settings, name) for name in changes}
    if "explore_depths" in changes:
        changes = {**changes, "explore_depths": tuple(changes["explore_depths"])}
    controller.reconfigure(replace(controller.settings, **changes))
    return old


def _cpu_probe(self: EngineCore, rounds: int = 5) -> float:
    """Seconds a fixed piece of pure-Python work takes in the engine-core thread, best of ``rounds``:
    the host's speed for the engine core's own loop, between steps (benchmarks: on the GPU hosts
    the host's speed drifted up to 2x within a run, GPU session 19, docs/gpu.md)."""
    best = math.inf
    for _ in range(rounds):
        started = time.perf_counter()
        table: dict[int, list[int]] = {}
        for i in range(50_000):
            table.setdefault(i & 255, []).append(i * i % 7)
        sum(len(v) for v in table.values())
        best = min(best, time.perf_counter() - started)
    return best


UTILITY_METHODS = {
    "phasespec_set_depth": _set_depth,
    "phasespec_stats": _stats,
    "phasespec_pop_stats": _pop_stats,
    "phasespec_hook_state": _hook_state,
    "phasespec_hook_path": _hook_path,
    "phasespec_drain_steps": _drain_steps,
    "phasespec_controller_state": _controller_state,
    "phasespec_configure_controller": _configure_controller,
    "phasespec_cpu_probe": _cpu_probe,
}


def install_utilities() -> None:
    """Give vLLM's ``EngineCore`` the ``phasespec_*`` utility methods (idempotent)."""
    for name, method in UTILITY_METHODS.items():
        setattr(EngineCore, name, method)
