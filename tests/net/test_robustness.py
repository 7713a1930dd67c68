"""A live server under hostile and numerous peers: fuzzed frames, 1,000 connections, hang-ups.

The server must never die, must keep serving well-behaved connections throughout, must answer
or close a broken connection (never anything else), and must not leak handler tasks when peers
disappear mid-frame or mid-long-poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct

from evq.domain.codes import ResponseCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from evq.net.transport import Connection, RemotingServer
from tests.net.harness import ECHO, HOST, SLOW, TIMEOUT, client_of, echo, eventually, serving

FUZZ_FRAMES = 2000
CONNECTIONS = 1000
MAX_FRAME = 64 * 1024


def _valid(rng: random.Random) -> bytes:
    fields = {f"k{i}": rng.choice([rng.randint(-5, 5), "v", True])
              for i in range(rng.randint(0, 3))}
    return RemotingCommand(code=ECHO, opaque=rng.randint(0, 2**31 - 1), ext_fields=fields,
                           body=rng.randbytes(rng.randint(0, 64))).encode()


def _with_header(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


def fuzz_payload(rng: random.Random) -> bytes:
    """One hostile byte string: random, truncated, corrupted, oversize or ill-typed."""
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
        return struct.pack(">ii", MAX_FRAME + rng.randint(0, 2**30), len(oversize)) + oversize
    if kind == 4:
        value: object = rng.choice([[], {}, None, 1.5, "x", True, [1, {"a": 2}]])
        key = rng.choice(["code", "opaque", "flag", "extFields", "remark", "language"])
        return _with_header(json.dumps({"code": 10, "opaque": 1, key: value}).encode())
    if kind == 5:
        return _with_header(b"{}", kind=rng.randint(2, 255))
    if kind == 6:
        return struct.pack(">ii", rng.randint(-(2**31), 3), rng.randint(-(2**31), 2**31 - 1))
    return _valid(rng) + rng.randbytes(rng.randint(1, 100))  # a good frame, then noise


async def hostile_peer(server: RemotingServer, payload: bytes) -> list[RemotingCommand]:
    """Send ``payload``, half-close, and read until the server closes; returns its answers."""
    reader, writer = await asyncio.open_connection(HOST, server.port)
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


async def test_fuzzed_frames_never_stop_the_server_serving_others() -> None:
    rng = random.Random(5)
    async with serving({ECHO: echo}, max_frame=MAX_FRAME) as server, \
            client_of(server) as bystander:
        stop = asyncio.Event()
        served = 0

        async def keep_asking() -> None:
            nonlocal served
            while not stop.is_set():
                request = RemotingCommand.request(ECHO, {"n": served}, b"payload")
                answer = await bystander.invoke(request, TIMEOUT)
                assert (answer.code, answer.ext_fields, answer.body) == (
                    ResponseCode.SUCCESS, {"n": str(served)}, b"payload")
                served += 1

        asker = asyncio.create_task(keep_asking())
        answered = refused = 0
        for start in range(0, FUZZ_FRAMES, 50):
            batch = [fuzz_payload(rng) for _ in range(start, min(start + 50, FUZZ_FRAMES))]
            for answers in await asyncio.gather(*(hostile_peer(server, p) for p in batch)):
                for answer in answers:
                    assert answer.is_response
                    assert answer.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR)
                    refused += answer.code == ResponseCode.SYSTEM_ERROR
                    answered += answer.code == ResponseCode.SUCCESS
        stop.set()
        await asyncio.wait_for(asker, TIMEOUT)
        assert served > 0
        assert answered > 0 and refused > 0  # the corpus reached both kinds of outcome
        (conn,) = server.connections  # every hostile connection is gone, the bystander stays
        assert conn.in_flight == 0


def _handler_tasks() -> list[asyncio.Task[object]]:
    return [
        t for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "Connection._handle"
    ]


async def test_a_thousand_connections_and_peers_vanishing_mid_frame_and_mid_poll() -> None:
    parked = 0

    async def long_poll(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal parked
        parked += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with serving({ECHO: echo, SLOW: long_poll}) as server:
        peers = await asyncio.gather(
            *(asyncio.open_connection(HOST, server.port) for _ in range(CONNECTIONS))
        )
        try:
            async def ask(i: int) -> int:
                reader, writer = peers[i]
                writer.write(RemotingCommand(code=ECHO, opaque=i).encode())
                decoder = FrameDecoder()
                while (cmd := decoder.next_command()) is None:
                    decoder.feed(await asyncio.wait_for(reader.read(4096), TIMEOUT))
                return cmd.opaque

            assert await asyncio.gather(*(ask(i) for i in range(CONNECTIONS))) == list(
                range(CONNECTIONS))
            assert len(server.connections) == CONNECTIONS

            # A third park a long poll, a third are cut mid-frame; then both kinds vanish.
            polling, cut = range(0, CONNECTIONS, 3), range(1, CONNECTIONS, 3)
            for i in polling:
                peers[i][1].write(RemotingCommand(code=SLOW, opaque=i).encode())
            for i in cut:
                frame = RemotingCommand(code=ECHO, opaque=i, body=bytes(500)).encode()
                peers[i][1].write(frame[:40])
            await eventually(lambda: parked == len(polling))
            assert len(_handler_tasks()) == len(polling)
            for i in (*polling, *cut):
                peers[i][1].transport.abort()
            remaining = CONNECTIONS - len(polling) - len(cut)
            await eventually(lambda: len(server.connections) == remaining)
            await eventually(lambda: not _handler_tasks())  # cancelled, not left parked

            survivor = next(i for i in range(CONNECTIONS) if i % 3 == 2)
            assert await ask(survivor) == survivor
        finally:
            for _, writer in peers:
                writer.transport.abort()
        await eventually(lambda: not server.connections)
