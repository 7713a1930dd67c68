"""The compiled read path (evq/net/read_path.pyx) against its pure-Python reference.

Two connections, one on each read path and otherwise the same class, get the same bytes cut
the same way, between the same events (handlers released, the writer paused and resumed, a
stop): they must write the same bytes, call the same handlers, pause and resume reading at
the same moments, hold the same requests, refuse the same frames and log the same events.
Handlers of every kind take part: answering at once with a command or a frame's bytes or
nothing, refusing, failing, answering an unencodable command, answering later with or
without suspending, under eager and lazy dispatchers; so do oneway requests, responses to
this side's pending requests, and malformed frames.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from collections.abc import Awaitable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.record import PURE_PYTHON_VARIABLE
from evq.net.protocol import (
    EVQ_LANGUAGE,
    EVQ_VERSION,
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    RemotingCommand,
    SerializeType,
)
from evq.net.read_budget import ReadBudget
from evq.net.transport import (
    COMPILED_READ_PATH,
    REQUEST_TASK_NAME,
    Connection,
    Dispatcher,
    ReadPath,
    Reply,
    TransportConfig,
)
from tests.processes import REPO_ROOT, python_env

pytestmark = pytest.mark.skipif(
    COMPILED_READ_PATH is None, reason="the compiled read path is not built (or not wanted)")

# The reference's methods ahead of the compiled ones: everything else is the same class.
PureConnection = (Connection if COMPILED_READ_PATH is None
                  else type("PureConnection", (ReadPath, Connection), {}))

NOW, FRAME, NOTHING, REFUSE, CRASH, LATER, AT_ONCE_LATER, UNENCODABLE = range(1, 9)
UNKNOWN = 99
REQUEST_CODES = (NOW, FRAME, NOTHING, REFUSE, CRASH, LATER, AT_ONCE_LATER, UNENCODABLE,
                 UNKNOWN)
ASK = 50  # the code of this side's own requests, answered by responses in the stream
PENDING = 3  # this side's requests waiting, opaques 1..3


class Recorder(asyncio.Transport):
    """A transport that records what the connection does to it."""

    def __init__(self, trace: list[object]) -> None:
        super().__init__()
        self.trace = trace
        self.closing = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4000)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.trace.append(("write", bytes(data)))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.trace.append("close")
        self.closing = True

    def pause_reading(self) -> None:
        self.trace.append("pause reading")

    def resume_reading(self) -> None:
        self.trace.append("resume reading")

    def get_write_buffer_size(self) -> int:
        return 0


def handlers(trace: list[object], gate: asyncio.Event) -> dict[int, Any]:
    def called(cmd: RemotingCommand) -> None:  # and whether in a task of its own
        task = asyncio.current_task()
        trace.append(("handler", cmd.code, cmd.opaque, len(cmd.body),
                      task is not None and task.get_name() == REQUEST_TASK_NAME))

    def now(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        return cmd.response(fields={"n": str(len(cmd.body))})

    def frame(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        return cmd.response(remark="as bytes").encode()

    def nothing(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        return None

    def refuse(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, "no such topic")

    def crash(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        raise RuntimeError("boom")

    async def later(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        await gate.wait()
        trace.append(("released", cmd.opaque))
        return cmd.response(remark="later")

    async def at_once_later(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)
        return cmd.response(remark="no suspension")

    def unencodable(conn: Connection, cmd: RemotingCommand) -> Reply:
        called(cmd)  # a code a binary header's int16 cannot hold
        return RemotingCommand.direct(70_000, EVQ_LANGUAGE, EVQ_VERSION, cmd.opaque,
                                      RESPONSE_FLAG, None, {}, b"", SerializeType.ROCKETMQ)

    return {NOW: now, FRAME: frame, NOTHING: nothing, REFUSE: refuse, CRASH: crash,
            LATER: later, AT_ONCE_LATER: at_once_later, UNENCODABLE: unencodable}


def state(conn: Connection) -> tuple[object, ...]:
    budget = conn._budget
    return ("state", conn.in_flight, conn.held_request_bytes, conn.reading_paused,
            conn._decoder.buffered, conn.last_active, conn.is_closed, conn._budget_paused,
            None if budget is None else (budget.used, len(budget.waiting), budget.waits))


def final_state(trace: list[object]) -> tuple[object, ...]:
    return [t for t in trace if isinstance(t, tuple) and t[:1] == ("state",)][-1]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


Step = tuple[str, Any]  # ("read" | "data", bytes) or ("release" | "pause writing"
#                          | "resume writing" | "stop" | "tick", None)


async def played(kind: type[Connection], steps: list[Step], *, eager: bool,
                 pause_on_write: bool, config: TransportConfig,
                 budget: int | None) -> list[object]:
    """Everything observable of a connection of ``kind`` through ``steps``, sharing a server's
    read budget of ``budget`` bytes if one is given."""
    trace: list[object] = []
    gate = asyncio.Event()
    clock = ManualClock()
    conn = kind(Dispatcher(handlers(trace, gate), eager=eager), config, clock,
                pause_on_write=pause_on_write,
                budget=None if budget is None else ReadBudget(budget))
    conn.connection_made(Recorder(trace))
    asks = [asyncio.create_task(conn.send_request(RemotingCommand.request(ASK), 1000.0))
            for _ in range(PENDING)]
    with capture_logs() as logs:
        await settle()
        for step, value in steps:
            clock.advance(1)
            if step == "read":
                view = conn.get_buffer(len(value))
                view[: len(value)] = value
                conn.buffer_updated(len(value))
            elif step == "data":  # what a transport without buffered reads hands over
                conn.data_received(value)
            elif step == "release":
                gate.set()
                await settle()
                gate.clear()
            elif step == "pause writing":
                conn.pause_writing()
            elif step == "resume writing":
                conn.resume_writing()
            elif step == "stop":
                conn.stop()
            trace.append(state(conn))
            await settle()
            trace.append(state(conn))
        conn.connection_lost(None)
        await settle()
    for ask in asks:
        failure = ask.exception()
        trace.append(("ask", ask.result().remark if failure is None else type(failure).__name__))
    trace.append(state(conn))
    trace.extend((e["event"], e["log_level"]) for e in logs)
    return trace


def compared(steps: list[Step], *, eager: bool = True, pause_on_write: bool = True,
             budget: int | None = None, **limits: int) -> list[object]:
    """The trace of both read paths through ``steps``, checked equal."""
    config = TransportConfig(**limits)  # type: ignore[arg-type]

    def run(kind: type[Connection]) -> list[object]:
        with asyncio.Runner() as runner:
            return runner.run(played(kind, steps, eager=eager, pause_on_write=pause_on_write,
                                     config=config, budget=budget))

    compiled, pure = run(Connection), run(PureConnection)
    assert compiled == pure
    return compiled


def request(code: int, opaque: int, body: bytes = b"", *, oneway: bool = False) -> bytes:
    return RemotingCommand(code=code, opaque=opaque, flag=ONEWAY_FLAG if oneway else 0,
                           body=body).encode()


def response(opaque: int) -> bytes:
    return RemotingCommand(code=0, opaque=opaque, flag=RESPONSE_FLAG, remark=f"to {opaque}",
                           ).encode()


def reads(stream: bytes, cuts: list[int]) -> list[Step]:
    points = sorted({min(c, len(stream)) for c in cuts} - {0, len(stream)})
    return [("read", stream[a:b])
            for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


def test_the_compiled_read_path_is_the_connections_where_it_is_built() -> None:
    assert issubclass(Connection, COMPILED_READ_PATH)  # type: ignore[arg-type]
    assert PureConnection.buffer_updated is ReadPath.buffer_updated
    assert PureConnection.get_buffer is ReadPath.get_buffer


def test_the_variable_selects_the_pure_read_path() -> None:
    program = ("from evq.net import transport; assert transport.COMPILED_READ_PATH is None; "
               "assert transport.Connection.buffer_updated is transport.ReadPath.buffer_updated")
    env = {**python_env(), PURE_PYTHON_VARIABLE: "1"}
    subprocess.run([sys.executable, "-c", program], check=True, cwd=REPO_ROOT, env=env)


# --- bounds ----------------------------------------------------------------------------------


def test_a_frame_split_across_reads_at_every_byte() -> None:
    stream = request(NOW, 7, b"x" * 20) + response(2) + request(LATER, 8, b"yy")
    whole = compared([("read", stream), ("release", None)])
    for cut in range(1, len(stream)):
        trace = compared([*reads(stream, [cut]), ("release", None)])
        assert [e for e in trace if e[0] != "state"] == [e for e in whole if e[0] != "state"]


def test_a_frame_in_single_bytes() -> None:
    stream = request(FRAME, 1, b"body") + request(NOW, 2)
    compared(reads(stream, list(range(len(stream)))))


def test_several_frames_in_one_read() -> None:
    stream = b"".join(request(code, opaque, bytes(opaque))
                      for opaque, code in enumerate(REQUEST_CODES * 3, start=10))
    for eager in (True, False):
        trace = compared([("read", stream + response(1) + response(3)), ("release", None)],
                         eager=eager)
        assert sum(1 for e in trace if e[0] == "handler") == 3 * (len(REQUEST_CODES) - 1)


def test_a_frame_at_the_size_limit_is_taken_and_one_byte_more_refused() -> None:
    frame = request(NOW, 5, bytes(1000))
    trace = compared([("read", frame)], max_frame=len(frame))
    assert ("handler", NOW, 5, 1000, False) in trace and "close" not in trace
    trace = compared([("read", frame)], max_frame=len(frame) - 1)
    assert not any(e[0] == "handler" for e in trace) and "close" in trace


def test_the_in_flight_limit_reached_and_released() -> None:
    stream = b"".join(request(LATER, opaque) for opaque in range(1, 6)) + request(NOW, 6)
    for eager in (True, False):
        trace = compared([*reads(stream, [7, 40]), ("release", None), ("release", None),
                          ("release", None)], max_in_flight=2, eager=eager)
        assert trace.count("pause reading") >= 1 and trace.count("resume reading") >= 1
        assert ("handler", NOW, 6, 0, not eager) in trace


def test_the_held_bytes_limit_reached_and_released() -> None:
    stream = b"".join(request(LATER, opaque, bytes(100)) for opaque in range(1, 5))
    trace = compared([("read", stream), ("release", None), ("release", None)],
                     max_request_bytes=250)
    assert trace.count("pause reading") == trace.count("resume reading") >= 1


def test_a_frame_begun_past_the_read_budget_waits_for_room() -> None:
    """A held request and a frame's first bytes take the budget past its bound: reading
    waits, and resumes once the handler gives its bytes back."""
    held, big = request(LATER, 1, bytes(150)), request(NOW, 2, bytes(100))
    limit = len(held) + 10
    for eager in (True, False):
        trace = compared([("read", held + big[:50]), ("release", None), ("read", big[50:]),
                          ("release", None)], budget=limit, eager=eager)
        pause, resume = trace.index("pause reading"), trace.index("resume reading")
        assert pause < resume < trace.index(("handler", NOW, 2, 100, not eager))
        assert final_state(trace)[-1] == (0, 0, 1)  # all given back; it waited once


def test_whole_frames_are_read_past_the_budget() -> None:
    """A connection whose reads end on a frame's end never waits: it holds nothing."""
    stream = b"".join(request(LATER, opaque, bytes(100)) for opaque in range(1, 4))
    trace = compared([("read", stream), ("read", request(NOW, 9)), ("release", None)],
                     budget=10)
    assert "pause reading" not in trace and ("handler", NOW, 9, 0, False) in trace


