"""The embedded model's own drafter: a lower-precision copy of it, served by vLLM's ``draft_model`` method.

vLLM's ``draft_model`` speculative method runs a second, smaller or cheaper
model of the same vocabulary and proposes K tokens on every step (unlike
ngram, which proposes only when the context repeats). The embedded 135M model
has no trained drafter, so this builds one from the target itself: every
decoder weight matrix rounded per output row to ``BITS`` bits (symmetric,
stored as float32 so any vLLM can load it). Embeddings and norms stay exact.

Why this construction (measured on the CPU engine at depth 3, docs/design.md): an
untrained early exit (the first 4 or 16 layers) accepts ~2% of drafts and a
copy with the middle layers skipped 8%; a rounded full copy accepts in
proportion to how sure the target is, so its acceptance differs by phase as a
real drafter's does (4 bits: reasoning ~24%, answer ~50%). Its cost is a full
target forward per draft token: on any machine it is a drafter for the
mechanism and the acceptance, not for speed.

The directory's name must not contain ``eagle``, ``dflash`` or ``dspark``:
vLLM infers the speculative method from the path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engine.default_model import MODEL_NAME, ensure_default_model, log_step

BITS = 4
DRAFT_NAME = f"{MODEL_NAME}-draft-q{BITS}"
BUILD_VERSION = "1"
_MARKER = ".phasespec-complete"
_COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "special_tokens_map.json", "chat_template.jinja")  # fmt: skip


def round_rows(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Round a 2-D weight to ``bits`` bits per output row (symmetric, one scale per row)."""
    levels = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
    rounded: torch.Tensor = torch.round(weight / scale).clamp(-levels, levels) * scale
    return rounded.to(weight.dtype)


def ensure_self_draft(cache_dir: Path) -> Path:
    """Return the drafter's directory beside the target's, building it first if needed."""
    target = ensure_default_model(cache_dir)
    out = cache_dir / DRAFT_NAME
    marker = out / _MARKER
    if marker.is_file() and marker.read_text().strip() == BUILD_VERSION:
        return out
    log_step(f"preparing the embedded self-draft ({BITS}-bit copy) in {out} (first use only)")
    staging = cache_dir / f".{DRAFT_NAME}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _build(target, staging)
    (staging / _MARKER).write_text(BUILD_VERSION)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    log_step("embedded self-draft ready")
    return out


def _build(target: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(target / "model.safetensors"))
    rounded = {
        name: round_rows(tensor, BITS) if name.startswith("model.layers.") and tensor.dim() == 2 else tensor
        for name, tensor in tensors.items()
    }
    save_file(rounded, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in _COPIED:
        if (target / name).is_file():
            shutil.copy2(target / name, out / name)
    (out / "phasespec_draft.json").write_text(json.dumps({"source": MODEL_NAME, "bits": BITS, "per": "output row"}))
