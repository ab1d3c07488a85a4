"""One depth per step when the batch's make-up moves: requests held at their thinking budget verify
no drafts at any depth (pure logic; engine/step_depth.py, engine/step_times.py)."""

from __future__ import annotations

import math
import random

import pytest

from engine.controller import ControllerSettings, DepthController
from engine.cost_model import bucket_of
from engine.spec_stats import RequestLedger
from engine.step_times import BucketTimes

K = 3


def request(rid: str, phase: str, cap: int, held: bool = False) -> RequestLedger:
    ledger = RequestLedger(rid, cap, phase, K, engine_id=rid)
    ledger.set_mode(cap, True)
    ledger.budget_hold = held
    return ledger


def batch_of(held: int, size: int = 64) -> list[RequestLedger]:
    """``size`` adaptive requests capped at 1, ``held`` of them held at their thinking budget, the
    rest answering."""
    return [request(f"r{n}", "reasoning" if n < held else "answer", 1, n < held) for n in range(size)]


def answers_accepted(ctrl: DepthController, share: float) -> None:
    answer = ctrl.phase_rates("answer")
    for n in range(300):
        answer.observe(K, K, K if n % 10 < 10 * share else 0)


@pytest.mark.parametrize("cut", [True, False])
def test_a_step_without_adaptive_requests_ends_the_window_and_the_next_fits_the_batch_after(cut: bool) -> None:
    """Twentieth and twenty-first GPU sessions (c=64): a batch enters its holds together, runs
    some steps with every request held (no adaptive request: no window's step) and leaves them
    together. A depth-0 window chosen on the way in ran on, on the way out, while the batch
    answered: depth-0 windows were 15-30% of those at c=64, and yielded 14-23% less per ms than
    depth 1 at the same held shares."""
    # Depth 0 priced at its own time below (``step_one_pass`` off).
    settings = ControllerSettings(step_depth=True, explore_share=0.0, step_cut_windows=cut, step_one_pass=False, seed=3)
    ctrl = DepthController(K, settings)
    for depth, ms in enumerate([13.0, 15.0, 20.0, 21.0]):  # an H100 at batch 64 (depth 1: 1.15x)
        ctrl.step_chooser.observe(bucket_of(64), depth, ms / 1e3)
    answers_accepted(ctrl, 0.7)
    # 62 held, 2 answering: 64 tokens in 13 ms at depth 0 against 62 + 2 x 1.7 in 15 ms.
    entering = ctrl.plan(batch_of(62))
    assert entering.step_window is not None and entering.step_window.depth == 0
    assert ctrl.plan(batch_of(64)).step_window is None  # every request held
    # All 64 answering: 64 x 1.7 tokens in 15 ms at depth 1.
    leaving = ctrl.plan(batch_of(0))
    assert leaving.step_window is not None
    if cut:
        assert leaving.step_window is not entering.step_window and leaving.step_window.depth == 1
        assert leaving.after_gap, "its first step verifies the one pass drafted while all were held"
        assert ctrl.snapshot(False)["step_depth_cut_windows"] == {"6": 1}
    else:
        assert leaving.step_window is entering.step_window and not leaving.after_gap
        assert ctrl.snapshot(False)["step_depth_cut_windows"] == {}
    assert not ctrl.plan(batch_of(0)).after_gap


def test_the_first_step_after_the_gap_counts_in_its_window_but_is_not_timed() -> None:
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, seed=3))
    ctrl.plan(batch_of(0, size=4))
    ctrl.plan(batch_of(4, size=4))
    plan = ctrl.plan(batch_of(0, size=4))
    assert plan.after_gap and plan.step_window is not None
    ctrl.decode_step_timed(plan, 4, 1.0, 1.02, tokens=6)
    assert plan.step_window.finished == 1 and plan.step_window.tokens == 6
    assert plan.step_window.steps_s == []


def times_at_shares(by_share: bool, slope: float, seed: int = 0) -> BucketTimes:
    """Depth-0 and depth-1 windows alternating, depth 1 at 0.05 more log time than depth 0 at equal
    shares and ``slope`` more per draft verified per request, its shares between 0.1 and 1 (its
    held requests verify none), under a drifting machine speed."""
    rng = random.Random(seed)
    table = BucketTimes.empty(K, 16, by_share=by_share)
    level = math.log(0.013)
    for n in range(64):
        level += rng.gauss(0.0, 0.01)
        depth = n % 2
        share = rng.uniform(0.1, 1.0) if depth else 0.0
        table.add(depth, math.exp(level + 0.05 * depth + slope * share), adjacent=True, share=share)
    return table


