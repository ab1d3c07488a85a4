"""API-key checks (pure)."""

from __future__ import annotations

import pytest

from proxy.auth import is_guarded, key_matches

KEYS = [b"k-one", b"k-two"]


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (b"Bearer k-one", True),
        (b"bearer k-two", True),
        (b"Bearer k-three", False),
        (b"k-one", False),
        (None, False),
        (b"Bearer ", False),
        (b"Bearer k-on", False),
    ],
)
def test_key_matches(header: bytes | None, ok: bool) -> None:
    assert key_matches(header, KEYS) is ok


@pytest.mark.parametrize(
    ("path", "guard_metrics", "guarded"),
    [
        ("/health", True, False),
        ("/metrics", True, True),
        ("/metrics", False, False),
        ("/v1/models", False, True),
        ("/phasespec/state", True, True),
    ],
)
def test_guarded_paths(path: str, guard_metrics: bool, guarded: bool) -> None:
    assert is_guarded(path, guard_metrics) is guarded
