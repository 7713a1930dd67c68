"""Client tests run against a real ``evq namesrv`` and a real ``evq broker``, each its own
process on free ports, and drive the client's coroutines on evq's default event loop.

``cluster`` yields once the broker's first registration reached the name server: the broker
prints its address before that, and a client that looks routes up in between is told no
topic exists, ``TBW102`` included.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from evq.net.transport import new_event_loop
from tests.compat.conftest import Served
from tests.processes import running_broker, running_namesrv

__all__ = ["Served", "cluster"]

TEST_TIME_LIMIT = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Served]:
    """A name server and a broker; ``proc`` is the broker's process."""
    with running_namesrv() as namesrv, running_broker(namesrv, tmp_path / "data") as broker:
        yield Served(namesrv, broker.addresses["broker"], broker.proc)
        assert broker.stop() == 0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