def test_a_depth_s_time_is_priced_at_the_drafts_the_batch_would_verify_at_it() -> None:
    """A held request verifies no drafts at any depth, so depth 1 with most of the batch held runs
    fewer tokens through the target than depth 1 with none: one time per depth averaged the two
    and priced depth 1 too dear for a mostly held batch, too cheap for one with none held."""
    table = times_at_shares(by_share=True, slope=0.15)
    assert table.slope() == pytest.approx(0.15, abs=0.04)
    for share in (0.1, 0.5, 1.0):
        zero, one = table.estimates([0.0, share, 2 * share, 3 * share])[:2]
        assert zero is not None and one is not None
        assert math.log(one / zero) == pytest.approx(0.05 + 0.15 * share, abs=0.04)
    flat = times_at_shares(by_share=False, slope=0.15)
    assert flat.slope() == 0.0
    zero, one = flat.estimates()[:2]
    assert zero is not None and one is not None
    assert math.log(one / zero) == pytest.approx(0.05 + 0.15 * 0.55, abs=0.04), "the mean share's"


def test_no_slope_is_fitted_where_every_depth_runs_at_one_share() -> None:
    """No request held, none capped: a depth's share is the depth, and its slope cannot be told from
    the depth's own time."""
    table = BucketTimes.empty(K, 16)
    for n in range(32):
        depth = n % 4
        table.add(depth, 0.010 * (1 + 0.1 * depth), adjacent=True, share=float(depth))
    assert table.slope() == 0.0
    assert table.estimates() == pytest.approx([0.010, 0.011, 0.012, 0.013])
    assert table.estimates([0.0, 0.2, 0.4, 0.6]) == pytest.approx([0.010, 0.011, 0.012, 0.013])


def test_a_verifying_step_is_never_priced_faster_for_verifying_more() -> None:
    table = times_at_shares(by_share=True, slope=-0.2)
    assert table.slope() == 0.0


