"""Client tests run against a real ``evq serve`` process (the ``served`` fixture of the
stock-client tests) and drive the client's coroutines on evq's default event loop.

``cluster`` is ``served`` once the broker's first registration reached the name server: the
process prints its addresses before that, and a client that looks routes up in between is
told no topic exists, ``TBW102`` included.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from evq.client.errors import RouteNotFound
from evq.client.routes import Routes
from evq.domain import topics as tp
from evq.net.transport import new_event_loop
from tests.compat.conftest import Served, served

__all__ = ["Served", "cluster", "served", "wait_registered"]

TEST_TIME_LIMIT = 60.0
REGISTRATION_WAIT_S = 20.0


async def _registered(namesrv: str) -> bool:
    routes = Routes(namesrv)
    try:
        await routes.lookup(tp.AUTO_CREATE_TOPIC)
        return True
    except RouteNotFound:
        return False
    finally:
        await routes.close()


def wait_registered(namesrv: str) -> None:
    deadline = time.monotonic() + REGISTRATION_WAIT_S
    while not asyncio.run(_registered(namesrv)):
        if time.monotonic() > deadline:
            raise RuntimeError("the broker never registered with the name server")
        time.sleep(0.1)


@pytest.fixture
def cluster(served: Served) -> Served:
    wait_registered(served.namesrv)
    return served


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
