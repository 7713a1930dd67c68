"""What the network tests share: servers and clients on free ports, a hand-driven peer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from evq.domain.clock import Clock, ManualClock
from evq.net.broker import BrokerServer
from evq.net.codes import RequestCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from evq.net.transport import (
    REQUEST_TASK_NAME,
    Connection,
    Dispatcher,
    Handler,
    RemotingClient,
    RemotingServer,
    TransportConfig,
)
from evq.settings import build

HOST = "127.0.0.1"
TIMEOUT = 5.0
SLOW = RequestCode.PULL_MESSAGE
FAST = RequestCode.HEART_BEAT
ECHO = RequestCode.SEND_MESSAGE


async def echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(fields=cmd.ext_fields, body=cmd.body)


@contextlib.asynccontextmanager
async def serving(
    handlers: Mapping[int, Handler], clock: Clock | None = None, *, eager: bool = False,
    **config: float,
) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(
        HOST, 0, Dispatcher(handlers, eager=eager),
        config=TransportConfig(**config),  # type: ignore[arg-type]
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


@contextlib.asynccontextmanager
async def broker(data: Path, **values: object) -> AsyncIterator[BrokerServer]:
    settings = build({"listen_port": 0, "store_path_root_dir": str(data),
                      "warm_segments": False, "commitlog_segment_size": 1 << 20, **values})
    server = BrokerServer(settings)
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown(grace=1.0)


def handler_tasks() -> list[asyncio.Task[object]]:
    """Tasks answering a peer's request, on every connection of this loop."""
    return [
        t for t in asyncio.all_tasks() if t.get_name() == REQUEST_TASK_NAME
    ]


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def eventually(predicate: Callable[[], bool]) -> None:
    """Wait for a condition another task brings about (polling; bounded by the test limit)."""
    while not predicate():
        await asyncio.sleep(0.005)


def _valid(rng: random.Random) -> bytes:
    fields = {f"k{i}": rng.choice([rng.randint(-5, 5), "v", True])
              for i in range(rng.randint(0, 3))}
    return RemotingCommand(code=ECHO, opaque=rng.randint(0, 2**31 - 1), ext_fields=fields,
                           body=rng.randbytes(rng.randint(0, 64))).encode()


def _with_header(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


def fuzz_payload(rng: random.Random, max_frame: int) -> bytes:
    """One hostile byte string: random, truncated, corrupted, oversize (for a peer taking
    frames up to ``max_frame`` bytes) or ill-typed."""
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randint(1, 300))
    if kind == 1:
        frame = _valid(rng)
        return frame[: rng.randint(1, len(frame) - 1)]
    if kind == 2:
        corrupt = bytearray(_valid(rng))
        for _ in range(rng.randint(1, 6)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        return bytes(corrupt)
    if kind == 3:
        oversize = b'{"code":10,"opaque":%d}' % rng.randint(0, 1000)
        return struct.pack(">ii", max_frame + rng.randint(0, 2**30), len(oversize)) + oversize
    if kind == 4:
        value: object = rng.choice([[], {}, None, 1.5, "x", True, [1, {"a": 2}]])
        key = rng.choice(["code", "opaque", "flag", "extFields", "remark", "language"])
        return _with_header(json.dumps({"code": 10, "opaque": 1, key: value}).encode())
    if kind == 5:
        return _with_header(b"{}", kind=rng.randint(2, 255))
    if kind == 6:
        return struct.pack(">ii", rng.randint(-(2**31), 3), rng.randint(-(2**31), 2**31 - 1))
    return _valid(rng) + rng.randbytes(rng.randint(1, 100))  # a good frame, then noise


async def hostile_peer(port: int, payload: bytes) -> list[RemotingCommand]:
    """Send ``payload``, half-close, and read until the server closes; returns its answers."""
    reader, writer = await asyncio.open_connection(HOST, port)
    decoder = FrameDecoder()
    answers = []
    try:
        writer.write(payload)
        writer.write_eof()
        while data := await asyncio.wait_for(reader.read(65536), TIMEOUT):
            decoder.feed(data)
            while (cmd := decoder.next_command()) is not None:
                answers.append(cmd)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert decoder.buffered == 0, "the server only ever writes whole frames"
    return answers
