"""One depth per step (engine/step_depth.py): the choice from measured step times, pure logic."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from engine.controller import ControllerSettings, DepthController, depth_tokens_left
from engine.cost_model import bucket_of
from engine.spec_stats import RequestLedger
from engine.step_depth import Leaving, StepDepthChooser
from engine.step_times import StepWindow

K = 3
# Expected accepted drafts at depth 0..3 for a drafter accepted a fifth of the time per position.
WEAK = [0.0, 0.2, 0.24, 0.248]
# ... and one accepted 90% of the time.
STRONG = [0.0, 0.9, 1.71, 2.439]


def timed(times_ms: list[float], bucket: int = 4) -> StepDepthChooser:
    chooser = StepDepthChooser(K, random.Random(0))
    for depth, ms in enumerate(times_ms):
        chooser.observe(bucket, depth, ms / 1e3)
    return chooser


def known(estimates: list[float | None]) -> list[float]:
    """The estimates of the depths timed so far."""
    return [t for t in estimates if t is not None]


def run_window(chooser: StepDepthChooser, batch: int, gains: list[float], clock: list[float], ms: float) -> int:
    """Plan and finish one window of steps of ``ms`` each; return its depth."""
    depths = set()
    for _ in range(chooser.window_steps):
        window = chooser.choose(batch, [gains] * batch, [K] * batch, explore_share=0.0)
        depths.add(window.depth)
        previous = clock[0]
        clock[0] += ms / 1e3
        chooser.step_finished(window, batch, previous, clock[0])
    (depth,) = depths
    return depth


def test_every_depth_is_timed_over_two_windows_before_any_is_chosen() -> None:
    """The first window at a new depth pays one-time costs; the second, steady, times it."""
    chooser = StepDepthChooser(K, random.Random(1))
    clock = [1.0]
    tried = [run_window(chooser, 4, WEAK, clock, 20.0) for _ in range(2 * (K + 1))]
    assert tried[0::2] == tried[1::2] and sorted(tried[0::2]) == list(range(K + 1))
    assert [row[2] for row in chooser.windows_snapshot()] == [True, False] * (K + 1)
    assert chooser.times[2].estimates() == pytest.approx([0.020] * (K + 1))


@pytest.mark.parametrize("borrow", [True, False])
def test_a_new_batch_size_tries_first_only_the_depths_its_neighbours_price_close(borrow: bool) -> None:
    """An H200's step times (twentieth GPU session) at batch 5-8 priced depths 2-3 1.41-1.58x depth 0:
    at each new batch size their first windows, forced before any choice, cost a weak drafter
    a quarter of their tokens. Priced from the neighbour, only the best, depth 1, is (depth 0 is
    9% below it: it waits to be re-run as a passed-over depth does)."""
    chooser = timed([7.36, 7.98, 10.41, 11.63], bucket=bucket_of(8))
    chooser.borrow = borrow
    clock = [1.0]
    tried = [run_window(chooser, 16, WEAK, clock, 9.0) for _ in range(8)]
    if borrow:
        assert tried == [1] * 8
        estimates = chooser.times[bucket_of(16)].estimates()
        assert estimates == [None, pytest.approx(9.0e-3), None, None]
        priced = chooser.borrowed(bucket_of(16), estimates, K)
        assert priced == pytest.approx([9e-3 * t / 7.98 for t in (7.36, 7.98, 10.41, 11.63)])
    else:
        assert set(tried) == {0, 1, 2, 3}, "every depth tried first"


def test_a_stalled_step_is_left_out_of_its_window_but_recorded() -> None:
    """H200, batch 9-16: each depth's first window held one step of 96-149 ms among ~12 ms ones,
    and that window alone priced depths 0, 2 and 3 at 27-36 ms (docs/gpu.md, sixth session)."""
    chooser = StepDepthChooser(K, random.Random(1))
    window = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    clock = 1.0
    for step in range(chooser.window_steps):
        took = 0.149 if step == 2 else 0.012
        chooser.step_finished(window, 16, clock, clock + took)
        clock += took
    assert chooser.times[4].estimates()[window.depth] == pytest.approx(0.012)
    assert chooser.windows_snapshot()[-1][3:6] == pytest.approx([7, 12.0, 149.0])


@pytest.mark.parametrize(
    ("times_ms", "gains", "want"),
    [
        # Measured at batch 16 on an H200 (docs/gpu.md): 21 ms without drafts, ~31 ms with.
        ([21, 30, 31, 32], WEAK, 0),
        ([21, 30, 31, 32], STRONG, 3),
        ([20, 21, 22, 23], WEAK, 1),  # nearly flat: one cheap draft pays, more do not
        ([20, 24, 40, 60], STRONG, 1),  # one cheap pass, then expensive ones
    ],
)
def test_the_depth_with_the_most_tokens_per_second_is_chosen(
    times_ms: list[float], gains: list[float], want: int
) -> None:
    chooser = timed(times_ms)
    assert chooser.choose(16, [gains] * 16, [K] * 16, explore_share=0.0).depth == want


def test_caps_bound_what_a_depth_is_worth() -> None:
    chooser = timed([20, 21, 22, 23])
    assert chooser.choose(16, [STRONG] * 16, [K] * 16, explore_share=0.0).depth == 3
    chooser.current = None
    assert chooser.choose(16, [STRONG] * 16, [1] * 16, explore_share=0.0).depth == 1, "deeper buys nothing capped at 1"


# The fifteenth GPU session's c=64 step times: its windows' pairs replayed give depths 1-3 at
# 1.14, 1.46 and 1.61x depth 0 (docs/gpu.md), here on a 20 ms depth 0.
C64_MS = [20.0, 22.8, 29.2, 32.2]
ANSWER = [0.0, 0.70, 1.26, 1.75]  # its answers' accepted drafts by depth


def test_a_window_counts_only_the_tokens_a_request_has_left() -> None:
    """A batch starting its 16-token answers: priced at 2.75 tokens a request a step, depth 3 would
    win, but 8 steps of it run past the answers' ends; counted to them, depth 1 does."""
    batch = 64
    assert timed(C64_MS, bucket_of(batch)).choose(batch, [ANSWER] * batch, [K] * batch, 0.0).depth == 3
    chooser = timed(C64_MS, bucket_of(batch))
    window = chooser.choose(batch, [ANSWER] * batch, [K] * batch, 0.0, lefts=[16] * batch)
    assert window.depth == 1
    # 16 tokens in 16 / 2.75 steps, then one a step: 2.27 a step over the window.
    assert chooser.tokens_at(3, [ANSWER], [K], 0.0, [16]) == pytest.approx((16 + 8 - 16 / 2.75) / 8)
    assert chooser.tokens_at(1, [ANSWER], [K], 0.0, [16]) == pytest.approx(1.70), "not exhausted: as priced"
    assert chooser.tokens_at(3, [ANSWER], [K], 0.0, [0]) == pytest.approx(1.0), "ended: one a step"
    assert window.predicted == pytest.approx(batch * 1.70)


