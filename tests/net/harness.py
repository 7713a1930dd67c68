"""What the network tests share: servers and clients on free ports, a hand-driven peer."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable, Mapping

from evq.domain.clock import Clock, ManualClock
from evq.net.codes import RequestCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from evq.net.transport import (
    Connection,
    Dispatcher,
    Handler,
    RemotingClient,
    RemotingServer,
    TransportConfig,
)

HOST = "127.0.0.1"
TIMEOUT = 5.0
SLOW = RequestCode.PULL_MESSAGE
FAST = RequestCode.HEART_BEAT
ECHO = RequestCode.SEND_MESSAGE


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(fields=cmd.ext_fields, body=cmd.body)


@contextlib.asynccontextmanager
async def serving(
    handlers: Mapping[int, Handler], clock: Clock | None = None, **config: float
) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(
        HOST, 0, Dispatcher(handlers), config=TransportConfig(**config),  # type: ignore[arg-type]
        clock=clock or ManualClock(),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown(grace=1.0)


@contextlib.asynccontextmanager
async def client_of(
    server: RemotingServer, dispatcher: Dispatcher | None = None
) -> AsyncIterator[RemotingClient]:
    async with RemotingClient(HOST, server.port, dispatcher) as client:
        yield client


class RawPeer:
    """A peer that writes bytes by hand and reads frames back, to speak out of turn."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, server: RemotingServer) -> AsyncIterator[RawPeer]:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        try:
            yield cls(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self) -> RemotingCommand | None:
        """The next frame, or None at end of stream."""
        while (cmd := self.decoder.next_command()) is None:
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT)
            if not data:
                return None
            self.decoder.feed(data)
        return cmd


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait for a condition another task brings about (polling; bounded by the test limit)."""
    while not predicate():
        await asyncio.sleep(0.005)


