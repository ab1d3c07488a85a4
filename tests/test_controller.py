"""The adaptive controller's pure parts: decision function, cost model, convergence."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.acceptance import Resolved
from engine.controller import ControllerSettings, DepthController
from engine.cost_model import CostEstimate, StepCostModel, bucket_of
from engine.depth_choice import Candidate, best_depths, expected_rate, settle
from engine.spec_stats import RequestLedger

K = 3
SETTLE_STEPS = 60
"""Steps from a cold start to the best depth: the 40 warm-up (random) steps teach the cost slope
and the acceptance; over 60 seeds x the 4 cases below the first decided step after them was
the best in 237 of 240 runs, and the other 3 (flat cost, a near tie at position 3) settled by step 58."""
ALWAYS = [1.0, 1.0, 1.0]


def request(rid: str, phase: str = "reasoning", cap: int = K, proposed: int | None = None) -> RequestLedger:
    """An adaptive request as the hook hands it to the controller (the same object every step)."""
    ledger = RequestLedger(rid, cap, phase, K, engine_id=rid, proposed=proposed)
    ledger.set_mode(cap, adaptive=True)
    return ledger


def chain(a: float) -> list[float]:
    """c[j] = a**j: every position accepted with probability a, given the ones before."""
    return [a ** (j + 1) for j in range(K)]


def cand(accepted: list[float], proposed: list[float] = ALWAYS, low: int = 0, high: int = K) -> Candidate:
    return Candidate(accepted, proposed, low, high)


def ms(base: float, per_draft: float) -> CostEstimate:
    return CostEstimate(base / 1e3, per_draft / 1e3, 100.0)


@pytest.mark.parametrize(
    ("name", "candidates", "cost", "expected"),
    [
        # The user's machine (7 + 48 ms per token): reasoning at 40% acceptance
        # pays 48 ms for 0.4 tokens while a plain step makes 1 token in 55 ms.
        ("offload, low acceptance: depth 0", [cand(chain(0.4))], ms(55, 48), [0]),
        # Answer at 90%: the first draft pays for its 48 ms, the second does not
        # (18.4 tok/s at depth 1, 17.9 at 2: the user's 17.4-17.9 at k=2).
        ("offload, high acceptance: an intermediate depth", [cand(chain(0.9))], ms(55, 48), [1]),
        # Cheaper drafts and higher acceptance: K.
        ("cheap drafts, high acceptance: K", [cand(chain(0.95))], ms(55, 20), [K]),
        # Flat cost (this CPU at batch 1): any acceptance above 0 goes deepest.
        ("flat cost: K", [cand(chain(0.3))], ms(45, 0), [K]),
        # Acceptance that collapses after position 1: stop there.
        ("cliff after 1: depth 1", [cand([0.8, 0.1, 0.05])], ms(55, 20), [1]),
        # Two requests in one batch, one reasoning and one answering.
        ("mixed batch: different depths", [cand(chain(0.3)), cand(chain(0.95))], ms(100, 15), [0, K]),
        # A cap keeps the controller below it.
        ("cap", [cand(chain(0.95), high=2)], ms(45, 0), [2]),
        # A fixed-depth batch-mate is not moved.
        ("fixed batch-mate", [cand(chain(0.3), low=2, high=2), cand(chain(0.95))], ms(100, 15), [2, K]),
        # Drafts that are rarely proposed cost little when they are not.
        ("rare proposals", [cand([0.2, 0.15, 0.1], [0.25, 0.22, 0.2])], ms(55, 10), [K]),
        # No cost learned yet: the deepest depth that gains anything.
        ("no cost yet", [cand([0.5, 0.0, 0.0])], None, [1]),
    ],
)
def test_best_depths(name: str, candidates: list[Candidate], cost: CostEstimate | None, expected: list[int]) -> None:
    depths, _ = best_depths(candidates, cost)
    assert depths == expected, name


def brute_force(candidates: list[Candidate], cost: CostEstimate) -> float:
    best = 0.0
    for d0 in range(candidates[0].low, candidates[0].high + 1):
        for d1 in range(candidates[1].low, candidates[1].high + 1):
            tokens = sum(1 + sum(c.accepted[:d]) for c, d in zip(candidates, (d0, d1), strict=True))
            drafts = sum(sum(c.proposed[:d]) for c, d in zip(candidates, (d0, d1), strict=True))
            best = max(best, tokens / (cost.base_s + cost.per_draft_s * drafts))
    return best


def test_best_depths_matches_exhaustive_search_on_random_batches() -> None:
    rng = random.Random(7)
    for _ in range(300):
        candidates = [cand(sorted((rng.random() for _ in range(K)), reverse=True)) for _ in range(2)]
        cost = ms(rng.uniform(10, 100), rng.uniform(0, 60))
        _, rate = best_depths(candidates, cost)
        assert rate == pytest.approx(brute_force(candidates, cost), rel=1e-9)


def test_cost_model_learns_the_slope_from_random_steps_despite_confounding() -> None:
    """The ngram case: a step without a match verifies no drafts *and* searched the
    whole context in vain, so a plain regression over natural steps finds drafts
    free (or cheaper than free); the random steps give the true slope."""
    rng = random.Random(1)
    model = StepCostModel()
    true_base, true_slope = 0.050, 0.010
    natural: list[tuple[int, float]] = []
    for step in range(4000):
        random_step = step % 10 == 0
        z = rng.randint(0, K) if random_step else K
        match = rng.random() < 0.7
        drafts = z if match else 0
        seconds = true_base + true_slope * drafts + (0.0 if match else 0.030) + rng.gauss(0, 0.004)
        model.observe(1, drafts, seconds, float(z) if random_step else None)
        if not random_step:
            natural.append((drafts, seconds))
    est = model.estimate(1)
    assert est is not None
    assert est.per_draft_s == pytest.approx(true_slope, abs=0.003)
    mean_d = sum(d for d, _ in natural) / len(natural)
    mean_t = sum(t for _, t in natural) / len(natural)
    ols = sum((d - mean_d) * (t - mean_t) for d, t in natural) / sum((d - mean_d) ** 2 for d, _ in natural)
    assert abs(ols - true_slope) > 0.008  # what a plain regression would have learned


def test_cost_model_tracks_a_linear_cost_and_forgets_an_old_one() -> None:
    rng = random.Random(2)
    model = StepCostModel()
    for slope in (0.002, 0.048):
        for step in range(1500):
            random_step = step % 5 == 0
            drafts = rng.randint(0, K) if random_step else 2
            seconds = 0.007 + slope * drafts + rng.gauss(0, 0.002)
            model.observe(1, drafts, seconds, float(drafts) if random_step else None)
        est = model.estimate(1)
        assert est is not None
        assert est.per_draft_s == pytest.approx(slope, abs=0.003)
        assert est.base_s == pytest.approx(0.007, abs=0.004)


def test_cost_model_buckets_by_batch_size_and_borrows_the_nearest() -> None:
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 64)] == [0, 1, 2, 2, 3, 3, 4, 6]
    model = StepCostModel(min_random=1)
    for drafts in (0, 1, 2, 3) * 10:
        model.observe(4, drafts, 0.1 + 0.01 * drafts, float(drafts))
    assert model.estimate(1) is not None
    assert model.estimate(16).per_draft_s == pytest.approx(0.01)  # type: ignore[union-attr]
    assert StepCostModel().estimate(1) is None


def synthetic_step(
    ctrl: DepthController, r: RequestLedger, rng: random.Random, accepted: list[float], per_draft_s: float
) -> int:
    """One engine step of one adaptive request, drafts 1..j accepted with probability
    accepted[j-1], 55 ms + per_draft_s per draft; returns the depth chosen (-1: a random step)."""
    plan = ctrl.plan([r])
    depth = plan.depths["r"]
    u = rng.random()
    run = sum(1 for c in accepted if u < c)
    ctrl.observe(r, Resolved(K, K, run, depth, "reasoning"))
    ctrl.step_done(1, depth, 0.055 + per_draft_s * depth + rng.gauss(0, 0.002), plan)
    return depth if not plan.explore else -1


@pytest.mark.parametrize(
    ("accepted", "per_draft_s", "best"),
    [(chain(0.4), 0.048, 0), (chain(0.4), 0.0, K), ([0.8, 0.1, 0.05], 0.020, 1), (chain(0.9), 0.010, K)],
)
def test_stationary_stream_settles_on_the_best_depth_and_stays(
    accepted: list[float], per_draft_s: float, best: int
) -> None:
    """Settles within SETTLE_STEPS steps (warm-up included) and never leaves (random steps aside)."""
    rng = random.Random(3)
    ctrl = DepthController(K, ControllerSettings(seed=4))
    r = request("r")
    ctrl.track(r)
    chosen = [synthetic_step(ctrl, r, rng, accepted, per_draft_s) for _ in range(1000)]
    settled = [d for d in chosen[SETTLE_STEPS:] if d >= 0]  # random steps are random by design
    assert len(settled) > 700 and set(settled) == {best}, (accepted, per_draft_s, set(settled))


def test_phase_change_restarts_from_the_new_phase_and_settles_at_once() -> None:
    """Converged phase estimates: at a phase change the first decided step is already the phase's best."""
    rng = random.Random(5)
    ctrl = DepthController(K, ControllerSettings(seed=6, explore_share=0.0, warmup_steps=0))
    for z in (0, 1, 2, 3) * 40:  # a known cost: 55 ms + 48 ms per draft
        ctrl.cost.observe(1, z, 0.055 + 0.048 * z, float(z))
    for phase, accept in (("reasoning", 0.4), ("answer", 0.9)):
        for _ in range(400):
            run = next((j for j in range(K) if rng.random() >= accept), K)
            ctrl.observe(request("other", phase), Resolved(K, K, run, K, phase))  # never planned: phase only
    r = request("r")
    assert ctrl.plan([r]).depths["r"] == 0
    r.phase = "answer"  # what the front end's phase change sets
    assert ctrl.plan([r]).depths["r"] == 1


