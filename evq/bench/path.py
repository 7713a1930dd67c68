"""``evq bench path``: what one send costs the broker's event loop, counted where timing can't
tell.

On this project's machines the same code's rates move twofold between runs minutes apart (see the
README's compare section), so a change to the request path that saves a tenth cannot be seen
in a rate.  This benchmark reports what does not move with the machine: the Python calls and
bytecodes one request runs, counted with ``sys.settrace``, beside the CPU time it took in the
same run.

A 1 KiB SEND_MESSAGE_V2, framed as evq's producer frames a single send, is written into a
broker connection's read buffer and handed over as a socket read hands it
(``buffer_updated``); the answer goes to a transport that keeps what it is given.  The
transport, the send processor, the broker and the mmap store run as under ``evq serve``
(ASYNC_FLUSH); the sockets and the event loop's polling do not.  The floor is a connection
of the same transport whose handler answers the send with the same fields without storing
anything: what the transport itself costs a request.

Runs on the calling thread's event loop, the broker's threads (flusher, allocator) beside it
as in a server.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import attrs

from evq.bench.scaffold import scratch
from evq.bench.store import BenchError
from evq.client.producer import send_command
from evq.domain.clock import SYSTEM_CLOCK
from evq.domain.codes import ResponseCode
from evq.domain.ids import new_uniq_key
from evq.domain.message import Prop, new_message
from evq.domain.queues import MessageQueue
from evq.net.broker import BrokerServer
from evq.net.codes import RequestCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from evq.net.transport import Connection, Dispatcher, Reply, TransportConfig, run
from evq.settings import build

TOPIC = "bench"
WARM = 2_000
"""Requests each path answers before it is measured (the topic is created by the first)."""


@attrs.frozen(kw_only=True)
class PathBenchOptions:
    messages: int = 20_000
    """Requests each path times."""
    traced: int = 200
    """Requests each path runs under ``sys.settrace`` (slow: a Python call a bytecode)."""
    size: int = 1024
    data: Path | None = None

    def __attrs_post_init__(self) -> None:
        if self.messages < 1 or self.traced < 1 or self.size < 0:
            raise ValueError("messages and traced must be positive, size >= 0")


@attrs.frozen(kw_only=True)
class PathFigures:
    path: str
    calls: float
    """Python function calls a request."""
    bytecodes: float
    """Python bytecodes a request."""
    cpu_us: float
    """CPU time a request on the loop's thread."""


@attrs.frozen(kw_only=True)
class PathBenchResult:
    messages: int
    traced: int
    size: int
    send: PathFigures
    floor: PathFigures

    def ratios(self) -> dict[str, float]:
        """The send's figures over the floor's."""
        return {
            "calls": self.send.calls / self.floor.calls,
            "bytecodes": self.send.bytecodes / self.floor.bytecodes,
            "cpu_us": self.send.cpu_us / self.floor.cpu_us,
        }

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "ratios": self.ratios()}