def test_tokens_left_end_at_max_tokens_or_the_thinking_budget_hold() -> None:
    assert depth_tokens_left(10, 64, None, "answer", K) == 54
    assert depth_tokens_left(10, None, None, "reasoning", K) is None
    # Reasoning under a budget of 48: held from 48 - 4 x (K + 1) = 32 output tokens.
    assert depth_tokens_left(10, 64, 48, "reasoning", K) == 22
    assert depth_tokens_left(40, 64, 48, "reasoning", K) == 0
    assert depth_tokens_left(40, 64, 48, "answer", K) == 24, "the budget binds only while reasoning"


def finish_window(
    chooser: StepDepthChooser, window: StepWindow, batch: int, clock: list[float], ms: float, explore: float = 0.0
) -> None:
    while window.finished < chooser.window_steps:
        if window.finished:
            assert chooser.choose(batch, [WEAK] * batch, [K] * batch, explore_share=explore) is window
        chooser.step_finished(window, batch, clock[0], clock[0] + ms / 1e3)
        clock[0] += ms / 1e3


def test_a_window_keeps_its_depth_for_its_steps() -> None:
    chooser = timed([21, 30, 31, 32])
    clock = [10.0]
    first = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    assert first.depth == 0
    for _ in range(chooser.window_steps):
        if first.finished:
            assert chooser.choose(16, [STRONG] * 16, [K] * 16, explore_share=0.0) is first
        chooser.step_finished(first, 16, clock[0], clock[0] + 0.021)
        clock[0] += 0.021
    second = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    assert second is not first and second.depth == 0 and not second.switched