def test_a_batch_size_without_its_own_cost_slope_explores_more() -> None:
    ctrl = DepthController(K, ControllerSettings(seed=9, warmup_steps=0))
    batch = [request(f"r{i}") for i in range(4)]
    cold = sum(ctrl.plan(batch).explore for _ in range(400)) / 400
    for z in (0, 4, 8, 12) * 10:  # batch 4 learns its slope
        ctrl.cost.observe(4, z, 0.1 + 0.005 * z, float(z))
    warm = sum(ctrl.plan(batch).explore for _ in range(400)) / 400
    assert cold > 0.4 and warm < 0.2, (cold, warm)


def test_one_request_of_a_large_batch_leaves_a_depth_that_stopped_paying() -> None:
    """Hysteresis is per request: a batch-level margin would keep every depth of a 16-batch frozen."""
    good = Candidate([0.9, 0.8, 0.7], [1.0, 1.0, 1.0], 0, 3)
    gone_bad = Candidate([0.1, 0.01, 0.0], [1.0, 1.0, 1.0], 0, 3)
    batch = [good] * 31 + [gone_bad]
    est = ms(40, 0.2)
    chosen, rate = best_depths(batch, est)
    assert chosen == [3] * 31 + [0]
    # The whole batch gains under 1% from it: a batch-level margin would keep depth 3.
    assert rate < expected_rate(batch, [3] * 32, est) * 1.01
    assert settle(batch, chosen, [3] * 32, rate, est, 0.01) == [3] * 31 + [0]


