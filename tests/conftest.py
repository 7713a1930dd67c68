"""Shared fixtures.

``open_log`` is the seam the backend conformance suite parametrizes: store tests ask it for a
log and never name a backend class themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings

from evq.backends.config import StoreConfig
from evq.backends.registry import open_log as open_backend
from evq.domain.clock import Clock, ManualClock
from evq.domain.log import MessageLog

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.register_profile("ci", parent=settings.get_profile("default"), max_examples=60)
settings.load_profile("ci" if os.environ.get("CI") else "default")

# Small segments so that tests cross segment boundaries with a few hundred messages.
SMALL = StoreConfig(
    commitlog_segment_size=64 * 1024,
    consume_queue_entries=64,
    index_slots=97,
    index_entries=200,
    warm_segments=False,
)

OpenLog = Callable[..., MessageLog]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def backend() -> str:
    """The backend under test; the conformance suite parametrizes this."""
    return "mmap"


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock, backend: str) -> Iterator[OpenLog]:
    """``open_log(path=None, clock=None, **config)`` opens (or reopens) a store; every log it
    opened is closed at teardown."""
    opened: list[MessageLog] = []

    def _open(path: Path | None = None, clock_: Clock | None = None, **overrides: object) -> MessageLog:
        cfg = attrs.evolve(SMALL, **overrides)
        log = open_backend(backend, path or tmp_path / "store", cfg, clock=clock_ or clock,
                           background=False)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.close()
