"""Shadow drafts and per-position rates on synthetic step sequences."""

from __future__ import annotations

import random

import pytest

from engine.acceptance import PositionRates, RequestRates, RequestWeights, Resolved, ShadowBook, WeightChooser


def test_cut_drafts_resolve_against_the_tokens_that_follow() -> None:
    book = ShadowBook()
    out = [1, 2]
    # Step: drafts [3, 4, 5] proposed for positions 2..4, one verified and accepted.
    book.propose(2, [3, 4, 5], observed=3, verified=1, phase="answer")
    book.verified(1)
    out += [3, 4]  # the accepted draft and the bonus token
    assert book.feed(out) == []  # position 3 still unknown
    out += [9]
    assert book.feed(out) == [Resolved(3, 3, 2, 1, "answer", agrees=True)]
    assert not book.pending


def test_a_mismatch_decides_at_once_and_agreement_is_checked() -> None:
    book = ShadowBook()
    book.propose(0, [7, 8, 9], observed=3, verified=3, phase="reasoning")
    book.verified(1)
    assert book.feed([7, 1]) == [Resolved(3, 3, 1, 3, "reasoning", agrees=True)]
    book.propose(2, [5, 6], observed=3, verified=2, phase="reasoning")
    book.verified(2)  # vLLM says both accepted, but the tokens say only one matched
    assert book.feed([7, 1, 5, 0]) == [Resolved(3, 2, 1, 2, "reasoning", agrees=False)]


def test_depth_zero_and_empty_proposals() -> None:
    book = ShadowBook()
    book.propose(0, [], observed=3, verified=0, phase="a")  # the drafter found nothing
    book.propose(1, [4, 4], observed=2, verified=0, phase="a")  # depth 0: all cut
    assert book.feed([1]) == [Resolved(3, 0, 0, 0, "a", None)]
    assert book.feed([1, 4, 4]) == [Resolved(2, 2, 2, 0, "a", None)]


def test_proposals_overlap_and_resolve_out_of_order() -> None:
    book = ShadowBook()
    book.propose(0, [1, 2, 3], observed=3, verified=0, phase="a")
    book.propose(1, [9], observed=1, verified=0, phase="a")
    assert book.feed([1, 2]) == [Resolved(1, 1, 0, 0, "a", None)]
    assert book.feed([1, 2, 3]) == [Resolved(3, 3, 3, 0, "a", None)]


def test_position_rates_count_only_observed_positions_and_forget() -> None:
    rates = PositionRates.prior([0.5, 0.25], [1.0, 1.0], weight=1.0, keep=1.0)
    rates.observe(observed=1, proposed=1, run=1)  # position 2 was not open to the drafter
    assert rates.accepted() == [0.75, 0.25]
    rates.observe(observed=2, proposed=0, run=0)  # the drafter proposed nothing
    assert rates.accepted() == pytest.approx([0.5, 0.125])
    assert rates.proposed() == pytest.approx([2 / 3, 0.5])
    fast = PositionRates.prior([0.0], [1.0], weight=1.0, keep=0.5)
    for _ in range(20):
        fast.observe(1, 1, 1)
    assert fast.accepted()[0] > 0.99


def test_a_request_estimate_is_its_phase_shrunk_towards_by_its_own_history() -> None:
    phase = PositionRates.prior([0.5, 0.25], [1.0, 1.0], weight=10.0, keep=1.0)
    rates = RequestRates.start(phase, keep=1.0)
    assert rates.estimate((8.0, 8.0)) == ([0.5, 0.25], [1.0, 1.0]), "no history: the phase's estimate"
    rates.own.observe(observed=2, proposed=2, run=2)
    rates.own.observe(observed=2, proposed=2, run=2)
    # Acceptance given a proposal: (8 x 0.5 + 2) / (8 + 2) and (8 x 0.25 + 2) / 10.
    assert rates.estimate((8.0, 8.0))[0] == pytest.approx([0.6, 0.4])
    assert rates.estimate((2.0, 8.0))[0] == pytest.approx([(1 + 2) / 4, (0.5 + 2) / 4])
    # Its drafter stops finding matches: the proposal rate falls, acceptance given one does not.
    rates.own.observe(observed=2, proposed=0, run=0)
    rates.own.observe(observed=2, proposed=0, run=0)
    accepted, proposed = rates.estimate((8.0, 2.0))
    assert proposed == pytest.approx([(2 + 2) / 6] * 2)
    assert accepted == pytest.approx([0.6 * 4 / 6, 0.4 * 4 / 6])
    phase.observe(observed=2, proposed=0, run=0)  # the phase moves: so does the request's prior
    assert rates.estimate((8.0, 8.0))[1][0] == pytest.approx((8 * 10 / 11 + 2) / 12)


def _stream(weights: RequestWeights, phase: PositionRates, per_request: list[float], rng: random.Random) -> None:
    """Requests of one phase, each accepting its first draft with its own probability."""
    for accept in per_request:
        rates = RequestRates.start(phase, keep=0.95)
        for _ in range(40):
            run = 1 if rng.random() < accept else 0
            weights.score(rates, 1, 1, run)
            rates.own.observe(1, 1, run)
            phase.observe(1, 1, run)


@pytest.mark.parametrize(
    ("spread", "expected"),
    [
        # Requests that differ (some copy, some reason freely): trust their own history.
        ((0.05, 0.95), 2.0),
        # Alike requests: their own runs are luck, the phase knows better.
        ((0.5, 0.5), 512.0),
    ],
)
def test_the_weight_that_predicted_best_is_chosen(spread: tuple[float, float], expected: float) -> None:
    rng = random.Random(7)
    phase = PositionRates.prior([0.5], [1.0], weight=1.0, keep=0.995)

    def chooser() -> WeightChooser:
        return WeightChooser((2.0, 8.0, 32.0, 128.0, 512.0), default=8.0, keep=0.999, min_samples=100.0)

    weights = RequestWeights(chooser(), chooser())
    assert weights.best() == (8.0, 8.0), "nothing scored yet: the default"
    _stream(weights, phase, [rng.choice(spread) for _ in range(60)], rng)
    assert weights.accept.best() == expected, weights.as_dict()