def test_a_near_tie_keeps_the_previous_depth() -> None:
    # Free drafts: depth 2 over 1 gains 0.3 tokens, 16% of the request's 1.9 at depth 2.
    near = Candidate([0.6, 0.3, 0.0], [1.0, 1.0, 1.0], 0, 3)
    est = ms(40, 0.0)
    chosen, rate = best_depths([near], est)
    assert chosen == [2]
    assert settle([near], chosen, [1], rate, est, 0.5) == [1], "within the margin: no flapping"
    assert settle([near], chosen, [1], rate, est, 0.01) == [2], "beyond it: move"
    assert settle([near], chosen, [None], rate, est, 0.5) == [2], "no previous depth: the best one"


def test_the_slope_comes_with_a_standard_error_that_matches_its_scatter() -> None:
    """The IV standard error is what the controller's exploration rests on: over many
    independent runs it must match the estimates' actual scatter (within 30%)."""
    estimates, errors = [], []
    for seed in range(200):
        rng = random.Random(seed)
        model = StepCostModel(keep_random=1.0)
        for _ in range(60):
            z = rng.randint(0, K)
            drafts = z if rng.random() < 0.7 else 0
            model.observe(1, drafts, 0.050 + 0.010 * drafts + rng.gauss(0, 0.004), float(z))
        est = model.estimate(1)
        assert est is not None
        estimates.append(est.per_draft_s)
        errors.append(est.per_draft_se_s)
    mean = sum(estimates) / len(estimates)
    scatter = (sum((e - mean) ** 2 for e in estimates) / (len(estimates) - 1)) ** 0.5
    assert mean == pytest.approx(0.010, abs=0.0005)
    assert sum(errors) / len(errors) == pytest.approx(scatter, rel=0.3), (scatter, errors[:5])
    assert StepCostModel().estimate(1) is None
    borrowed = StepCostModel(min_random=1)
    for z in (0, 1, 2, 3) * 10:
        borrowed.observe(4, z, 0.1 + 0.01 * z + 0.001 * (z % 2), float(z))
    assert borrowed.estimate(4).per_draft_se_s < 0.001  # type: ignore[union-attr]
    assert borrowed.estimate(1).per_draft_se_s == float("inf"), "a borrowed slope is not this size's own"  # type: ignore[union-attr]


