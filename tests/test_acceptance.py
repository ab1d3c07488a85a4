"""Shadow drafts and per-position rates on synthetic step sequences."""

from __future__ import annotations

import pytest

from engine.acceptance import PositionRates, Resolved, ShadowBook


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
    fast.restart_from(rates, weight=4.0)
    assert fast.accepted() == pytest.approx([0.5, 0.125]) and fast.samples() == [4.0, 4.0]