def test_a_switch_s_cost_cancels_between_pairs_run_both_ways() -> None:
    # Depth 0 takes 20 ms a step, depth 1 25 ms; a window that switches runs 1.2x slower.
    chooser = StepDepthChooser(K, random.Random(0))
    for depth, ms in [(0, 20), (1, 25 * 1.2), (1, 25), (0, 20 * 1.2)]:
        chooser.observe(4, depth, ms / 1e3)
    table = chooser.times[4]
    estimates = known(table.estimates())
    assert estimates[1] / estimates[0] == pytest.approx(1.25), "there: 1.5x, back: 0.96x"
    assert table.switch_share() == pytest.approx(0.2)


def test_depths_timed_at_different_speeds_compare_as_if_timed_at_one() -> None:
    # Depth 0 ran alone while the machine was fast; then it slowed by half and depth 1 ran next
    # to depth 0. Each depth's own windows would say 20 against 37.5 ms; their neighbours, 1.25x.
    chooser = StepDepthChooser(K, random.Random(0))
    for depth, ms in [(0, 20), (0, 20), (0, 20), (0, 30), (1, 37.5), (1, 37.5), (0, 30)]:
        chooser.observe(4, depth, ms / 1e3)
    estimates = known(chooser.times[4].estimates())
    assert estimates[1] / estimates[0] == pytest.approx(1.25)
    assert estimates[0] == pytest.approx(0.030), "at the speed of the last windows"


def test_a_passed_over_depth_is_explored_for_two_windows_and_its_pairs_reprice_it() -> None:
    chooser = timed([20, 60, 20, 20])  # depth 1's first window met a slow moment
    # Patience 2 (the default before GPU session 20): two re-runs within 60 windows. At the default 6
    # the same repricing takes about 400 windows: the price of re-running far depths more rarely.
    chooser.max_patience = 2.0
    clock = [1.0]
    seen = []
    for _ in range(60):  # depths 0 and 2 go stale too; each re-run takes two windows
        window = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.25)
        seen.append((window.depth, window.switched))
        finish_window(chooser, window, 16, clock, 20.0, explore=0.25)
    at = seen.index((1, True))
    assert seen[at + 1] == (1, False), "explored again for two windows"
    estimates = chooser.times[4].estimates()
    assert estimates[1] == pytest.approx(0.020), "two re-runs' pairs, there and back, outvote the old one"


def test_a_close_passed_over_depth_waits_half_the_buckets_windows_and_a_far_one_six_times_that() -> None:
    chooser = StepDepthChooser(K, random.Random(0))
    table = chooser.bucket(4)
    close, far = [1.0, 0.97, 0.5, 0.5], [1.0, 0.5, 0.5, 0.5]  # rates: depth 1 within 5% of the best, or not

    def due(windows: int, last: int, rates: list[float], explore: float = 0.05) -> bool:
        table.windows = windows
        table.last_window = [windows, last, windows, windows]
        return chooser.stale(table, rates, explore) == 1

    assert not due(30, 14, close) and due(30, 13, close), "at least 16 windows"
    assert not due(80, 40, close) and due(80, 39, close), "half the bucket's 80 windows"
    assert not due(400, 340, close) and due(400, 339, close), "at most K / explore_share = 60"
    assert not due(80, 0, far), "a depth 50% below waits 6 x as long: 6 x 40 windows at 80"
    assert not due(400, 40, far) and due(400, 39, far), "6 x 60 once half the windows pass 60"
    assert chooser.stale(table, close, 0.0) is None, "no re-runs without exploration"


def test_bunched_updates_time_a_window_by_its_mean_step() -> None:
    """Under async scheduling a stalled update and the one right after it split one step's time
    unevenly (seen on the H200: a 0.6 ms "step" at batch 1); the window's sum is unchanged."""
    chooser = StepDepthChooser(K, random.Random(0))
    window = chooser.choose(1, [WEAK], [K], explore_share=0.0)
    clock = 5.0
    for step in range(chooser.window_steps):
        # steps of 20 ms; every other update is late by 19 ms and its successor follows 1 ms later
        interval = 0.039 if step % 2 else 0.001
        chooser.step_finished(window, 1, clock, clock + interval)
        clock += interval
    (estimate,) = [t for t in chooser.times[0].estimates() if t is not None]
    assert estimate == pytest.approx(0.020)  # not 1 or 39 ms, as per step