class _Sink(asyncio.Transport):
    """A connected socket that takes every answer and keeps the last."""

    def __init__(self) -> None:
        super().__init__()
        self.answers = 0
        self.last = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.answers += 1
        self.last = bytes(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def send_frame(size: int) -> bytes:
    """A single send of a ``size``-byte body, framed as evq's producer frames it."""
    msg = new_message(TOPIC, bytes(size))
    msg.born_timestamp = SYSTEM_CLOCK.now_ms()
    msg.properties[Prop.UNIQ_KEY] = new_uniq_key(msg.born_timestamp)
    return bytes(send_command("BenchPathProducer", MessageQueue(TOPIC, "broker", 0), [msg],
                              batch=False).encode())


def run_path_bench(opts: PathBenchOptions) -> PathBenchResult:
    return run(_run(opts))


async def _run(opts: PathBenchOptions) -> PathBenchResult:
    frame = send_frame(opts.size)
    with scratch(opts.data) as data:
        server = BrokerServer(build({"listen_port": 0, "store_path_root_dir": str(data),
                                     "backend": "mmap", "flush": "ASYNC_FLUSH"}))
        await server.start()
        try:
            # A connection as the server makes one for an accepted socket.
            config = server.server.config
            conn = Connection(server.server.dispatcher, config, SYSTEM_CLOCK,
                              pause_on_write=True, max_header=config.max_header)
            send = await _measure("send", conn, frame, opts)
        finally:
            await server.shutdown(grace=1.0)
    floor_conn = Connection(Dispatcher({RequestCode.SEND_MESSAGE_V2: _constant}, eager=True),
                            TransportConfig(), SYSTEM_CLOCK, pause_on_write=True)
    floor = await _measure("floor", floor_conn, frame, opts)
    return PathBenchResult(messages=opts.messages, traced=opts.traced, size=opts.size,
                           send=send, floor=floor)


def _constant(conn: Connection, cmd: RemotingCommand) -> Reply:
    """The send's answer, its fields as a stored send's, nothing stored."""
    return cmd.response(ResponseCode.SUCCESS, None, {
        "msgId": "7F00000100002A9F0000000000000000", "queueId": "0", "queueOffset": "0",
        "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})


async def _measure(name: str, conn: Connection, frame: bytes,
                   opts: PathBenchOptions) -> PathFigures:
    sink = _Sink()
    conn.connection_made(sink)
    n = len(frame)

    def request() -> None:
        conn.get_buffer(n)[:n] = frame
        conn.buffer_updated(n)

    try:
        for _ in range(WARM):
            request()
            if sink.answers < 1:  # the first send creates the topic, off the loop
                await _answered(sink, 1)
        await _answered(sink, WARM)
        calls, bytecodes = _traced(request, opts.traced)
        started = time.thread_time()
        for _ in range(opts.messages):
            request()
        cpu = time.thread_time() - started
        await _answered(sink, WARM + opts.traced + opts.messages)
        _check_answer(name, sink.last)
    finally:
        conn.connection_lost(None)
    return PathFigures(path=name, calls=calls / opts.traced, bytecodes=bytecodes / opts.traced,
                       cpu_us=cpu / opts.messages * 1e6)


async def _answered(sink: _Sink, count: int) -> None:
    """Until ``count`` answers are out; a request that suspended finishes on the loop."""
    deadline = time.monotonic() + 30.0
    while sink.answers < count:
        if time.monotonic() > deadline:
            raise BenchError(f"waited 30 s for answer {count}, {sink.answers} came")
        await asyncio.sleep(0.001)


def _check_answer(name: str, frame: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame)
    answer = decoder.next_command()
    if answer is None or answer.code != ResponseCode.SUCCESS:
        raise BenchError(f"the {name} path answered {answer}")


def _traced(request: Callable[[], None], count: int) -> tuple[int, int]:
    """Python calls and bytecodes of ``count`` requests."""
    counts = [0, 0]

    def tracer(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        if event == "opcode":
            counts[1] += 1
        elif event == "call":
            counts[0] += 1
            frame.f_trace_opcodes = True
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(count):
            request()
    finally:
        sys.settrace(None)
    return counts[0], counts[1]


def format_report(r: PathBenchResult) -> str:
    ratios = r.ratios()
    lines = [
        f"evq bench path: one SEND_MESSAGE_V2 of {r.size} bytes through a broker connection in "
        f"one process (mmap, ASYNC_FLUSH), no sockets; {r.traced:,} traced, "
        f"{r.messages:,} timed",
        f"{'figure':28s} {'send':>10s} {'floor':>10s} {'send/floor':>10s}",
        f"{'Python calls a request':28s} {r.send.calls:10.1f} {r.floor.calls:10.1f} "
        f"{ratios['calls']:10.2f}",
        f"{'Python bytecodes a request':28s} {r.send.bytecodes:10.1f} {r.floor.bytecodes:10.1f} "
        f"{ratios['bytecodes']:10.2f}",
        f"{'CPU us a request':28s} {r.send.cpu_us:10.2f} {r.floor.cpu_us:10.2f} "
        f"{ratios['cpu_us']:10.2f}",
        "floor: the same transport answering with a constant; calls and bytecodes do not move "
        "with the machine's speed, CPU is this run's",
    ]
    return "\n".join(lines)