def test_writing_paused_holds_requests_only_where_the_connection_pauses_on_write() -> None:
    stream = request(NOW, 1) + request(LATER, 2)
    steps: list[Step] = [("pause writing", None), ("read", stream), ("resume writing", None),
                         ("release", None)]
    for pause_on_write in (True, False):
        for eager in (True, False):
            compared(steps, pause_on_write=pause_on_write, eager=eager)


def test_malformed_frames_are_refused_as_the_reference_does() -> None:
    header = b'{"code":1,"opaque":77,"extFields":[1]}'
    broken = struct.pack(">ii", 4 + len(header), len(header)) + header
    for garbage in (broken, b"\xff\xff\xff\xff", b"\x00\x00\x00\x02xx",
                    struct.pack(">ii", 8, 100) + bytes(4)):
        trace = compared([("read", request(NOW, 1) + garbage + request(NOW, 2)),
                          ("read", request(NOW, 3))])
        assert "close" in trace and ("handler", NOW, 2, 0, False) not in trace


def test_a_drained_buffer_is_kept_up_to_its_bound_and_given_back_past_it() -> None:
    """The compiled path leaves a drained decoder buffer of at most KEEP_DRAINED_BYTES for the
    next read to write over (no realloc each way a request), and clears a larger one."""
    from evq.net.read_path import KEEP_DRAINED_BYTES

    def sized(total: int, opaque: int) -> bytes:
        frame = request(NOTHING, opaque, bytes(total - len(request(NOTHING, opaque))))
        assert len(frame) == total
        return frame

    async def scenario(total: int, feed: str) -> list[tuple[int, int, int]]:
        seen: list[object] = []
        conn = Connection(Dispatcher(handlers(seen, asyncio.Event()), eager=True),
                          TransportConfig(), ManualClock(), pause_on_write=True)
        conn.connection_made(Recorder(seen))
        states = []
        for frame in (sized(total, 1), request(NOW, 2, b"after"), request(NOW, 3)):
            for at in range(0, len(frame), 40_000):  # cut, as a socket's reads would
                chunk = frame[at : at + 40_000]
                if feed == "read":
                    conn.get_buffer(len(chunk))[: len(chunk)] = chunk
                    conn.buffer_updated(len(chunk))
                else:
                    conn.data_received(chunk)
            states.append((conn._decoder.buffered, len(conn._decoder._buf),
                           sum(1 for e in seen if isinstance(e, tuple) and e[0] == "handler")))
        return states

    for feed in ("read", "data"):
        with asyncio.Runner() as runner:
            at_bound = runner.run(scenario(KEEP_DRAINED_BYTES, feed))
            past = runner.run(scenario(KEEP_DRAINED_BYTES + 1, feed))
        small = len(request(NOW, 2, b"after"))
        assert at_bound == [(0, KEEP_DRAINED_BYTES, 1), (0, small, 2), (0, len(request(NOW, 3)), 3)]
        assert past == [(0, 0, 1), (0, small, 2), (0, len(request(NOW, 3)), 3)]