def test_a_window_that_leaves_its_bucket_or_is_cut_short_is_not_kept() -> None:
    chooser = StepDepthChooser(K, random.Random(0))
    window = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    clock = 1.0
    for step in range(chooser.window_steps):
        batch = 16 if step < 2 else 7  # requests finished: the batch fell to another bucket
        chooser.step_finished(window, batch, clock, clock + 0.02)
        clock += 0.02
    assert chooser.times[4].estimates() == [None] * (K + 1), "2 timed steps at its bucket: too few"
    chooser.current = None
    second = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    for _ in range(3):
        chooser.step_finished(second, 16, clock, clock + 0.02)
        clock += 0.02
    third = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    while third is second:
        third = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    chooser.step_finished(third, 16, clock, clock + 0.05)  # the next window's first step closes it
    assert chooser.times[4].estimates()[second.depth] == pytest.approx(0.02), "3 timed steps are kept"


def request(rid: str, phase: str, depth: int, adaptive: bool) -> RequestLedger:
    ledger = RequestLedger(rid, depth, phase, K, engine_id=rid)
    ledger.set_mode(depth, adaptive)
    return ledger


def test_the_controller_applies_one_depth_capped_per_request() -> None:
    # Depth 0 timed as its own class (``step_one_pass`` off): this cost shape saves the drafter at depth 0.
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, step_one_pass=False, seed=3))
    batch = [request("a", "reasoning", K, True), request("b", "answer", 1, True), request("c", "answer", 2, False)]
    clock = 1.0
    seen = set()
    for _ in range(2 * (K + 1) * ctrl.step_chooser.window_steps):  # two windows per new depth
        plan = ctrl.plan(batch)
        assert plan.step_window is not None and not plan.full_draft
        depth = plan.step_window.depth
        assert plan.depths == {"a": depth, "b": min(1, depth)}, "the static request keeps its own"
        seen.add(depth)
        # 20 ms a step, doubled once anything is drafted: at the prior's acceptance (0.5, 0.25,
        # 0.125 by position) depth 3 brings 3.375 tokens for the two requests against 2 at depth 0.
        end = clock + 0.020 + 0.020 * (depth > 0)
        ctrl.step_chooser.step_finished(plan.step_window, 3, clock, end)
        clock = end
    assert seen == set(range(K + 1))
    assert ctrl.plan(batch).step_window.depth == 0  # type: ignore[union-attr]
    state = ctrl.snapshot(False)
    assert state["step_depth_ms"] == {"2": [20.0, 40.0, 40.0, 40.0]}
    assert {row[6] for row in state["step_depth_windows"]} == {1.0}, "one static request in every step"


def test_a_batch_capped_below_k_runs_no_window_past_its_deepest_cap() -> None:
    """Adaptive requests capped at 1 verify 1 at any depth >= 1: a 'depth 3' window of theirs is a
    depth-1 window, and timed as depth 3 it priced depth 3 at depth 1's cost (GPU session 19: the
    benchmark's adaptive@1:1 cells beside adaptive's, one chooser)."""
    chooser = StepDepthChooser(K, random.Random(2))
    clock = [1.0]
    capped: list[int] = []
    for _ in range(12):
        depths = set()
        for _ in range(chooser.window_steps):
            window = chooser.choose(4, [STRONG] * 4, [1] * 4, explore_share=0.0)
            depths.add(window.depth)
            previous, clock[0] = clock[0], clock[0] + 0.02
            chooser.step_finished(window, 4, previous, clock[0])
        capped += depths
    assert set(capped) == {0, 1}
    assert chooser.times[bucket_of(4)].estimates()[2:] == [None, None], "depths 2 and 3 never timed"
    # Requests capped at K: depths 2 and 3 are new, and tried first.
    uncapped = {run_window(chooser, 4, STRONG, clock, 20.0) for _ in range(4)}
    assert uncapped == {2, 3}


