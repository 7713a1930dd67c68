"""A program that uses evq as a library and configures no logging gets nothing on stdout."""

from __future__ import annotations

import subprocess
import sys

from tests.processes import REPO_ROOT, python_env

PROGRAM = """
import asyncio
from evq.net.protocol import RemotingCommand
from evq.net.transport import Dispatcher, RemotingClient, RemotingServer

async def main():
    server = RemotingServer("127.0.0.1", 0, Dispatcher())
    await server.start()
    async with RemotingClient("127.0.0.1", server.port) as client:
        await client.invoke(RemotingCommand.request(10), 5)
    await server.shutdown(0.1)

asyncio.run(main())
print("done")
"""


def test_the_library_prints_nothing_of_its_own() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         cwd=REPO_ROOT, env=python_env(), timeout=60, check=True)
    assert out.stdout == "done\n"  # once: "[debug] connection opened", "listening", ...
    assert out.stderr == ""  # nothing at warning level happened