def sparse_batch_step(
    ctrl: DepthController, batch: list[RequestLedger], rng: random.Random, known: bool, share_proposing: float = 0.11
) -> None:
    """One step of 16 reasoning requests of which ~11% have drafts (ngram while reasoning here),
    40 ms + 3 ms per verified draft + 4 ms of noise."""
    proposals = [K if rng.random() < share_proposing else 0 for _ in batch]
    for r, n in zip(batch, proposals, strict=True):
        r.proposed = n if known else None
    plan = ctrl.plan(batch)
    drafts = 0
    for r, n in zip(batch, proposals, strict=True):
        verified = min(plan.depths[r.engine_id], n)
        drafts += verified
        if n:
            run = next((j for j in range(n) if rng.random() >= 0.4), n)
            ctrl.observe(r, Resolved(K, n, run, verified, "reasoning"))
    ctrl.step_done(16, drafts, 0.040 + 0.003 * drafts + rng.gauss(0, 0.004), plan)


def test_known_proposals_make_random_steps_informative_at_large_batches() -> None:
    """Run E's failure: at batch 16 with drafts on ~11% of reasoning steps, a random step
    that draws every request's depth moves few drafts, and the slope's scatter was as
    large as the slope. Drawing the instrument from the drafts actually let through,
    and taking random steps only where some request has drafts, shrinks the error."""

    def slope_errors(known: bool) -> list[float]:
        out = []
        for seed in range(12):
            rng = random.Random(seed)
            ctrl = DepthController(K, ControllerSettings(seed=seed))
            batch = [request(f"r{i}") for i in range(16)]
            for _ in range(1500):
                sparse_batch_step(ctrl, batch, rng, known)
            est = ctrl.cost.estimate(16)
            assert est is not None
            out.append(abs(est.per_draft_s - 0.003))
        return out

    known, unknown = slope_errors(True), slope_errors(False)
    assert max(known) < 0.0015, known
    assert sum(known) < 0.5 * sum(unknown), (known, unknown)