def test_a_window_s_last_step_drafts_for_the_next_window_which_then_runs_all_its_steps() -> None:
    """The drafter proposes after a step as many drafts as that step asks for, so the step before a
    window must ask for the window's depth (capped per request), not its own: chosen a step late,
    a window's first step verified the old depth's drafts at the new depth's cost."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, seed=5))
    batch = [request("a", "reasoning", K, True), request("b", "answer", 2, True)]
    steps = ctrl.step_chooser.window_steps
    clock, plans = 1.0, []
    for _ in range(6 * steps):
        plan = ctrl.plan(batch)
        assert plan.step_window is not None
        plans.append(plan)
        end = clock + 0.020 + 0.005 * plan.step_window.depth
        ctrl.step_chooser.step_finished(plan.step_window, 2, clock, end)
        clock = end
    windows = [plan.step_window for plan in plans[::steps]]
    assert [plan.step_window for plan in plans] == [w for w in windows for _ in range(steps)], "8 steps each"
    assert len({w.depth for w in windows if w is not None}) > 1, "the first windows try the depths"
    for i, plan in enumerate(plans[:-1]):
        following = plans[i + 1].step_window
        assert following is not None
        # Request "a" (cap K) reaches the window's depth: the deepest of the two.
        assert plan.next_drafts == (following.depth if i % steps == steps - 1 else None)
        window = plan.step_window
        assert window is not None
        assert plan.drafts_for_next == (
            plan.next_drafts is not None and max(plan.next_drafts, 1) != max(window.depth, 1)
        )


def test_a_step_drafting_for_a_window_of_another_depth_counts_in_its_window_but_is_not_timed() -> None:
    """The last step of a depth-1 window before a depth-3 one runs depth 3's drafting passes: timed as
    depth 1's, it priced depth 1 an eighth of the way to depth 3 (the pairs saw depth 3 cheaper).
    Going shallower it drafts the next window's fewer passes, and would price its own depth low."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, seed=5))
    batch = [request("a", "reasoning", K, True), request("b", "answer", K, True)]
    clock, ahead = 1.0, []
    for _ in range(8 * ctrl.step_chooser.window_steps):
        plan = ctrl.plan(batch)
        window = plan.step_window
        assert window is not None
        # The step costs what it drafts: its own depth's passes, or at a window's end the next one's.
        passes = max(1, window.depth if plan.next_drafts is None else plan.next_drafts)
        end = clock + 0.020 + 0.010 * passes
        ctrl.decode_step_timed(plan, 2, clock, end, tokens=2)
        if plan.drafts_for_next:
            ahead.append(window)
        clock = end
    assert ahead, "some window was followed by one of another depth"
    for window in ahead:
        assert window.finished == window_steps(ctrl) and window.tokens == 2 * window_steps(ctrl)
        assert window.steps_s == pytest.approx([0.020 + 0.010 * max(1, window.depth)] * (window_steps(ctrl) - 1))
    estimates = ctrl.step_chooser.times[bucket_of(2)].estimates()
    assert estimates == pytest.approx([0.030, 0.030, 0.040, 0.050])


def window_steps(ctrl: DepthController) -> int:
    return ctrl.step_chooser.window_steps


def test_one_slow_window_does_not_price_a_depth_out() -> None:
    chooser = timed([20, 21, 22, 23])
    for _ in range(5):
        chooser.observe(4, 1, 0.021)
    chooser.observe(4, 1, 0.300)  # a window with a pause, or prefills next door
    assert chooser.times[4].estimates()[1] == pytest.approx(0.021)
    assert chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0).depth == 1


def test_a_passed_over_depth_is_run_again_after_k_over_explore_share_windows_times_its_patience() -> None:
    chooser = StepDepthChooser(K, random.Random(2))
    clock = 1.0
    times = {0: 20.0, 1: 60.0, 2: 60.0, 3: 60.0}  # depth 1's first window met a slow moment
    depths = []
    for _ in range(160):  # depth 1 re-run twice (its first re-run's pairs are outvoted by the others)
        for _ in range(chooser.window_steps):
            window = chooser.choose(4, [WEAK] * 4, [K] * 4, explore_share=0.25)
            end = clock + times[window.depth] / 1e3
            chooser.step_finished(window, 4, clock, end)
            clock = end
        depths.append(window.depth)
        if window.depth == 1:
            times[1] = 20.5  # the moment passed: depth 1 is now worth it
    first = depths.index(1)
    again = depths.index(1, first + 1)
    # Priced 63% below depth 0, depth 1 waits the longest: K / explore_share x max_patience windows.
    assert again - first <= 2 + K / 0.25 * chooser.max_patience, "depth 1 was timed again"
    assert depths[-10:].count(1) >= 6, "and chosen once its median is current"


def test_closed_windows_are_kept_for_the_state_endpoint() -> None:
    """What the estimates were made from, window by window (bucket, depth, switched, steps, mean ms, slowest ms)."""
    chooser = StepDepthChooser(K, random.Random(1))
    clock = [1.0]
    depths = [run_window(chooser, 4, WEAK, clock, 20.0 + 5 * k) for k in range(K + 1)]
    history = chooser.windows_snapshot()
    assert [row[1] for row in history] == depths
    assert [row[2] for row in history] == [True, False] * 2, "a new depth runs twice, the second steady"
    assert [row[4] for row in history] == pytest.approx([20.0, 25.0, 30.0, 35.0])
    assert [row[5] for row in history] == pytest.approx([20.0, 25.0, 30.0, 35.0]), "the slowest step"
    assert {row[0] for row in history} == {2}  # batch 4: bucket 2


