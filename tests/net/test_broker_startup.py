"""A broker takes connections only once its store is open: in the start-up window a client
is refused a connection (and retries), never answered a code it gives up on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evq.domain.codes import ResponseCode
from evq.net.broker import BrokerServer
from evq.net.codes import RequestCode
from evq.net.transport import ConnectError, RemotingClient
from evq.settings import build
from tests.net.test_broker_server import call, send_fields
from tests.processes import free_port


async def test_sends_during_start_up_are_refused_a_connection_or_stored(tmp_path: Path) -> None:
    port = free_port()
    settings = build({"listen_port": port, "store_path_root_dir": str(tmp_path),
                      "warm_segments": False, "commitlog_segment_size": 1 << 20})
    server = BrokerServer(settings)
    starting = asyncio.create_task(server.start())
    refused = 0
    answers: list[int] = []
    try:
        while not answers:  # until a send gets any answer at all
            try:
                async with RemotingClient("127.0.0.1", port) as c:
                    answers.append((await call(c, RequestCode.SEND_MESSAGE, send_fields("T"),
                                               b"early")).code)
            except ConnectError:
                refused += 1
                await asyncio.sleep(0.001)
        await starting
        assert answers == [ResponseCode.SUCCESS]
        assert refused > 0, "the test never hit the start-up window"
    finally:
        await starting
        await server.shutdown(grace=1.0)
