"""Waiting on a condition another process or thread brings about, never on a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(what: str, condition: Callable[[], bool], *, within: float = 30.0,
             every: float = 0.05) -> None:
    """Poll ``condition`` every ``every`` seconds until it holds; after ``within`` seconds
    fail the test, naming ``what`` it waited for."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within:g} s for {what}")
        time.sleep(every)