# --- the whole input space -------------------------------------------------------------------

_requests = st.builds(request, st.sampled_from(REQUEST_CODES), st.integers(1, 2**31 - 1),
                      st.binary(max_size=40), oneway=st.booleans())
_frames = _requests | _requests | st.builds(response, st.integers(1, PENDING + 1))
_events = st.sampled_from(["release", "pause writing", "resume writing", "stop", "tick"])


@st.composite
def scenarios(draw: st.DrawFn) -> list[Step]:
    frames = draw(st.lists(_frames, max_size=16))
    if draw(st.booleans()):
        frames.append(draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x05{}{}x"])))
    stream = b"".join(frames)
    cuts = draw(st.lists(st.integers(0, max(len(stream), 1)), max_size=4))
    steps = [(draw(st.sampled_from(["read", "data"])), chunk) for _, chunk in reads(stream, cuts)]
    for _ in range(draw(st.integers(0, 4))):
        steps.insert(draw(st.integers(0, len(steps))), (draw(_events), None))
    return [*steps, ("release", None), ("release", None)]


@settings(max_examples=150, deadline=None)
@given(steps=scenarios(), eager=st.booleans(), pause_on_write=st.booleans(),
       max_in_flight=st.integers(1, 4), max_request_bytes=st.integers(1, 2000),
       budget=st.none() | st.integers(1, 400))
def test_both_read_paths_do_the_same_whatever_comes(
        steps: list[Step], eager: bool, pause_on_write: bool, max_in_flight: int,
        max_request_bytes: int, budget: int | None) -> None:
    trace = compared(steps, eager=eager, pause_on_write=pause_on_write,
                     max_in_flight=max_in_flight, max_request_bytes=max_request_bytes,
                     budget=budget)
    if budget is not None:
        # Once the connection is gone the budget holds only what handlers still running hold:
        # one-way requests run on past a close (their senders counted them delivered), each
        # bounded by its own work; every other byte is given back.
        final = final_state(trace)
        assert final[-1][0] == final[2]  # type: ignore[index]


def test_a_handler_may_answer_with_an_awaitable_that_is_not_a_coroutine() -> None:
    """``Handler`` allows any awaitable: a future, say, resolved later."""
    trace: list[object] = []

    async def scenario(kind: type[Connection]) -> list[object]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply]] = []

        def deferred(conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply]:
            futures.append(loop.create_future())
            return futures[-1]

        seen: list[object] = []
        conn = kind(Dispatcher({NOW: deferred}, eager=True), TransportConfig(), ManualClock(),
                    pause_on_write=True)
        conn.connection_made(Recorder(seen))
        frame = request(NOW, 9)
        conn.get_buffer(len(frame))[: len(frame)] = frame
        conn.buffer_updated(len(frame))
        seen.append(state(conn))
        futures[0].set_result(RemotingCommand(code=0, opaque=9, flag=RESPONSE_FLAG))
        await settle()
        seen.append(state(conn))
        return seen

    for kind in (Connection, PureConnection):
        with asyncio.Runner() as runner:
            trace.append(runner.run(scenario(kind)))
    assert trace[0] == trace[1]
    assert any(e[0] == "write" for e in trace[0])
