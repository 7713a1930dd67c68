"""The asyncio transport over real sockets on 127.0.0.1 (port 0: a free port each time)."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.net.codes import RequestCode
from evq.net.headers.offsets import GetMaxOffsetRequest
from evq.net.protocol import BINARY_FIXED, MAX_HEADER, RemotingCommand, SerializeType
from evq.net.transport import (
    READ_BUFFER,
    REQUEST_TASK_NAME,
    Answer,
    ConnectError,
    Connection,
    ConnectionClosed,
    Dispatcher,
    RemotingClient,
    RemotingServer,
    Reply,
    RequestTimeout,
    TransportConfig,
)
from tests.net.harness import (
    ECHO,
    FAST,
    HOST,
    SLOW,
    TIMEOUT,
    RawPeer,
    client_of,
    echo,
    eventually,
    raw_frame,
    serving,
)

# --- request/response ------------------------------------------------------------------------


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_request_and_response_round_trip(eager: bool) -> None:
    async with serving({ECHO: echo}, eager=eager) as server, client_of(server) as client:
        request = RemotingCommand.request(ECHO, {"topic": "T", "queueId": 3}, b"body")
        response = await client.invoke(request, TIMEOUT)
        assert response.is_response
        assert response.opaque == request.opaque
        assert response.code == ResponseCode.SUCCESS
        assert response.ext_fields == {"topic": "T", "queueId": "3"}
        assert response.body == b"body"
        (conn,) = server.connections
        assert conn.local == server.address
        assert conn.peer == (await client.connection()).local
        second = await client.invoke(RemotingCommand.request(ECHO), TIMEOUT)
        assert second.opaque == request.opaque + 1


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_slow_handlers_do_not_hold_up_fast_ones_on_the_same_connection(eager: bool) -> None:
    release = asyncio.Event()
    parked = 0

    async def long_poll(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal parked
        parked += 1
        await release.wait()
        return cmd.response(fields={"n": cmd.ext_fields["n"]})

    async def heartbeat(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response()

    handlers = {SLOW: long_poll, FAST: heartbeat}
    async with serving(handlers, eager=eager) as server, client_of(server) as client:
        polls = [
            asyncio.create_task(client.invoke(RemotingCommand.request(SLOW, {"n": i}), TIMEOUT))
            for i in range(100)
        ]
        await eventually(lambda: parked == 100)
        beat = await client.invoke(RemotingCommand.request(FAST), TIMEOUT)
        assert beat.code == ResponseCode.SUCCESS
        assert not any(p.done() for p in polls)
        (conn,) = server.connections
        # The heartbeat's caller may run on before the handler's task is done with (its
        # answer wakes the caller as it is read): the parked ones stay.
        await eventually(lambda: conn.in_flight == 100)
        release.set()
        answers = await asyncio.gather(*polls)
        assert [a.ext_fields["n"] for a in answers] == [str(i) for i in range(100)]


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_answers_go_out_in_completion_order_matched_by_opaque(eager: bool) -> None:
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def gated(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await gates[cmd.ext_fields["gate"]].wait()
        return cmd.response(fields={"gate": cmd.ext_fields["gate"]})

    async with serving({SLOW: gated}, eager=eager) as server, RawPeer.connect(server) as peer:
        first = RemotingCommand(code=SLOW, opaque=1, ext_fields={"gate": "a"})
        second = RemotingCommand(code=SLOW, opaque=2, ext_fields={"gate": "b"})
        await peer.send(first.encode() + second.encode())
        gates["b"].set()
        answer = await peer.receive()
        assert answer is not None
        assert (answer.opaque, answer.ext_fields["gate"]) == (2, "b")
        gates["a"].set()
        answer = await peer.receive()
        assert answer is not None
        assert (answer.opaque, answer.ext_fields["gate"]) == (1, "a")


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_oneway_requests_run_and_get_no_answer(eager: bool) -> None:
    seen: list[int] = []

    async def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(cmd.opaque)
        return cmd.response()

    async with serving({ECHO: record}, eager=eager) as server, RawPeer.connect(server) as peer:
        oneway = RemotingCommand(code=ECHO, opaque=1, flag=2)
        normal = RemotingCommand(code=ECHO, opaque=2)
        await peer.send(oneway.encode())
        await eventually(lambda: seen == [1])
        await peer.send(normal.encode())
        answer = await peer.receive()
        assert answer is not None
        assert answer.opaque == 2
        assert seen == [1, 2]


async def test_client_oneway_reaches_the_handler() -> None:
    got = asyncio.Event()

    async def record(conn: Connection, cmd: RemotingCommand) -> None:
        assert cmd.is_oneway
        got.set()

    async with serving({RequestCode.UPDATE_CONSUMER_OFFSET: record}) as server, \
            client_of(server) as client:
        await client.invoke_oneway(RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET))
        await asyncio.wait_for(got.wait(), TIMEOUT)


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_a_oneway_request_finishes_after_its_sender_hangs_up(eager: bool) -> None:
    started, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow(conn: Connection, cmd: RemotingCommand) -> None:
        started.set()
        await release.wait()  # still running when the connection goes
        finished.set()

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.Event().wait()  # a two-way request nobody will read: cancelled
        return cmd.response()

    async with serving({ECHO: slow, SLOW: parked}, eager=eager) as server:
        async with RawPeer.connect(server) as peer:
            await peer.send(RemotingCommand(code=ECHO, opaque=1, flag=2).encode())
            await peer.send(RemotingCommand(code=SLOW, opaque=2).encode())
            await asyncio.wait_for(started.wait(), TIMEOUT)
        await eventually(lambda: not server.connections)
        release.set()
        await asyncio.wait_for(finished.wait(), TIMEOUT)


async def test_an_eager_handler_that_never_suspends_is_answered_without_a_task() -> None:
    tasks: list[asyncio.Task[object] | None] = []

    async def inline(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        tasks.append(asyncio.current_task())
        if cmd.ext_fields.get("yield"):
            await asyncio.sleep(0)
        tasks.append(asyncio.current_task())
        return cmd.response(fields={"n": cmd.ext_fields["n"]})

    async with serving({ECHO: inline}, eager=True) as server, client_of(server) as client:
        answer = await client.invoke(RemotingCommand.request(ECHO, {"n": "1"}), TIMEOUT)
        assert (answer.code, answer.ext_fields["n"]) == (ResponseCode.SUCCESS, "1")
        assert tasks == [None, None]  # ran in the read callback from start to answer
        tasks.clear()
        answer = await client.invoke(
            RemotingCommand.request(ECHO, {"n": "2", "yield": "1"}), TIMEOUT)
        assert answer.ext_fields["n"] == "2"
        first, rest = tasks
        assert first is None and rest is not None  # suspended once: the rest ran in a task
        assert rest.get_name() == REQUEST_TASK_NAME


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_shutdown_cancels_handlers_that_outlive_the_grace(eager: bool) -> None:
    cancelled = asyncio.Event()

    async def forever(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    server = RemotingServer(HOST, 0, Dispatcher({SLOW: forever}, eager=eager))
    await server.start()
    async with client_of(server) as client:
        poll = asyncio.create_task(client.invoke(RemotingCommand.request(SLOW), TIMEOUT))
        await eventually(lambda: any(c.in_flight for c in server.connections))
        with capture_logs() as logs:
            await server.shutdown(grace=0.05)
        assert "cancelling handlers still running after grace" in [e["event"] for e in logs]
        assert cancelled.is_set()  # the cancellation reached the handler's own await
        with pytest.raises(ConnectionClosed):
            await poll


def test_connections_in_several_threads_read_their_own_bytes() -> None:
    """Reads land in a buffer shared by the connections of one thread (evq.net.transport.
    _read_buffer): event loops in other threads, serving and asking at the same time, must
    each get exactly the bytes their peers sent."""
    errors: list[BaseException] = []

    async def hammer(tag: int) -> None:
        async with serving({ECHO: echo}) as server, client_of(server) as client:
            for i in range(300):
                body = bytes([tag]) * (1 + (i * 7919) % 200_000)  # from one byte to ~200 KB
                answer = await client.invoke(
                    RemotingCommand.request(ECHO, {"i": str(i)}, body), TIMEOUT)
                assert (answer.ext_fields["i"], answer.body) == (str(i), body)

    def run(tag: int) -> None:
        try:
            asyncio.run(hammer(tag))
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a reading thread did not finish in 120 s"
    assert not errors, errors


# --- errors answered ---------------------------------------------------------------------------


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_a_plain_function_handler_answers_at_once_or_later_or_refuses(eager: bool) -> None:
    ran_in: list[asyncio.Task[object] | None] = []

    async def later(cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        return cmd.response(fields={"how": "later"})

    def plain(conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply] | Reply:
        ran_in.append(asyncio.current_task())
        how = cmd.ext_fields["how"]
        if how == "refuse":
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist")
        if how == "crash":
            raise RuntimeError("boom")
        return cmd.response(fields={"how": "now"}) if how == "now" else later(cmd)

    async with serving({ECHO: plain}, eager=eager) as server, client_of(server) as client:
        def ask(how: str) -> Awaitable[RemotingCommand]:
            return client.invoke(RemotingCommand.request(ECHO, {"how": how}), TIMEOUT)

        assert (await ask("now")).ext_fields["how"] == "now"
        assert (await ask("later")).ext_fields["how"] == "later"
        refused = await ask("refuse")
        assert (refused.code, refused.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                                  "topic[T] not exist")
        with capture_logs() as logs:
            crashed = await ask("crash")
        assert (crashed.code, crashed.remark) == (ResponseCode.SYSTEM_ERROR, "RuntimeError: boom")
        assert [e["event"] for e in logs] == ["request handler failed"]
        # An eager dispatcher calls it in the read callback; a lazy one in the request's task.
        assert all((task is None) == eager for task in ran_in), ran_in
        assert len(ran_in) == 4 and len(server.connections) == 1
        # A oneway request's answer, given at once, goes nowhere; the connection goes on.
        await client.invoke_oneway(RemotingCommand.request(ECHO, {"how": "now"}))
        assert (await ask("now")).ext_fields["how"] == "now"
        assert len(ran_in) == 6


async def test_unknown_code_is_not_supported() -> None:
    async with serving({}) as server, client_of(server) as client:
        answer = await client.invoke(RemotingCommand.request(9999), TIMEOUT)
        assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert answer.remark == " request type 9999 not supported"


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_handler_failures_are_answered_and_the_connection_survives(eager: bool) -> None:
    async def refuse(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist")

    async def crash(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("boom")

    async def needs_field(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(fields={"q": GetMaxOffsetRequest.read(cmd.ext_fields).queue_id})

    handlers = {1001: refuse, 1002: crash, 1003: needs_field, ECHO: echo}
    async with serving(handlers, eager=eager) as server, client_of(server) as client:
        refused = await client.invoke(RemotingCommand.request(1001), TIMEOUT)
        assert refused.code == ResponseCode.TOPIC_NOT_EXIST
        assert refused.remark == "topic[T] not exist"
        with capture_logs() as logs:
            crashed = await client.invoke(RemotingCommand.request(1002), TIMEOUT)
        assert (crashed.code, crashed.remark) == (ResponseCode.SYSTEM_ERROR, "RuntimeError: boom")
        assert [e["event"] for e in logs] == ["request handler failed"]
        assert logs[0]["log_level"] == "error"
        missing = await client.invoke(RemotingCommand.request(1003), TIMEOUT)
        assert missing.code == ResponseCode.SYSTEM_ERROR
        assert missing.remark == "the custom field <topic> is null"
        assert (await client.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0
        assert len(server.connections) == 1


# --- malformed input -------------------------------------------------------------------------


async def test_malformed_frame_is_answered_then_closed_while_others_are_served() -> None:
    async with serving({ECHO: echo}) as server, client_of(server) as bystander:
        async with RawPeer.connect(server) as peer:
            await peer.send(raw_frame(b'{"code":10,"opaque":77,"extFields":[1]}'))
            answer = await peer.receive()
            assert answer is not None
            assert (answer.code, answer.opaque) == (ResponseCode.SYSTEM_ERROR, 77)
            assert "extFields" in (answer.remark or "")
            assert await peer.receive() is None  # closed: framing is lost
        assert (await bystander.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_garbage_without_an_opaque_just_closes() -> None:
    async with serving({ECHO: echo}) as server, client_of(server) as bystander:
        for garbage in (b"\xff\xff\xff\xff", raw_frame(b"not json"), b"\x00\x00\x00\x02xx"):
            async with RawPeer.connect(server) as peer:
                with capture_logs() as logs:
                    await peer.send(garbage)
                    assert await peer.receive() is None
                assert logs[0]["event"] == "malformed frame, closing"
        assert (await bystander.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_oversize_frame_is_refused_without_buffering_it() -> None:
    async with serving({ECHO: echo}, max_frame=64 * 1024) as server, \
            client_of(server) as bystander:
        async with RawPeer.connect(server) as peer:
            header = b'{"code":10,"opaque":5}'
            claimed = struct.pack(">ii", 4 + len(header) + 10_000_000, len(header)) + header
            await peer.send(claimed + bytes(1000))
            answer = await peer.receive()
            assert answer is not None
            assert (answer.code, answer.opaque) == (ResponseCode.SYSTEM_ERROR, 5)
            assert "exceeds the 65536-byte limit" in (answer.remark or "")
            assert await peer.receive() is None
        assert (await bystander.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_a_header_over_the_limit_is_refused_and_one_at_it_answered() -> None:
    """A header is bounded apart from its frame (a header's fields cost far more than a
    body's bytes): past the bound the peer is told why and closed, at it the request runs."""
    async with serving({ECHO: echo}) as server, client_of(server) as bystander:
        for size, answered in ((MAX_HEADER, True), (MAX_HEADER + 1, False)):
            fixed = BINARY_FIXED.pack(ECHO, 0, 317, 21, 0)
            remark = b"r" * (size - len(fixed) - 8)
            header = fixed + struct.pack(">i", len(remark)) + remark + struct.pack(">i", 0)
            word = SerializeType.ROCKETMQ << 24 | len(header)
            whole = struct.pack(">ii", 4 + len(header) + 4, word) + header + b"body"
            async with RawPeer.connect(server) as peer:
                # Past the bound, what precedes the remark decides: no more is sent, so the
                # server closes a socket with nothing unread (a reset could drop the answer).
                await peer.send(whole if answered else whole[: 8 + BINARY_FIXED.size])
                answer = await peer.receive()
                assert answer is not None and answer.opaque == 21
                if answered:
                    assert (answer.code, answer.body) == (0, b"body")
                else:
                    assert answer.code == ResponseCode.SYSTEM_ERROR
                    assert answer.remark == (f"header of {MAX_HEADER + 1} bytes exceeds the "
                                             f"{MAX_HEADER}-byte limit")
                    assert await peer.receive() is None  # closed: framing is lost
        assert (await bystander.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


# --- limits -------------------------------------------------------------------------------


async def test_frames_begun_past_the_read_budget_wait_while_small_requests_go_on() -> None:
    """The server's connections together hold at most ``max_buffered_bytes`` (and a read):
    a connection in the middle of a frame past it stops being read, a client of whole small
    requests is served meanwhile, and once the idle sweep has closed the one that waited
    longest (not read, it goes idle), its room lets the others on."""
    limit = 1024 * 1024
    clock = ManualClock()
    async with serving({ECHO: echo}, clock, max_buffered_bytes=limit) as server, \
            client_of(server) as bystander:
        header = b'{"code":%d,"opaque":7}' % ECHO
        big = raw_frame(header, bytes(3 * limit))
        async with RawPeer.connect(server) as hog, RawPeer.connect(server) as late:
            hog.writer.write(big[: 2 * limit])  # never finished: the peer waits for room
            await eventually(lambda: len(server.budget.waiting) == 1)
            assert limit < server.budget.used <= limit + READ_BUFFER
            clock.advance(100)
            assert (await bystander.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0
            small = raw_frame(header, b"x" * 20_000)
            await late.send(small[:10_000])
            await eventually(lambda: len(server.budget.waiting) == 2)
            clock.advance(server.config.idle_timeout - 99)
            assert server.close_idle() == 1  # the hog, idle since it was made to wait
            await eventually(lambda: not server.budget.waiting)
            await late.send(small[10_000:])
            answer = await late.receive()
            assert answer is not None and (answer.opaque, answer.body) == (7, b"x" * 20_000)
        await eventually(lambda: server.budget.used == 0)
        assert server.budget.waits == 2


async def test_a_connection_past_the_limit_is_closed_on_arrival() -> None:
    """At ``max_connections`` one more connection is closed before it is read, the others are
    served all along, and a place freed is taken again; a flood is logged once, counted."""
    async with serving({ECHO: echo}, max_connections=2) as server, \
            client_of(server) as first:
        assert (await first.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0  # opened
        async with RawPeer.connect(server) as second:
            await second.send(raw_frame(b'{"code":%d,"opaque":1}' % ECHO))
            assert (await second.receive()).opaque == 1  # type: ignore[union-attr]
            with capture_logs() as logs:
                for _ in range(3):
                    async with RawPeer.connect(server) as extra:
                        assert await extra.receive() is None  # closed on arrival
            assert server.refusals.count == 3
            warnings = [e for e in logs if e["event"] == "connections refused: the server is full"]
            assert [(w["max_connections"], w["refused"]) for w in warnings] == [(2, 1)]
            assert (await first.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0
        await eventually(lambda: len(server.connections) == 1)
        async with RawPeer.connect(server) as third:  # the second's place
            await third.send(raw_frame(b'{"code":%d,"opaque":3}' % ECHO))
            assert (await third.receive()).opaque == 3  # type: ignore[union-attr]
        assert server.refusals.count == 3


async def test_a_peer_that_does_not_read_does_not_grow_the_server_buffer() -> None:
    answer_size = 64 * 1024
    high_water, in_flight = 256 * 1024, 4
    peak = 0
    handled = 0

    async def big(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal peak, handled
        handled += 1
        peak = max(peak, conn.write_buffer_size)
        return cmd.response(body=bytes(answer_size))

    requests = 1000  # 64 MiB of answers: far beyond what the kernel's socket buffers absorb
    async with serving(
        {ECHO: big}, write_high_water=high_water, write_low_water=high_water // 4,
        max_in_flight=in_flight,
    ) as server, RawPeer.connect(server) as peer:
        await peer.send(b"".join(
            RemotingCommand(code=ECHO, opaque=i).encode() for i in range(1, requests + 1)
        ))
        (conn,) = server.connections
        await eventually(lambda: conn.reading_paused and conn.write_buffer_size > high_water)
        bound = high_water + (in_flight + 1) * (answer_size + 200)
        assert conn.write_buffer_size <= bound
        assert handled < requests
        stalled_at = handled

        opaques: list[int] = []
        while len(opaques) < requests:  # reading resumes the server: every answer arrives
            answer = await peer.receive()
            assert answer is not None
            assert len(answer.body) == answer_size
            opaques.append(answer.opaque)
        assert sorted(opaques) == list(range(1, requests + 1))
        assert peak + answer_size <= bound
        assert stalled_at < handled == requests


async def test_pipelined_requests_cost_one_answer_beyond_the_mark_however_many_may_run(
) -> None:
    """Netty's writability: with 1,024 handlers allowed at once, a peer that pipelines a
    thousand requests and reads nothing still holds one answer beyond the high-water mark
    (it once held all thousand)."""
    answer_size, high_water = 64 * 1024, 256 * 1024

    async def big(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=bytes(answer_size))

    requests = 1000
    async with serving(
        {ECHO: big}, write_high_water=high_water, write_low_water=high_water // 4,
    ) as server, RawPeer.connect(server) as peer:
        await peer.send(b"".join(
            RemotingCommand(code=ECHO, opaque=i).encode() for i in range(1, requests + 1)
        ))
        (conn,) = server.connections
        await eventually(lambda: conn.reading_paused and conn.write_buffer_size > high_water)
        for _ in range(20):  # every handler that started has reached its wait by now
            await asyncio.sleep(0)
        assert conn.write_buffer_size <= high_water + answer_size + 200
        received = 0
        while received < requests:
            answer = await peer.receive()
            assert answer is not None and len(answer.body) == answer_size
            received += 1


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_requests_held_by_running_handlers_are_bounded_in_bytes(eager: bool) -> None:
    release = asyncio.Event()
    started = 0
    body, limit = 1024 * 1024, 4 * 1024 * 1024

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal started
        started += 1
        await release.wait()
        return cmd.response()

    async with serving({SLOW: parked}, max_request_bytes=limit, eager=eager) as server, \
            RawPeer.connect(server) as peer:
        sender = asyncio.create_task(peer.send(b"".join(
            RemotingCommand(code=SLOW, opaque=i, body=bytes(body)).encode()
            for i in range(1, 33))))
        await eventually(lambda: started == 4)
        (conn,) = server.connections
        await eventually(lambda: conn.reading_paused)
        assert started == 4  # the fourth took the held bytes past the limit
        assert limit < conn.held_request_bytes <= limit + body + 200
        release.set()
        answers = [await peer.receive() for _ in range(32)]
        assert sorted(a.opaque for a in answers if a) == list(range(1, 33))
        await sender
        assert conn.held_request_bytes == 0


async def test_heavy_traffic_both_ways_on_one_connection_does_not_deadlock() -> None:
    # A client process shares one connection per broker between producing big messages and
    # pulling big answers: both write buffers run high at once, and neither side may stop
    # reading for good.
    size = 1024 * 1024
    async with serving(
        {ECHO: echo}, write_high_water=64 * 1024, write_low_water=16 * 1024
    ) as server, client_of(server) as client:
        answers = await asyncio.gather(*(
            client.invoke(RemotingCommand.request(ECHO, {"i": i}, bytes([i]) * size), TIMEOUT)
            for i in range(64)
        ))
        assert [(a.ext_fields["i"], a.body[:1], len(a.body)) for a in answers] == [
            (str(i), bytes([i]), size) for i in range(64)]


@pytest.mark.parametrize(
    "limits",
    [{"write_low_water": 2, "write_high_water": 1}, {"max_in_flight": 0}, {"idle_timeout": 0},
     {"max_request_bytes": 0}],
)
def test_config_refuses_inconsistent_limits(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        TransportConfig(**limits)  # type: ignore[arg-type]


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
async def test_in_flight_cap_per_connection(eager: bool) -> None:
    release = asyncio.Event()
    started = 0

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal started
        started += 1
        await release.wait()
        return cmd.response()

    async with serving({SLOW: parked}, max_in_flight=2, eager=eager) as server, \
            RawPeer.connect(server) as peer:
        await peer.send(b"".join(RemotingCommand(code=SLOW, opaque=i).encode() for i in (1, 2, 3)))
        await eventually(lambda: started == 2)
        (conn,) = server.connections
        assert conn.reading_paused
        assert conn.in_flight == 2  # the third waits, undecoded, in the buffer
        release.set()
        answers = [await peer.receive() for _ in range(3)]
        assert sorted(a.opaque for a in answers if a) == [1, 2, 3]
        assert started == 3


async def test_idle_connections_are_closed_by_the_clock() -> None:
    clock = ManualClock()
    async with serving({ECHO: echo}, clock, idle_timeout=120.0) as server, \
            client_of(server) as idle, client_of(server) as busy:
        await idle.invoke(RemotingCommand.request(ECHO), TIMEOUT)
        clock.advance(100)
        await busy.invoke(RemotingCommand.request(ECHO), TIMEOUT)
        assert server.close_idle() == 0
        clock.advance(30)  # idle: 130 s without traffic; busy: 30 s
        assert server.close_idle() == 1
        idle_conn = await idle.connection()
        await asyncio.wait_for(idle_conn.wait_closed(), TIMEOUT)
        assert len(server.connections) == 1
        assert (await busy.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0
        # The client reconnects on demand.
        assert (await idle.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_the_idle_sweep_runs_by_itself_and_spares_running_requests() -> None:
    clock = ManualClock()
    release = asyncio.Event()

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response()

    async with serving({SLOW: parked}, clock, idle_timeout=1.0, idle_check_interval=0.01) \
            as server, client_of(server) as polling, client_of(server) as quiet:
        poll = asyncio.create_task(polling.invoke(RemotingCommand.request(SLOW), TIMEOUT))
        quiet_conn = await quiet.connection()
        await eventually(lambda: len(server.connections) == 2 and any(
            c.in_flight for c in server.connections))
        clock.advance(5)
        await asyncio.wait_for(quiet_conn.wait_closed(), TIMEOUT)
        release.set()
        assert (await poll).code == ResponseCode.SUCCESS


# --- waking the caller -----------------------------------------------------------------------


async def test_an_answer_wakes_its_caller_in_the_same_turn_of_the_loop() -> None:
    """The task awaiting a request runs on as its answer is read, not at the loop's next turn:
    on the stdlib loop a request costs one poll of the selector fewer (uvloop's selector is
    out of reach; the same code runs there)."""
    loop = asyncio.get_running_loop()
    selector = getattr(loop, "_selector", None)
    if selector is None:
        pytest.skip("polls are counted on the stdlib loop's selector")
    polls = 0
    select = selector.select

    def counting(timeout: float | None = None) -> list[object]:
        nonlocal polls
        polls += 1
        return select(timeout)

    async with serving({ECHO: echo}, eager=True) as server, client_of(server) as client:
        conn = await client.connection()
        await conn.send_request(RemotingCommand.request(ECHO), TIMEOUT)
        selector.select = counting
        try:
            for _ in range(100):
                await conn.send_request(RemotingCommand.request(ECHO), TIMEOUT)
        finally:
            del selector.select
    # One poll finds the request at the server, one the answer at the client: two a request
    # (three when the answer's waiter waited for a turn of its own).
    assert polls <= 2 * 100 + 5, polls


async def test_a_caller_cancelled_while_it_waits_is_cancelled() -> None:
    release = asyncio.Event()

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response()

    async with serving({SLOW: parked, ECHO: echo}) as server, client_of(server) as client:
        conn = await client.connection()
        waiting = asyncio.create_task(conn.send_request(RemotingCommand.request(SLOW), TIMEOUT))
        await eventually(lambda: any(c.in_flight for c in server.connections))
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()  # its late answer is dropped; the connection serves on
        assert (await conn.send_request(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_an_answer_read_while_a_task_runs_wakes_its_caller_at_the_next_turn() -> None:
    """A task cannot be entered inside another: an answer delivered from inside a task (a
    read callback never runs in one, but a future may be finished from anywhere) wakes its
    caller through the loop, as asyncio's own futures do, and other callbacks run as usual."""
    loop = asyncio.get_running_loop()
    answer = Answer(loop=loop)
    seen: list[object] = []
    answer.add_done_callback(lambda f: seen.append("first"))  # the first callback is kept
    answer.add_done_callback(lambda f: seen.append("second"))  # others go to asyncio's list

    async def wait() -> RemotingCommand:
        return await answer

    waiter = asyncio.create_task(wait())
    await asyncio.sleep(0)  # the waiter is waiting
    response = RemotingCommand(code=0, flag=1)
    answer.answer(response)  # from inside this test's task
    assert not waiter.done()
    assert await waiter is response
    assert seen == ["first", "second"]


# --- broker-initiated requests ---------------------------------------------------------------


async def test_server_to_client_request_oneway_and_timeout() -> None:
    channels: list[Connection] = []
    notified = asyncio.Event()

    async def heartbeat(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        channels.append(conn)
        return cmd.response()

    async def running_info(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=b'{"properties":{}}', fields={"g": cmd.ext_fields["g"]})

    async def ids_changed(conn: Connection, cmd: RemotingCommand) -> None:
        notified.set()

    async def never(conn: Connection, cmd: RemotingCommand) -> None:
        return None

    client_side = Dispatcher({
        RequestCode.GET_CONSUMER_RUNNING_INFO: running_info,
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: ids_changed,
        RequestCode.CHECK_TRANSACTION_STATE: never,
    })
    clock = ManualClock()
    async with serving({FAST: heartbeat}, clock) as server, \
            client_of(server, client_side) as client:
        await client.invoke(RemotingCommand.request(FAST), TIMEOUT)
        (channel,) = channels
        answer = await channel.send_request(
            RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"g": "G"}), TIMEOUT
        )
        assert (answer.code, answer.body, answer.ext_fields) == (0, b'{"properties":{}}',
                                                                 {"g": "G"})
        channel.send_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED))
        await asyncio.wait_for(notified.wait(), TIMEOUT)
        unknown = await channel.send_request(RemotingCommand.request(4242), TIMEOUT)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        timed_out = r"request code 39 opaque \d+ to .*: no response in 0.05 s"
        with pytest.raises(RequestTimeout, match=timed_out):
            await channel.send_request(
                RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE), 0.05
            )
        clock.advance(10)
        assert channel.idle_seconds() == 10  # the timed-out request is no longer pending
        assert (await client.invoke(RemotingCommand.request(FAST), TIMEOUT)).code == 0


async def test_requests_of_one_connection_time_out_each_at_its_own_deadline() -> None:
    """One expiry timer serves a connection: a short request sent while a long one is pending
    still fails after its own timeout, requests sent later are still covered, and an answer
    that comes in time wins over the sweep."""
    release = asyncio.Event()

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response()

    async def quick(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response()

    async with serving({SLOW: parked, FAST: quick}) as server, client_of(server) as client:
        conn = await client.connection()
        loop = asyncio.get_running_loop()
        long_wait = asyncio.create_task(conn.send_request(RemotingCommand.request(SLOW), 30.0))
        started = loop.time()
        with pytest.raises(RequestTimeout, match=r"request code 11 opaque \d+ to .*: "
                                                  r"no response in 0\.2 s"):
            await conn.send_request(RemotingCommand.request(SLOW), 0.2)
        # Its own deadline, not the long one's (uvloop's clock counts whole milliseconds).
        assert 0.19 <= loop.time() - started < 5.0
        assert (await conn.send_request(RemotingCommand.request(FAST), 0.3)).code == 0
        started = loop.time()
        with pytest.raises(RequestTimeout, match=r"no response in 0\.1 s"):
            await conn.send_request(RemotingCommand.request(SLOW), 0.1)
        assert 0.09 <= loop.time() - started < 5.0
        assert not long_wait.done()
        release.set()  # the long request, answered in time, is not failed by any sweep
        assert (await asyncio.wait_for(long_wait, TIMEOUT)).code == 0


async def test_closing_fails_pending_requests_and_runs_close_callbacks() -> None:
    cancelled = asyncio.Event()
    closed: list[int] = []

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        conn.add_close_callback(lambda c: closed.append(c.id))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def hang_up(conn: Connection, cmd: RemotingCommand) -> None:
        conn.close()

    async with serving({SLOW: parked, FAST: hang_up}) as server, client_of(server) as client:
        poll = asyncio.create_task(client.invoke(RemotingCommand.request(SLOW), TIMEOUT))
        await eventually(lambda: any(c.in_flight for c in server.connections))
        (conn,) = server.connections
        with pytest.raises(ConnectionClosed):
            await client.invoke(RemotingCommand.request(FAST), TIMEOUT)
        with pytest.raises(ConnectionClosed):
            await poll
        await asyncio.wait_for(cancelled.wait(), TIMEOUT)  # the parked handler is not leaked
        assert closed == [conn.id]
        assert conn.in_flight == 0
        assert server.connections == frozenset()


async def test_connect_error_is_clear() -> None:
    async with serving({}) as server:
        port = server.port
    async with RemotingClient(HOST, port) as client:
        with pytest.raises(ConnectError, match=f"cannot connect to {HOST}:{port}"):
            await client.invoke(RemotingCommand.request(ECHO), TIMEOUT)


# --- shutdown -----------------------------------------------------------------------------


async def test_graceful_shutdown_answers_in_flight_requests_and_stops_accepting() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def parked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        started.set()
        await release.wait()
        return cmd.response(fields={"done": True})

    server = RemotingServer(HOST, 0, Dispatcher({SLOW: parked}))
    await server.start()
    async with client_of(server) as client:
        poll = asyncio.create_task(client.invoke(RemotingCommand.request(SLOW), TIMEOUT))
        await asyncio.wait_for(started.wait(), TIMEOUT)
        stopping = asyncio.create_task(server.shutdown(grace=TIMEOUT))
        await eventually(lambda: all(c.reading_paused for c in server.connections))
        with pytest.raises(ConnectError):
            async with RemotingClient(HOST, server.port) as late:
                await late.connection()
        assert not stopping.done()
        release.set()
        answer = await poll
        assert answer.ext_fields == {"done": "true"}
        await stopping
        assert server.connections == frozenset()


CHILD = Path(__file__).with_name("signal_child.py")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_until_signal_answers_in_flight_then_exits(sig: signal.Signals) -> None:
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with subprocess.Popen(
        [sys.executable, str(CHILD)], stdout=subprocess.PIPE, env=env, text=True
    ) as child:
        assert child.stdout is not None
        port = int(child.stdout.readline())

        async def scenario() -> RemotingCommand:
            async with RemotingClient(HOST, port) as client:
                poll = asyncio.create_task(client.invoke(RemotingCommand.request(SLOW), TIMEOUT))
                assert child.stdout is not None
                line = await asyncio.to_thread(child.stdout.readline)
                assert line == "parked\n"
                child.send_signal(sig)
                return await poll

        answer = asyncio.run(scenario())
        assert answer.ext_fields == {"answered": "after stop"}
        assert child.wait(TIMEOUT) == 0
        assert child.stdout.read() == "stopped\n"


async def test_server_cannot_start_on_a_port_in_use() -> None:
    async with serving({}) as server:
        clash = RemotingServer(HOST, server.port, Dispatcher())
        with pytest.raises(OSError):
            await clash.start()

