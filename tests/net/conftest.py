"""Runs ``async def`` tests on the loop production uses (uvloop when installed).

Each coroutine test gets a fresh loop and a time limit, so a transport bug shows up as a failed
test rather than a hung run.  Fixtures stay synchronous; tests start servers themselves.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from evq.net.transport import new_event_loop

TEST_TIME_LIMIT = 30.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIME_LIMIT))
    return True
