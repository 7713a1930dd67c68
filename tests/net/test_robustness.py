"""A live server under hostile and numerous peers: fuzzed frames, 1,000 connections, hang-ups.

The server must never die, must keep serving well-behaved connections throughout, must answer
or close a broken connection (never anything else), and must not leak handler tasks when peers
disappear mid-frame or mid-long-poll.
"""

from __future__ import annotations

import asyncio
import random

from evq.domain.codes import ResponseCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from evq.net.transport import Connection
from tests.net.harness import (
    ECHO,
    HOST,
    SLOW,
    TIMEOUT,
    client_of,
    echo,
    eventually,
    fuzz_payload,
    handler_tasks,
    hostile_peer,
    serving,
)

FUZZ_FRAMES = 2000
CONNECTIONS = 1000
MAX_FRAME = 64 * 1024


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
            count = min(50, FUZZ_FRAMES - start)
            batch = [fuzz_payload(rng, MAX_FRAME) for _ in range(count)]
            for answers in await asyncio.gather(*(hostile_peer(server.port, p) for p in batch)):
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
            assert len(handler_tasks()) == len(polling)
            for i in (*polling, *cut):
                peers[i][1].transport.abort()
            remaining = CONNECTIONS - len(polling) - len(cut)
            await eventually(lambda: len(server.connections) == remaining)
            await eventually(lambda: not handler_tasks())  # cancelled, not left parked

            survivor = next(i for i in range(CONNECTIONS) if i % 3 == 2)
            assert await ask(survivor) == survivor
        finally:
            for _, writer in peers:
                writer.transport.abort()
        await eventually(lambda: not server.connections)
