"""Client tests run against a real ``evq serve`` process (the ``served`` fixture of the
stock-client tests) and drive the client's coroutines on evq's default event loop.

``cluster`` is ``served`` once the broker's first registration reached the name server: the
process prints its addresses before that, and a client that looks routes up in between is
told no topic exists, ``TBW102`` included.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from evq.net.transport import new_event_loop
from tests.compat.conftest import Served, served, wait_registered

__all__ = ["Served", "cluster", "served", "wait_registered"]

TEST_TIME_LIMIT = 60.0


@pytest.fixture
def cluster(served: Served) -> Served:
    """``served``, which already waits for the broker's first registration."""
    return served


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
