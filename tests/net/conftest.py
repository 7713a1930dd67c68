"""Runs ``async def`` tests on both event loops evq runs on: uvloop and plain asyncio.

Production uses uvloop when it is installed and asyncio otherwise (Windows), and the two differ
in how transports buffer and pause, so every coroutine test runs on each.  Each run gets a fresh
loop and a time limit, so a transport bug shows up as a failed test rather than a hung run.
Fixtures stay synchronous; tests start their servers themselves.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import pytest

from evq.net.transport import new_event_loop

TEST_TIME_LIMIT = 30.0
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "default": new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if inspect.iscoroutinefunction(metafunc.function):
        metafunc.fixturenames.append("event_loop_kind")
        metafunc.parametrize("event_loop_kind", list(LOOPS))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    loop_factory = LOOPS[pyfuncitem.callspec.params["event_loop_kind"]]
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