def test_one_stalled_pair_of_three_does_not_price_a_depth_out() -> None:
    """Pairs' medians: one window that met a pause (3x) is outvoted by its depth's others, both ways."""
    chooser = timed([20, 21, 22, 23])
    for ms in (21, 60, 21):  # each window of depth 1 between two of depth 0
        chooser.observe(4, 0, 0.020)
        chooser.observe(4, 1, ms / 1e3)
    chooser.observe(4, 0, 0.020)
    assert chooser.times[4].estimates()[1] == pytest.approx(0.021)
    assert chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0).depth == 1


def test_windows_apart_in_time_are_not_compared() -> None:
    """Between two adaptive windows other requests may run for minutes (the benchmark's static
    cells): the machine's speed then is not the one before, and the two windows make no pair."""
    chooser = StepDepthChooser(K, random.Random(0))
    clock = [1.0]
    first = run_window(chooser, 4, WEAK, clock, 20.0)
    clock[0] += 60.0
    chooser.current = None
    chooser.repeat = (first + 1) % (K + 1)
    run_window(chooser, 4, WEAK, clock, 30.0)
    chooser.close(chooser.timing)
    assert chooser.times[2].pairs == {}


def test_a_step_the_worker_did_not_go_straight_into_is_counted_but_not_timed() -> None:
    """The hook passes no previous update for such a step (an idle gap is not the depth's cost)."""
    chooser = StepDepthChooser(K, random.Random(1))
    window = chooser.choose(4, [WEAK] * 4, [K] * 4, explore_share=0.0)
    clock = 1.0
    for step in range(chooser.window_steps):
        gap = step == 3
        chooser.step_finished(window, 4, 0.0 if gap else clock, clock + (0.5 if gap else 0.02))
        clock += 0.5 if gap else 0.02
    assert window.closed and window.finished == chooser.window_steps and len(window.steps_s) == chooser.window_steps - 1
    assert chooser.times[2].estimates()[window.depth] == pytest.approx(0.020)
    assert chooser.windows_snapshot()[-1][4:6] == pytest.approx([20.0, 20.0])


def test_bunched_halves_are_not_taken_for_stalls() -> None:
    """A delayed update and its successor at once: near-zero steps can be most of a window (here
    4 of its 7 timed steps; the first came after an idle gap)."""
    chooser = StepDepthChooser(K, random.Random(1))
    window = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.0)
    clock = 1.0
    for step in range(chooser.window_steps):
        took = 0.0235 if step % 2 == 0 else 0.0005
        chooser.step_finished(window, 16, clock if step else 0.0, clock + took)
        clock += took
    assert chooser.times[4].estimates()[window.depth] == pytest.approx((3 * 0.0235 + 4 * 0.0005) / 7)


def first_reruns(chooser: StepDepthChooser, windows: int = 100) -> dict[int, list[int]]:
    """The windows at which depths 0 (within 5% of depth 1, the best) and 3 (45% below) are run again."""
    times = {0: 18.0, 1: 21.0, 2: 30.0, 3: 40.0}
    for depth, ms in times.items():
        chooser.observe(4, depth, ms / 1e3)
    clock, reruns = 1.0, {0: list[int](), 3: list[int]()}
    for n in range(windows):
        for _ in range(chooser.window_steps):
            window = chooser.choose(16, [WEAK] * 16, [K] * 16, explore_share=0.25)
            chooser.step_finished(window, 16, clock, clock + times[window.depth] / 1e3)
            clock += times[window.depth] / 1e3
        if window.depth in reruns and window.switched:
            reruns[window.depth].append(n)
    return reruns


def test_a_depth_far_below_the_best_waits_longer_to_be_run_again() -> None:
    chooser = StepDepthChooser(K, random.Random(0))
    reruns = first_reruns(chooser)
    interval = K / 0.25
    assert reruns[0] and reruns[0][0] <= interval + 2, "a close depth is re-run every K / explore_share windows"
    assert reruns[3] and interval * 5 < reruns[3][0] <= interval * chooser.max_patience + 2, "a far one 6x later"


