"""SpecLedger bookkeeping, without an engine."""

from __future__ import annotations

import pytest

from engine.spec_stats import DepthError, SpecLedger, validate_depth


@pytest.mark.parametrize(("depth", "ok"), [(0, True), (3, True), (-1, False), (4, False), (True, False), (1.0, False)])
def test_depth_must_be_an_int_in_range(depth: object, ok: bool) -> None:
    if ok:
        assert validate_depth(depth, 3) == depth  # type: ignore[arg-type]
    else:
        with pytest.raises(DepthError):
            validate_depth(depth, 3)  # type: ignore[arg-type]


def test_counters_split_by_phase_and_position() -> None:
    ledger = SpecLedger(max_depth=3)
    ledger.register("r-abc", "r", depth=1, phase="reasoning", step=0, trace=True)
    ledger.observe("r-abc", step=1, drafted=1, accepted=0)
    ledger.observe("r-abc", step=2, drafted=1, accepted=1)
    assert ledger.set_depth("r", 3, "answer", step=2)
    ledger.observe("r-abc", step=3, drafted=3, accepted=2)
    snap = ledger.snapshot("r")
    assert snap is not None
    assert snap["phases"]["reasoning"] == {
        "num_drafts": 2,
        "num_draft_tokens": 2,
        "num_accepted_tokens": 1,
        "num_accepted_tokens_per_pos": [1, 0, 0],
        "steps_by_drafted": [0, 2, 0, 0],
    }
    assert snap["phases"]["answer"]["num_accepted_tokens_per_pos"] == [1, 1, 0]
    assert snap["depth_log"] == [[0, 1, "reasoning"], [2, 3, "answer"]]
    assert [t[3] for t in snap["trace"]] == ["reasoning", "reasoning", "answer"]


def test_finished_request_moves_to_mailbox_and_pop_frees_it() -> None:
    ledger = SpecLedger(max_depth=2)
    ledger.register("a-1", "a", 2, "x", 0, False)
    ledger.observe("a-1", 1, 2, 1)
    ledger.finish("a-1")
    assert ledger.set_depth("a", 1, None, 5) is False
    assert ledger.pop("a") is not None
    assert ledger.pop("a") is None
    assert ledger.sizes() == {"live": 0, "groups": 0, "finishing": 0, "finished_unread": 0}


def test_children_of_one_request_are_summed_when_the_last_finishes() -> None:
    ledger = SpecLedger(max_depth=2)
    for child in ("0_g", "1_g"):
        ledger.register(child, "g", 2, "x", 0, False)
        ledger.observe(child, 1, 2, 2)
    assert ledger.set_depth("g", 0, None, 1)
    ledger.finish("0_g")
    assert ledger.pop("g") is None  # one child still runs
    ledger.finish("1_g")
    final = ledger.pop("g")
    assert final is not None and final["phases"]["x"]["num_draft_tokens"] == 4


def test_mailbox_is_bounded() -> None:
    ledger = SpecLedger(max_depth=1, finished_cap=3)
    for i in range(10):
        ledger.register(f"e{i}", f"g{i}", 1, "x", 0, False)
        ledger.finish(f"e{i}")
    assert ledger.sizes()["finished_unread"] == 3
    assert ledger.pop("g9") is not None and ledger.pop("g0") is None


def test_unknown_ids_are_ignored() -> None:
    ledger = SpecLedger(max_depth=1)
    ledger.observe("nope", 1, 1, 1)
    ledger.finish("nope")
    assert ledger.snapshot("nope") is None
