"""A server run by ``run_until_signal`` for the shutdown test; driven through stdout.

Prints its port, then ``parked`` when a PULL_MESSAGE request is being handled; that handler
answers only once the stop signal arrived, so the answer proves in-flight requests survive
shutdown.  Prints ``stopped`` after the server has shut down.
"""

from __future__ import annotations

import asyncio

from evq import logs
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Dispatcher, RemotingServer, run_until_signal


async def serve(stop: asyncio.Event) -> int:
    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        print("parked", flush=True)
        await stop.wait()
        return cmd.response(fields={"answered": "after stop"})

    server = RemotingServer("127.0.0.1", 0, Dispatcher({RequestCode.PULL_MESSAGE: parked}))
    await server.start()
    print(server.port, flush=True)
    await stop.wait()
    await server.shutdown(grace=5.0)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    logs.configure(json=True)  # to stderr: stdout is the test's channel
    raise SystemExit(run_until_signal(serve))