def test_a_random_step_waits_for_a_step_with_drafts() -> None:
    ctrl = DepthController(K, ControllerSettings(seed=1, warmup_steps=3))
    empty = [request(f"r{i}", proposed=0) for i in range(4)]
    some = [request("r0", proposed=2), *empty[1:]]
    assert not any(ctrl.plan(empty).explore for _ in range(50)), "nothing to learn from: no random step"
    assert ctrl.explored_steps == 0
    plan = ctrl.plan(some)
    assert plan.explore and plan.full_draft, "the pending random step comes with the first drafts"
    assert plan.instrument == pytest.approx(min(plan.depths["r0"], 2) - sum(min(d, 2) for d in range(K + 1)) / (K + 1))


def test_exploration_settles_once_the_slope_is_known() -> None:
    """Random steps cost drafts that may not pay: once the slope's error is worth under
    ``price_precision`` tokens per draft, only ``settled_explore_share`` of steps explore."""
    rng = random.Random(2)
    ctrl = DepthController(K, ControllerSettings(seed=3))
    assert ctrl._explore_share(1, ctrl.cost.estimate(1)) == ControllerSettings().cold_explore_share
    r = request("r")
    for _ in range(3000):
        synthetic_step(ctrl, r, rng, chain(0.4), 0.048)
    assert ctrl._explore_share(1, ctrl.cost.estimate(1)) == ControllerSettings().settled_explore_share
    noisy = DepthController(K, ControllerSettings(seed=3))
    for z in (0, 1, 2, 3) * 6:  # 24 random steps, 20 ms of noise on a 55 ms step
        noisy.cost.observe(1, z, 0.055 + 0.048 * z + rng.gauss(0, 0.020), float(z))
    assert noisy._explore_share(1, noisy.cost.estimate(1)) == ControllerSettings().explore_share


def test_the_batch_size_slope_is_a_prior_that_a_precise_random_slope_outweighs() -> None:
    """Run E/F's batch 16: a handful of noisy random steps. Steps of 9-16 requests
    verifying no draft give the cost of one more token for free; a precise IV slope wins."""

    def run(random_steps: int, draft_ms: float, noise_s: float) -> CostEstimate:
        rng = random.Random(7)
        model = StepCostModel()
        for step in range(3000):
            batch = 16 if step % 4 else rng.randint(9, 15)  # ramps as requests finish and arrive
            model.observe(batch, 0, 0.020 + 0.002 * batch + rng.gauss(0, 0.002), None)
            if step < random_steps:
                z = rng.randint(0, 2)
                t = 0.020 + 0.002 * 16 + draft_ms / 1e3 * z + rng.gauss(0, noise_s)
                model.observe(16, z, t, z - 1.0)
        est = model.estimate(16)
        assert est is not None
        return est

    prior_only = run(0, 2.0, 0.004)
    assert prior_only.per_draft_s == pytest.approx(0.002, rel=0.1) and prior_only.samples == 0
    noisy = run(14, 2.0, 0.030)  # alone, an IV slope from 14 such steps is anywhere in 0..10 ms
    assert noisy.per_draft_s == pytest.approx(0.002, rel=0.35), noisy
    precise = run(400, 1.0, 0.001)  # drafts here cost half a request's token: the IV says so
    assert precise.per_draft_s == pytest.approx(0.001, rel=0.1), precise


