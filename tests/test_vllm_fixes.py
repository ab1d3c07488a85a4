"""engine/vllm_fixes.py: the replacement is exact, and the probe tells a broken expand from a good one.

That the fix is applied in the real engine's worker, and what it changes, is tested on the real
engine: tests/test_sampling_fidelity.py (without the fix its depth-3 arm moved by TV 0.545) and
the ``vllm_fixes`` entry of ``/phasespec/state`` (tests/test_phase_server.py)."""

from __future__ import annotations

import torch

from engine.vllm_fixes import _expand_is_wrong, expand_batch_to_tokens


def test_expand_repeats_each_request_over_its_tokens_and_replaces_greedy() -> None:
    x = torch.tensor([0.6, 0.0, 1.3, 0.9])
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    got = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    assert torch.equal(got, torch.tensor([0.6, 0.6, 1.3, 1.3, 1.3, 0.9]))
    assert torch.equal(expand_batch_to_tokens(torch.tensor([5, 0]), cu[:2], 2), torch.tensor([5, 5]))


def test_the_probe_accepts_a_correct_expand_and_rejects_broken_ones() -> None:
    assert not _expand_is_wrong(expand_batch_to_tokens)

    def unwritten(
        x: torch.Tensor, cu: torch.Tensor, n: int, replace_from: int = 0, replace_to: int = 0
    ) -> torch.Tensor:
        return torch.full((n,), float("inf"))  # what new_empty left behind

    def truncating(
        x: torch.Tensor, cu: torch.Tensor, n: int, replace_from: int = 0, replace_to: int = 0
    ) -> torch.Tensor:
        return expand_batch_to_tokens(x.to(torch.int64), cu, n, replace_from, replace_to).to(x.dtype)

    def raising(*_: object, **__: object) -> torch.Tensor:
        raise TypeError("kernel not registered")

    assert _expand_is_wrong(unwritten) and _expand_is_wrong(truncating) and _expand_is_wrong(raising)
