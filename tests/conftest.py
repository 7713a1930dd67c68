"""Shared fixtures and Hypothesis profiles.

``open_log`` is the seam the backend conformance suite parametrizes: store tests ask it for a
log and never name a backend class themselves.  A module marked ``transient_pool_too`` runs
its backend tests once more on mmap with RocketMQ's transient store pool on (``mmap-pool``),
each append followed by a flush so that the records are committed and readable at once
(:class:`CommittingLog`); what readers see before a commit is tested in
tests/backends/test_transient_pool.py.

Hypothesis profile by ``EVQ_HYPOTHESIS_PROFILE`` (default ``dev``; ``ci`` when CI is set):
``fast`` 20 examples for an edit-test loop, ``dev`` 100, ``ci`` 100 derandomized so a failure
reproduces from the same seed, ``thorough`` 2000 for hunting codec bugs by hand.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, settings

from evq.backends.config import StoreConfig
from evq.backends.registry import BACKENDS
from evq.backends.registry import open_log as open_backend
from evq.domain.clock import Clock, ManualClock
from evq.domain.log import MessageLog
from evq.domain.record import PutRecord

# Every JVM the suite starts (a Spark driver, in this process, in `evq bench spark` or in a
# README block; a standalone cluster's daemons and executors) lives seconds to a minute on two
# shared cores, where the C2 compiler's threads take more CPU than their code gives back: with
# the C1 tier alone the Spark tests and bench run in about 3/4 of the time (tests/spark/
# test_bench_spark, test_columns, test_spark_connector: 153 and 210 s -> 112 and 126 s, runs
# in turn).  A JIT tier changes no behaviour.  Inherited by every child process; a
# JAVA_TOOL_OPTIONS already set is left alone.  (Each JVM says "Picked up JAVA_TOOL_OPTIONS"
# on its stderr.)
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

_base = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fast", _base, max_examples=20)
settings.register_profile("dev", _base, max_examples=100)
settings.register_profile("ci", _base, max_examples=100, derandomize=True, print_blob=True)
settings.register_profile("thorough", _base, max_examples=2000)
settings.load_profile(
    os.environ.get("EVQ_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("evq chaos suite (tests/chaos)")
    group.addoption("--chaos-long", action="store_true",
                    help="run the chaos suite long: 200 kill rounds and more hostile cases")
    group.addoption("--chaos-report", metavar="PATH", default=None,
                    help="append the chaos suite's figures (JSON lines) to PATH")

# Small segments so that tests cross segment boundaries with a few hundred messages.
SMALL = StoreConfig(
    commitlog_segment_size=64 * 1024,
    consume_queue_entries=64,
    index_slots=97,
    index_entries=200,
    warm_segments=False,
)

OpenLog = Callable[..., MessageLog]


class CommittingLog:
    """A store with the transient store pool that commits (and flushes) after every append,
    so a test reads its own writes at once; everything else goes to the store itself."""

    __slots__ = ("inner",)

    def __init__(self, inner: MessageLog):
        self.inner = inner

    def append(self, records: list[PutRecord]) -> object:
        results = self.inner.append(records)
        self.inner.flush()
        return results

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def __enter__(self) -> CommittingLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()


POOL_VARIANT = "mmap-pool"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``mmap-pool`` variant of ``backend`` runs only in modules (or tests) marked
    ``transient_pool_too``; elsewhere it is deselected."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        pooled = callspec is not None and callspec.params.get("backend") == POOL_VARIANT
        if pooled and item.get_closest_marker("transient_pool_too") is None:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=[*sorted(BACKENDS), POOL_VARIANT])
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: every store test runs once per registered backend (and, where
    marked ``transient_pool_too``, on ``mmap-pool``: mmap, with :func:`transient_pool`)."""
    return "mmap" if request.param == POOL_VARIANT else str(request.param)


@pytest.fixture
def transient_pool(request: pytest.FixtureRequest) -> bool:
    """Whether ``open_log`` turns the transient store pool on (the ``mmap-pool`` variant)."""
    callspec = getattr(request.node, "callspec", None)
    return callspec is not None and callspec.params.get("backend") == POOL_VARIANT


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock, backend: str,
             transient_pool: bool) -> Iterator[OpenLog]:
    """``open_log(path=None, clock=None, **config)`` opens (or reopens) a store; every log it
    opened is closed at teardown."""
    opened: list[MessageLog] = []

    def _open(
        path: Path | None = None, clock_: Clock | None = None, **overrides: object
    ) -> MessageLog:
        if transient_pool:
            overrides = {"transient_store_pool_enable": True} | overrides
        cfg = attrs.evolve(SMALL, **overrides)
        log = open_backend(backend, path or tmp_path / "store", cfg, clock=clock_ or clock,
                           background=False)
        opened.append(log)
        return CommittingLog(log) if transient_pool else log  # type: ignore[return-value]

    yield _open
    for log in opened:
        log.close()


@pytest.fixture(autouse=True)
def _reap_stock_clients() -> Iterator[None]:
    """Stock C++ clients a test started end with the test, whatever became of it."""
    yield
    from tests.compat.conftest import reap_stock_clients

    reap_stock_clients()