def test_the_controllers_step_max_patience_sets_how_long_a_far_depth_waits() -> None:
    """``step_max_patience`` (a controller setting, so a benchmark's ``--controller`` reaches it)
    sets the chooser's, at construction and when the settings change at run time."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True, step_max_patience=2.0, seed=0))
    assert ctrl.step_chooser.max_patience == 2.0
    interval = K / 0.25
    reruns = first_reruns(ctrl.step_chooser)
    assert reruns[0] and reruns[0][0] <= interval + 2, "a close depth's wait is unchanged"
    assert reruns[3] and interval * 1.5 < reruns[3][0] <= interval * 2 + 2, "the far one waits 2 intervals"
    assert not ctrl.step_chooser.borrow
    ctrl.reconfigure(replace(ctrl.settings, step_max_patience=6.0, step_borrow_times=True))
    assert ctrl.step_chooser.max_patience == 6.0 and ctrl.step_chooser.borrow


def test_requests_held_at_their_thinking_budget_count_in_every_depth_s_tokens() -> None:
    # One request to choose for and seven held at depth 0: a deeper step costs all eight the extra
    # time but only one gains from it (the seventh GPU session's c >= 4 cells: half the steps held,
    # the chooser counting only the rest, ran depth 3 at 0.81x fixed-1).
    def depth_for(held: int) -> int:
        # Depth 0 priced at its own time below (``step_one_pass`` off).
        ctrl = DepthController(K, ControllerSettings(step_depth=True, explore_share=0.0, step_one_pass=False, seed=3))
        batch = [request("a", "answer", K, True)]
        for n in range(held):
            ledger = request(f"h{n}", "reasoning", K, True)
            ledger.budget_hold = True
            batch.append(ledger)
        for depth, ms in enumerate([20, 22, 24, 26]):
            ctrl.step_chooser.observe(bucket_of(len(batch)), depth, ms / 1e3)
        plan = ctrl.plan(batch)
        assert plan.step_window is not None and set(plan.depths) == {"a"}
        return plan.step_window.depth

    # At the prior's acceptance (0.5, 0.25, 0.125): alone, depth 2 (1.75 tokens in 24 ms) is best;
    # with seven held, 8 tokens in 20 ms at depth 0 beat 8.75 in 24 ms.
    assert depth_for(0) == 2
    assert depth_for(7) == 0


def test_a_held_request_leaving_its_hold_in_the_window_counts_at_its_answers_gain_after() -> None:
    """A token a step while held, then the answer's 1 + E(min(cap, D)), within its tokens left."""
    chooser = StepDepthChooser(K, random.Random(0))
    leaving = Leaving(ANSWER, K, held_steps=3, left=None)
    assert chooser.tokens_at(1, [], [], 0.0, [], [leaving]) == pytest.approx((3 + 5 * 1.70) / 8)
    assert chooser.tokens_at(0, [], [], 0.0, [], [leaving]) == pytest.approx(1.0)
    capped = replace(leaving, cap=1)
    assert chooser.tokens_at(3, [], [], 0.0, [], [capped]) == pytest.approx((3 + 5 * 1.70) / 8)
    short = replace(leaving, left=4)  # 4 answer tokens: 4 / 2.75 steps of them, then one a step
    assert chooser.tokens_at(3, [], [], 0.0, [], [short]) == pytest.approx((3 + 4 + 5 - 4 / 2.75) / 8)


def held_batch(held: int, held_tokens: int, batch: int = 64) -> list[RequestLedger]:
    """``batch`` adaptive requests capped at depth 1 (the choice between 0 and 1), ``held`` of them
    held at their thinking budget for ``held_tokens`` tokens so far, the rest answering."""
    out = [request(f"a{n}", "answer", 1, True) for n in range(batch - held)]
    for n in range(held):
        ledger = request(f"h{n}", "reasoning", 1, True)
        ledger.budget_hold, ledger.held_tokens, ledger.max_tokens_left = True, held_tokens, 40
        out.append(ledger)
    return out