def test_the_chooser_prices_each_depth_at_its_share_of_the_batch() -> None:
    """Per depth D: each adaptive request's min(cap, D), the static ones' drafts, a leaving request's
    over its steps after the hold, per request of the batch."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, seed=1))
    chooser = ctrl.step_chooser
    assert chooser.shares(4, [K, 1], 1.0, []) == pytest.approx([0.25, 0.75, 1.0, 1.25])
    ctrl.plan(batch_of(48))
    window = chooser.current
    assert window is not None
    assert window.share() == pytest.approx(window.depth * 16 / 64)
    assert ctrl.snapshot(False)["step_depth_share_slope"] == {"6": 0.0}, "no pairs yet"


def drain_chooser(horizon: bool) -> DepthController:
    """A chooser that knows every depth's time at batch 16 and only depth 1's at batch 4 (bucket 2:
    a cell's drain passes through it once a cell, so its windows never pair)."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, step_drain_horizon=horizon, seed=5))
    chooser = ctrl.step_chooser
    for depth, ms in enumerate([20.0, 21.0, 22.0, 40.0]):
        chooser.observe(bucket_of(16), depth, ms / 1e3)
    chooser.observe(bucket_of(4), 1, 18e-3)
    return ctrl


@pytest.mark.parametrize("left", [6, 100, None])
def test_a_batch_that_runs_out_of_tokens_within_two_windows_tries_no_depth_first(left: int | None) -> None:
    """Twenty-third GPU session: adaptive's cells ran up to 19 steps with slots free against fixed-1's
    6-8, the loss priced at equal speed. A depth not linked at a drain's bucket was tried first, for
    two windows, in every drain: with the horizon on, a batch with a window or two of tokens left
    runs the best depth priced from the nearest bucket where all are."""
    gains, caps = [[0.0, 0.7, 1.3, 1.6]] * 4, [K] * 4
    for horizon in (False, True):
        chooser = drain_chooser(horizon).step_chooser
        draining = horizon and left is not None and left < 16 * 1.7
        window = chooser.choose(4, gains, caps, 0.05, lefts=[left] * 4)
        if draining:
            # Borrowed from batch 16: depth 2 yields 2.3 tokens a request in 22 ms, depth 1 1.7 in 21.
            assert window.depth == 2 and chooser.repeat is None
        else:
            assert window.depth in (0, 2, 3), "an unlinked depth is tried first"
            assert chooser.repeat == window.depth, "for two windows"


def test_a_draining_batch_with_nothing_to_borrow_runs_the_best_depth_linked_at_its_bucket() -> None:
    ctrl = DepthController(K, ControllerSettings(step_depth=True, step_drain_horizon=True, seed=5))
    chooser = ctrl.step_chooser
    chooser.observe(bucket_of(4), 1, 18e-3)  # the only bucket, one depth known
    window = chooser.choose(4, [[0.0, 0.7, 1.3, 1.6]] * 4, [K] * 4, 0.05, lefts=[6] * 4)
    assert window.depth == 1 and chooser.repeat is None
    assert not ctrl.step_chooser.drains([[0.0, 0.7, 1.3, 1.6]], [K], [40])  # 40 / 1.7 > 16 steps
    ctrl.reconfigure(ControllerSettings(step_depth=True, step_drain_horizon=False))
    assert not ctrl.step_chooser.drain_horizon


@pytest.mark.parametrize("finish", [False, True])
@pytest.mark.parametrize("waiting", [0, 2])
def test_a_batch_that_ends_in_the_window_with_nothing_waiting_is_priced_until_its_last_request_ends(
    finish: bool, waiting: int
) -> None:
    """A request with 3 tokens left: depth 0 ends it in 3 steps of 18 ms, depth 1 in 1.8 of 21 ms.
    Credited a token a step for its freed slot over the window (as if the next request took it),
    depth 0 looks better (8 tokens in 8 x 18 ms against 9.2 in 8 x 21); in a drain no request
    takes the slot, and depth 1 ends the batch sooner."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, step_drain_finish=finish, seed=3))
    for depth, ms in [(0, 18.0), (1, 21.0), (0, 18.0)]:
        ctrl.step_chooser.observe(bucket_of(1), depth, ms / 1e3)
    answers_accepted(ctrl, 0.7)
    last = request("last", "answer", 1)
    last.tokens_left = last.max_tokens_left = 3
    window = ctrl.plan([last], waiting=waiting).step_window
    assert window is not None
    assert window.depth == (1 if finish and not waiting else 0)
    # A request whose tokens left run to a thinking-budget hold does not end there: no drain.
    held_ahead = request("reasoning", "answer", 1)
    held_ahead.tokens_left, held_ahead.max_tokens_left = 3, 40
    ctrl.step_chooser.current = None
    assert ctrl.plan([held_ahead]).step_window.depth == 0  # type: ignore[union-attr]


def test_a_finishing_batch_that_runs_past_the_window_is_priced_as_any() -> None:
    chooser = DepthController(K, ControllerSettings(step_depth=True, step_drain_finish=True)).step_chooser
    gains = [[0.0, 0.7, 1.3, 1.6]]
    for left in (3, 40):
        credited = chooser.tokens_at(1, gains, [K], 0.0, [left])
        priced = chooser.per_step(1, gains, [K], 0.0, [left], (), finishing=True)
        assert (priced == credited) == (left == 40)  # 40 / 1.7 > 8 steps: past the window
    assert chooser.per_step(1, gains, [K], 0.0, [3], (), finishing=True) == pytest.approx(1.7)


@pytest.mark.parametrize("lowest", [0, 1])
def test_a_minimum_depth_leaves_the_shallower_depths_out_of_every_choice(lowest: int) -> None:
    """``step_min_depth`` 1 (an arm of the benchmark): where depth 0 is the best rate (62 of 64
    held) the window runs depth 1, a first try never draws depth 0, and a re-run of a passed-over
    depth never picks it."""
    # Depth 0 priced at its own time below (``step_one_pass`` off).
    settings = ControllerSettings(
        step_depth=True, explore_share=0.0, step_min_depth=lowest, step_one_pass=False, seed=3
    )
    ctrl = DepthController(K, settings)
    for depth, ms in enumerate([13.0, 15.0, 20.0, 21.0]):
        ctrl.step_chooser.observe(bucket_of(64), depth, ms / 1e3)
    answers_accepted(ctrl, 0.7)
    window = ctrl.plan(batch_of(62)).step_window
    assert window is not None and window.depth == lowest
    # A bucket with no times: every first try is at a depth from ``lowest``.
    chooser = DepthController(K, ControllerSettings(step_depth=True, step_min_depth=lowest, seed=5)).step_chooser
    tried = set()
    for _ in range(40):
        chooser.current = None
        tried.add(chooser.choose(4, [[0.0, 0.5, 0.8, 1.0]] * 4, [K] * 4, 0.2).depth)
    assert min(tried) == lowest
    # Every depth timed, depth 0 long unrun and far below the best: due for a re-run only without the minimum.
    table = chooser.bucket(bucket_of(4))
    table.windows, table.last_window = 100, [0, 100, 100, 100]
    assert chooser.stale(table, [1.0, 2.0, 2.0, 2.0], 0.2, lowest) == (0 if lowest == 0 else None)