def test_on_the_offload_shape_with_sparse_drafts_few_steps_pay_for_learning() -> None:
    """The emulated moe-offload run's shape: 2 x (7 + 48 x tokens) ms, drafts on 30% of
    reasoning steps, accepted 45% of the time. Depth 0 wins; once the slope is known, random
    steps (1%, only on steps with drafts) verify a draft on well under 1% of steps."""
    rng = random.Random(1)
    ctrl = DepthController(K, ControllerSettings(seed=2))
    verified_steps = 0
    r = request("r")
    for step in range(3000):
        proposed = r.proposed = K if rng.random() < 0.3 else 0
        plan = ctrl.plan([r])
        verified = min(plan.depths["r"], proposed)
        verified_steps += step >= 500 and verified > 0
        if proposed:
            run = next((j for j in range(K) if rng.random() >= 0.45), K)
            ctrl.observe(r, Resolved(K, proposed, run, verified, "reasoning"))
        ctrl.step_done(1, verified, 2 * (0.007 + 0.048 * (1 + verified)), plan)
    assert ctrl.cost.estimate(1).per_draft_s == pytest.approx(0.096)  # type: ignore[union-attr]
    assert verified_steps / 2500 < 0.01, verified_steps
    assert r.chosen == 0


def _streak_steps(settings: ControllerSettings) -> tuple[int, DepthController]:
    """Requests alike (first draft accepted 75% of the time, 30 proposals each) on the
    offload shape, where a draft pays only above 87%: decided steps that verified drafts."""
    rng = random.Random(13)
    ctrl = DepthController(K, settings)
    for z in (0, 1, 2, 3) * 40:
        ctrl.cost.observe(1, z, 2 * (0.007 + 0.048 * (1 + z)), float(z))
    deep = 0
    for n in range(120):
        r = request(f"r{n}", proposed=K)
        ctrl.track(r)
        for _ in range(30):
            depth = ctrl.plan([r]).depths[r.engine_id]
            deep += n >= 20 and depth > 0
            run = next((j for j in range(K) if rng.random() >= 0.75), K)
            ctrl.observe(r, Resolved(K, K, run, depth, "reasoning"))
    return deep, ctrl


def test_alike_requests_lucky_runs_do_not_buy_drafts() -> None:
    """A request's own streak of accepted drafts is luck when its phase's requests are
    alike: the measured weight of the phase estimate keeps it from paying for drafts
    that its next proposals do not keep (the emulated run's 53 depth-1 steps, 6 of 13 accepted)."""
    quiet = ControllerSettings(seed=14, explore_share=0.0, settled_explore_share=0.0, warmup_steps=0)
    measured, ctrl = _streak_steps(quiet)
    trusting, _ = _streak_steps(dataclasses.replace(quiet, request_weights=(2.0,)))
    assert ctrl.weight_chooser("reasoning").accept.best() >= 128.0
    assert trusting > 50 and measured < trusting / 10, (measured, trusting)


def test_the_budget_hold_starts_4_k_plus_1_tokens_before_the_budget_in_reasoning_only() -> None:
    from engine.controller import budget_hold

    assert not budget_hold(31, 48, "reasoning", 3)
    assert budget_hold(32, 48, "reasoning", 3) and budget_hold(60, 48, "reasoning", 3)
    assert budget_hold(0, 8, "default", 3), "a budget inside the first 4(K+1) tokens holds from the start"
    assert not budget_hold(40, 48, "answer", 3) and not budget_hold(40, 48, "tool_call", 3)
    assert not budget_hold(40, None, "reasoning", 3)


def test_a_phase_that_ran_without_drafts_keeps_its_steps_and_tokens_in_the_snapshot() -> None:
    """Under async scheduling a depth-0 phase is never observed (no shadow drafts): its tokens still count."""
    ctrl = DepthController(3)
    ctrl.count("reasoning", 0, 5)
    ctrl.count("reasoning", 0, 1)
    phase = ctrl.snapshot(reset_window=True)["phases"]["reasoning"]
    assert phase["tokens"] == 6 and phase["steps_by_depth"] == [2, 0, 0, 0]
    assert phase["acceptance_by_position"] == [], "no estimate where nothing was verified"
    assert ctrl.snapshot(reset_window=False)["phases"] == {}