@pytest.mark.parametrize("hold_ends", [True, False])
def test_a_batch_about_to_leave_its_hold_is_chosen_for_at_the_depth_its_answers_pay(hold_ends: bool) -> None:
    """The twentieth GPU session (c=64): 64 requests reach their thinking budget's hold together and
    leave it together; chosen with 56 held as if they stayed held, 32 depth-0 windows ran while
    the batch answered, where depth 1 yielded 16-25% more per ms. Holds measured at 24 tokens, a
    batch 22 tokens into them leaves after 2 of the window's 8 steps."""
    # Depth 0 priced at its own time below (``step_one_pass`` off).
    settings = ControllerSettings(
        step_depth=True, explore_share=0.0, step_hold_ends=hold_ends, step_one_pass=False, seed=3
    )
    ctrl = DepthController(K, settings)
    for depth, ms in enumerate([8.5, 9.9, 11.5, 13.0]):  # an H200 at batch 64 (depth 1: 1.16x)
        ctrl.step_chooser.observe(bucket_of(64), depth, ms / 1e3)
    answer = ctrl.phase_rates("answer")
    for n in range(300):  # answers accepted 70% of the time
        answer.observe(K, K, K if n % 10 < 7 else 0)
    # Depth 0: 64 tokens in 8.5 ms. Depth 1: 8 x 1.7 + 56 x (2 + 6 x 1.7) / 8 = 99 tokens in 9.9 ms,
    # counted as held for the whole window 8 x 1.7 + 56 = 69.6.
    for _ in range(24):
        ctrl.hold_ended(24)
    assert ctrl.hold_length() == 24
    plan = ctrl.plan(held_batch(56, 22))
    assert plan.step_window is not None
    assert plan.step_window.depth == (1 if hold_ends else 0)
    ctrl.step_chooser.current = None
    plan = ctrl.plan(held_batch(56, 10))  # 14 more tokens held: the whole window
    assert plan.step_window is not None and plan.step_window.depth == 0


def test_the_hook_measures_each_hold_from_its_start_to_its_end() -> None:
    """Holds end when the phase turns to the answer; the controller keeps their lengths."""
    ctrl = DepthController(K, ControllerSettings(step_depth=True))
    assert ctrl.hold_length() is None
    for tokens in (20, 24, 30):
        ctrl.hold_ended(tokens)
    assert ctrl.hold_length() == 24
    assert ctrl.snapshot(reset_window=False)["hold_tokens"] == 24


def test_a_window_records_the_tokens_its_choice_expected_and_what_its_steps_yielded() -> None:
    # What the next GPU run needs to tell a misread time from a misread yield: per window, the
    # tokens per step the choice counted on (two requests at STRONG, one held) and those that came.
    chooser = timed([20, 21, 22, 23])
    clock = 1.0
    window = chooser.choose(3, [STRONG, STRONG], [K, 1], explore_share=0.0, fixed_tokens=1.0)
    while window.finished < chooser.window_steps:
        if window.finished:
            assert chooser.choose(3, [STRONG, STRONG], [K, 1], explore_share=0.0, fixed_tokens=1.0) is window
        chooser.step_finished(window, 3, clock, clock + 0.02, tokens=4)
        clock += 0.02
    assert window.depth == 3
    (row,) = chooser.windows_snapshot()
    assert row[7] == pytest.approx(1 + (1 + STRONG[3]) + (1 + STRONG[1]), abs=0.01)
    assert row[8] == 4.0


@pytest.mark.parametrize("one_pass", [False, True])
def test_depth_0_is_timed_as_depth_1_s_drafter_pass_less_the_drafts_it_does_not_verify(one_pass: bool) -> None:
    # Windows as an H100 timed them at c=16 (twenty-fourth GPU session): depth 0 at 12.5 ms a step
    # beside depth 1 at 13.8, every request verifying the window's depth. vLLM drafts at least one
    # a step, so the 10% between them is the drafts verified: with 14 of 16 requests held (verifying
    # none at either depth), depth 1 costs about 1% more than depth 0, not 10%.
    chooser = StepDepthChooser(K, random.Random(0), one_pass=one_pass)
    for depth, ms in [(0, 12.5), (1, 13.8), (0, 12.5), (1, 13.8), (2, 18.7), (1, 13.8), (3, 20.8), (1, 13.8)]:
        chooser.observe(4, depth, ms / 1e3, share=float(depth))
    held, gains = 14, [0.0, 0.55, 0.75, 0.85]  # two requests reasoning, at reasoning's acceptance
    window = chooser.choose(16, [gains] * 2, [K] * 2, explore_share=0.0, fixed_tokens=float(held), fixed_drafts=0.0)
    t0, t1 = chooser.times[4].estimates([0.0, 2 / 16, 4 / 16, 6 / 16])[:2]
    assert t0 is not None and t1 is not None
    if one_pass:
        assert t1 / t0 == pytest.approx(1.104 ** (2 / 16), rel=1e-3)
        assert window.depth == 1, "14 + 2 x 1.55 tokens for 1% more time"
    else:
        assert t1 / t0 == pytest.approx(1.104, rel=1e-3), "one time per depth: the slope cannot be fitted"
        assert window.depth == 0
