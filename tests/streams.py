"""Streams in client threads, for the tests that stop a server under them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


def start_streams(target: Callable[..., None], calls: Sequence[tuple[Any, ...]]) -> list[threading.Thread]:
    """One daemon thread per ``target(*call)``, started."""
    threads = [threading.Thread(target=target, args=call, daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    return threads


def all_streaming(events: Sequence[Sequence[str]], min_lines: int, timeout_s: float = 60) -> bool:
    """Whether every stream has more than ``min_lines`` lines within the timeout."""
    deadline = time.monotonic() + timeout_s
    while not all(len(e) > min_lines for e in events) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(len(e) > min_lines for e in events)
