"""Client tests run against a real ``evq serve`` process (the ``served`` fixture of the
stock-client tests) and drive the client's coroutines on evq's default event loop."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from evq.net.transport import new_event_loop
from tests.compat.conftest import Served, served

__all__ = ["Served", "served"]

TEST_TIME_LIMIT = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
