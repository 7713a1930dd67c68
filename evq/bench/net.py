"""The network benchmark: what one broker process serves over the RocketMQ remoting protocol.

The broker runs in a child process (:mod:`evq.bench.broker_process`) and is driven by evq's own
:class:`~evq.net.transport.RemotingClient` over one TCP connection, on uvloop when installed.
One run, all against one topic of ``queues`` queues created up front:

* **produce**: ``messages`` SEND_MESSAGE requests, each awaited before the next is sent;
* **produce batch**: the next ``messages`` as SEND_BATCH_MESSAGE requests of ``batch``
  messages (a body made by :func:`~evq.domain.record.encode_batch`), each awaited;
* **produce pipelined**: the next ``messages`` with ``in_flight`` requests outstanding at
  any time;
* **consume**: every queue read from offset 0 to its end with PULL_MESSAGE, ``PULL_BATCH``
  per pull, one pull in flight per queue (as a push consumer runs them), committing the
  consumed offset with each pull; the messages counted in the answers must add up to the
  ``3 x messages`` produced;
* **latency**: sends started at a fixed ``rate`` for ``latency_seconds``, each timed from
  the moment it was sent to its answer (p50, p99, max), while a second connection keeps
  making metadata (a pull by a new consumer group, each one recorded and flushed) and pulls
  the topic: the mixed load;
* **loop stall**: the longest the broker's event loop went without running over the whole
  run, as the broker measures it (``evqLoopStallMaxMs`` in its runtime info): what any client
  of the broker waited on top of its own request.

Messages are the store benchmark's (:class:`~evq.bench.store.Workload` with one topic): tags,
a KEYS word and a UNIQ_KEY, as stock producers send them, so the broker indexes what it would
index in production.  Requests are built while the phase runs, as a producer builds them.
Before each phase the benchmark waits for the broker to go idle (store warming after start-up,
the flusher trailing the previous phase); each phase reports, next to its rate, the CPU time
per message the broker process and this client process spent, which says which side bound it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from tqdm import tqdm

from evq import logs
from evq.backends import registry
from evq.bench.broker_process import BrokerProcess, broker_process
from evq.bench.scaffold import check_backend, progress, scratch
from evq.bench.store import BenchError, Workload
from evq.domain.codes import ResponseCode
from evq.domain.message import Message, encode_properties
from evq.domain.record import encode_batch, peek
from evq.domain.topics import AUTO_CREATE_TOPIC
from evq.net.codes import RequestCode
from evq.net.headers.admin import CreateTopicRequest
from evq.net.headers.offsets import GetMaxOffsetRequest, GetMaxOffsetResponse
from evq.net.headers.pull import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, PullRequest, PullResponse
from evq.net.protocol import MAX_FRAME, RemotingCommand
from evq.net.transport import RemotingClient, run

log = logs.get_logger(__name__)

PRODUCER_GROUP = "BenchNetProducer"
CONSUMER_GROUP = "BenchNetConsumer"
CHURN_GROUP_PREFIX = "BenchNetChurn"
CHURN_PAUSE_S = 0.05
PULL_BATCH = 32
PRODUCE_PHASES = 3  # single, batch, pipelined: each sends ``messages`` to the same topic
REQUEST_TIMEOUT_S = 30.0
SETTLE_MAX_S = 30.0
BATCH_ENTRY_OVERHEAD = 256  # batch entry head plus properties, generously


@attrs.frozen(kw_only=True)
class NetBenchOptions:
    backend: str = registry.DEFAULT_BACKEND
    messages: int = 100_000
    size: int = 1024
    batch: int = 32
    in_flight: int = 64
    queues: int = 8
    rate: int = 2_000
    latency_seconds: float = 5.0
    segment_size: int | None = None
    data: Path | None = None
    progress: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "batch", "in_flight", "queues", "rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.size < 0:
            raise ValueError("size must not be negative")
        if not self.latency_seconds > 0:
            raise ValueError("latency_seconds must be positive")
        if (self.size + BATCH_ENTRY_OVERHEAD) * self.batch > MAX_FRAME:
            raise ValueError(f"a batch of {self.batch} messages of {self.size} bytes exceeds "
                             f"the {MAX_FRAME}-byte frame limit; lower --size or --batch")

    @property
    def latency_messages(self) -> int:
        return max(2, round(self.rate * self.latency_seconds))

    def broker_settings(self) -> dict[str, object]:
        return {} if self.segment_size is None else {"commitlog_segment_size": self.segment_size}


@attrs.frozen(kw_only=True)
class NetBenchResult:
    """One run's figures; attribute names are the JSON keys (CPU figures are None where the
    broker's CPU time cannot be read)."""

    backend: str
    messages: int
    size: int
    queues: int
    batch: int
    in_flight: int
    produce_msgs_per_s: float
    produce_batch_msgs_per_s: float
    produce_pipelined_msgs_per_s: float
    consume_msgs_per_s: float
    consumed_messages: int
    send_p50_ms: float
    send_p99_ms: float
    send_max_ms: float
    latency_rate_msgs_per_s: float  # the rate asked for
    latency_achieved_msgs_per_s: float  # the rate the sends were actually started at
    latency_messages: int
    loop_stall_max_ms: float
    produce_broker_cpu_us_per_msg: float | None
    produce_client_cpu_us_per_msg: float
    produce_batch_broker_cpu_us_per_msg: float | None
    produce_batch_client_cpu_us_per_msg: float
    produce_pipelined_broker_cpu_us_per_msg: float | None
    produce_pipelined_client_cpu_us_per_msg: float
    consume_broker_cpu_us_per_msg: float | None
    consume_client_cpu_us_per_msg: float
    settle_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


# --- pure figures ---------------------------------------------------------------------------


def percentile(ordered: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ascending ``ordered``: a value
    that was measured, never an interpolation between two."""
    if not ordered:
        raise ValueError("no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} is not in (0, 100]")
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def count_records(body: bytes) -> int:
    """Stored records in a PULL_MESSAGE answer body, by walking their size fields."""
    count = pos = 0
    while (size := peek(body, pos)[0]) > 0:
        pos += size
        count += 1
    if pos != len(body):
        raise BenchError(f"a pull answer of {len(body)} bytes ends inside a record at {pos}")
    return count


@attrs.frozen
class PhaseCost:
    """Wall-clock and CPU seconds of one phase, the broker's CPU read from its process."""

    messages: int
    wall: float
    client_cpu: float
    broker_cpu: float | None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.wall

    @property
    def client_us_per_msg(self) -> float:
        return self.client_cpu / self.messages * 1e6

    @property
    def broker_us_per_msg(self) -> float | None:
        return None if self.broker_cpu is None else self.broker_cpu / self.messages * 1e6


# --- the client side ------------------------------------------------------------------------


def _expect(answer: RemotingCommand, what: str, *ok: ResponseCode) -> RemotingCommand:
    if answer.code not in (ok or (ResponseCode.SUCCESS,)):
        raise BenchError(f"{what}: the broker answered code {answer.code}: {answer.remark}")
    return answer


@attrs.define
class Producer:
    """Sends the workload's messages ``i`` to the benchmark topic, queue ``i mod queues``."""

    client: RemotingClient
    workload: Workload
    body: bytes
    born_ms: int

    @property
    def topic(self) -> str:
        return self.workload.topic(0)

    def _message(self, i: int) -> Message:
        return self.workload.message(i, self.body, self.born_ms)

    def _fields(self, queue_id: int, properties: str, *, batch: bool) -> dict[str, object]:
        return {
            "producerGroup": PRODUCER_GROUP, "topic": self.topic,
            "defaultTopic": AUTO_CREATE_TOPIC, "defaultTopicQueueNums": self.workload.queues,
            "queueId": queue_id, "sysFlag": 0, "bornTimestamp": self.born_ms, "flag": 0,
            "properties": properties, "reconsumeTimes": 0, "unitMode": "false",
            "batch": "true" if batch else "false",
        }

    async def send(self, i: int) -> None:
        m = self._message(i)
        fields = self._fields(m.queue_id, encode_properties(m.properties), batch=False)
        answer = await self.client.invoke(
            RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, m.body), REQUEST_TIMEOUT_S)
        _expect(answer, f"send of message {i}")

    async def send_batch(self, indices: range) -> None:
        messages = [self._message(i) for i in indices]
        fields = self._fields(messages[0].queue_id, "", batch=True)
        answer = await self.client.invoke(
            RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, fields,
                                    encode_batch(messages)), REQUEST_TIMEOUT_S)
        _expect(answer, f"batch send of messages {indices.start}..{indices.stop - 1}")


async def create_topic(client: RemotingClient, topic: str, queues: int) -> None:
    answer = await client.invoke(RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        CreateTopicRequest.write(topic=topic, read_queue_nums=queues, write_queue_nums=queues),
    ), REQUEST_TIMEOUT_S)
    _expect(answer, f"creating topic {topic}")


async def queue_ends(client: RemotingClient, topic: str, queues: int) -> list[int]:
    ends = []
    for queue_id in range(queues):
        answer = await client.invoke(RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET,
            GetMaxOffsetRequest.write(topic=topic, queue_id=queue_id)), REQUEST_TIMEOUT_S)
        ends.append(GetMaxOffsetResponse.read(
            _expect(answer, f"max offset of queue {queue_id}").ext_fields).offset)
    return ends


async def consume_queue(
    client: RemotingClient, topic: str, queue_id: int, end: int, bar: tqdm[Any]
) -> int:
    """Pull ``queue_id`` from 0 to ``end``, committing as it goes; messages received."""
    offset = received = 0
    while offset < end:
        fields = PullRequest.write(
            consumer_group=CONSUMER_GROUP, topic=topic, queue_id=queue_id, queue_offset=offset,
            max_msg_nums=PULL_BATCH, sys_flag=FLAG_SUBSCRIPTION | FLAG_COMMIT_OFFSET,
            commit_offset=offset, suspend_timeout_millis=0)
        answer = await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, fields),
                                     REQUEST_TIMEOUT_S)
        _expect(answer, f"pull of queue {queue_id} at {offset}")
        got = count_records(answer.body)
        next_offset = PullResponse.read(answer.ext_fields).next_begin_offset
        if got == 0 or next_offset - offset != got:
            raise BenchError(f"pull of queue {queue_id} at {offset}: {got} records, next "
                             f"offset {next_offset}")
        offset = next_offset
        received += got
        bar.update(got)
    return received


# --- phases ---------------------------------------------------------------------------------


async def timed(
    broker: BrokerProcess, messages: int, work: Callable[[], Awaitable[int | None]]
) -> PhaseCost:
    """Run ``work`` and measure it; ``work`` may return the messages it really moved."""
    broker.check_alive()
    broker_cpu = broker.cpu_seconds
    wall, cpu = time.perf_counter(), time.process_time()
    moved = await work()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    broker_after = broker.cpu_seconds
    used = None if broker_cpu is None or broker_after is None else broker_after - broker_cpu
    return PhaseCost(messages if moved is None else moved, wall, cpu, used)


async def produce_single(producer: Producer, indices: range, bar: tqdm[Any]) -> None:
    for i in indices:
        await producer.send(i)
        bar.update()


async def produce_batches(producer: Producer, indices: range, batch: int,
                          bar: tqdm[Any]) -> None:
    for start in range(indices.start, indices.stop, batch):
        chunk = range(start, min(start + batch, indices.stop))
        await producer.send_batch(chunk)
        bar.update(len(chunk))


async def produce_pipelined(producer: Producer, indices: range, in_flight: int,
                            bar: tqdm[Any]) -> None:
    """``in_flight`` senders drawing from one shared sequence, so exactly that many requests
    are outstanding until the sequence runs dry."""
    todo = iter(indices)

    async def sender() -> None:
        for i in todo:
            await producer.send(i)
            bar.update()

    async with asyncio.TaskGroup() as group:
        for _ in range(min(in_flight, len(indices))):
            group.create_task(sender())


async def consume_all(client: RemotingClient, topic: str, ends: list[int],
                      bar: tqdm[Any]) -> int:
    async with asyncio.TaskGroup() as group:
        pulls = [group.create_task(consume_queue(client, topic, q, end, bar))
                 for q, end in enumerate(ends)]
    return sum(p.result() for p in pulls)


async def metadata_churn(client: RemotingClient, topic: str, pause_s: float) -> int:
    """Pull ``topic`` as a new consumer group every ``pause_s`` until cancelled (each new group
    is a metadata record the broker makes durable); how many groups it made."""
    made = 0
    while True:
        answer = await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": f"{CHURN_GROUP_PREFIX}{made}", "topic": topic, "queueId": 0,
            "queueOffset": 0, "maxMsgNums": PULL_BATCH, "sysFlag": FLAG_SUBSCRIPTION,
            "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0,
        }), REQUEST_TIMEOUT_S)
        _expect(answer, f"pull by new group {made}")
        made += 1
        await asyncio.sleep(pause_s)


async def loop_stall_ms(client: RemotingClient) -> float:
    answer = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO),
                                 REQUEST_TIMEOUT_S)
    table = json.loads(_expect(answer, "broker runtime info").body)["table"]
    return float(table["evqLoopStallMaxMs"])


@attrs.frozen
class Latencies:
    seconds: list[float]  # ascending
    started_per_s: float


async def fixed_rate(producer: Producer, indices: range, rate: int,
                     bar: tqdm[Any]) -> Latencies:
    """Start one send every ``1/rate`` s by the schedule (not after the previous answer, so a
    slow answer does not slow the offered load); each is timed from its own start."""
    seconds: list[float] = []

    async def timed_send(i: int) -> None:
        t0 = time.perf_counter()
        await producer.send(i)
        seconds.append(time.perf_counter() - t0)
        bar.update()

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for n, i in enumerate(indices):
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(timed_send(i))
        last_started = time.perf_counter()
    started_per_s = (len(indices) - 1) / (last_started - t0) if len(indices) > 1 else rate
    return Latencies(sorted(seconds), started_per_s)


# --- the run --------------------------------------------------------------------------------


def run_net_bench(opts: NetBenchOptions) -> NetBenchResult:
    """Start a broker child, run every phase once against it, stop it; the figures."""
    check_backend(opts.backend)
    return run(_run(opts))


async def _run(opts: NetBenchOptions) -> NetBenchResult:
    n = opts.messages
    workload = Workload(PRODUCE_PHASES * n + opts.latency_messages, opts.size, topics=1,
                        queues=opts.queues)
    body = workload.size * b"\x5a"
    phases = [range(k * n, (k + 1) * n) for k in range(PRODUCE_PHASES)]
    latency_indices = range(PRODUCE_PHASES * n, workload.messages)
    with scratch(opts.data, "evq-bench-net-") as run_dir:
        async with (
            broker_process(opts.backend, run_dir / "broker",
                           settings=opts.broker_settings()) as broker,
            RemotingClient(broker.host, broker.port) as client,
        ):
            log.info("bench_started", backend=opts.backend, messages=n, size=opts.size,
                     broker=f"{broker.host}:{broker.port}")
            producer = Producer(client, workload, body, time.time_ns() // 1_000_000)
            await create_topic(client, producer.topic, opts.queues)
            settled = 0.0

            async def phase(name: str, total: int,
                            work: Callable[[tqdm[Any]], Awaitable[int | None]]) -> PhaseCost:
                nonlocal settled
                settled += await broker.settle(SETTLE_MAX_S)
                with progress(opts.progress, name, total) as bar:
                    cost = await timed(broker, total, lambda: work(bar))
                log.info("bench_phase_done", phase=name, seconds=round(cost.wall, 3))
                return cost

            single = await phase("produce", n, lambda bar: produce_single(
                producer, phases[0], bar))
            batch = await phase(f"produce x{opts.batch}", n, lambda bar: produce_batches(
                producer, phases[1], opts.batch, bar))
            pipelined = await phase(f"produce {opts.in_flight} in flight", n,
                                    lambda bar: produce_pipelined(
                                        producer, phases[2], opts.in_flight, bar))
            ends = await queue_ends(client, producer.topic, opts.queues)
            if sum(ends) != PRODUCE_PHASES * n:
                raise BenchError(f"the topic holds {sum(ends)} messages, "
                                 f"{PRODUCE_PHASES * n} were produced")
            consume = await phase("consume", sum(ends), lambda bar: consume_all(
                client, producer.topic, ends, bar))
            if consume.messages != sum(ends):
                raise BenchError(f"consumed {consume.messages} of {sum(ends)} messages")
            settled += await broker.settle(SETTLE_MAX_S)
            async with RemotingClient(broker.host, broker.port) as side:
                churn = asyncio.create_task(metadata_churn(side, producer.topic, CHURN_PAUSE_S))
                with progress(opts.progress, f"latency at {opts.rate}/s",
                              len(latency_indices)) as bar:
                    latencies = await fixed_rate(producer, latency_indices, opts.rate, bar)
                churn.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await churn
            stall_ms = await loop_stall_ms(client)
            broker.check_alive()

    ms = [s * 1000 for s in latencies.seconds]
    return NetBenchResult(
        backend=opts.backend, messages=n, size=opts.size, queues=opts.queues,
        batch=opts.batch, in_flight=opts.in_flight,
        produce_msgs_per_s=single.msgs_per_s,
        produce_batch_msgs_per_s=batch.msgs_per_s,
        produce_pipelined_msgs_per_s=pipelined.msgs_per_s,
        consume_msgs_per_s=consume.msgs_per_s,
        consumed_messages=consume.messages,
        send_p50_ms=percentile(ms, 50), send_p99_ms=percentile(ms, 99), send_max_ms=ms[-1],
        latency_rate_msgs_per_s=opts.rate,
        latency_achieved_msgs_per_s=latencies.started_per_s,
        latency_messages=len(ms),
        loop_stall_max_ms=stall_ms,
        produce_broker_cpu_us_per_msg=single.broker_us_per_msg,
        produce_client_cpu_us_per_msg=single.client_us_per_msg,
        produce_batch_broker_cpu_us_per_msg=batch.broker_us_per_msg,
        produce_batch_client_cpu_us_per_msg=batch.client_us_per_msg,
        produce_pipelined_broker_cpu_us_per_msg=pipelined.broker_us_per_msg,
        produce_pipelined_client_cpu_us_per_msg=pipelined.client_us_per_msg,
        consume_broker_cpu_us_per_msg=consume.broker_us_per_msg,
        consume_client_cpu_us_per_msg=consume.client_us_per_msg,
        settle_seconds=round(settled, 2),
    )


# --- the report -----------------------------------------------------------------------------


def _cpu(broker_us: float | None, client_us: float) -> str:
    broker = "?" if broker_us is None else f"{broker_us:,.1f}"
    return f"{broker} / {client_us:,.1f}"


def format_report(result: NetBenchResult) -> str:
    """The human table (the CLI prints it)."""
    r = result
    rows = [
        ("produce", f"{r.produce_msgs_per_s:,.0f} msgs/s", "1 message per request, awaited",
         _cpu(r.produce_broker_cpu_us_per_msg, r.produce_client_cpu_us_per_msg)),
        ("produce batch", f"{r.produce_batch_msgs_per_s:,.0f} msgs/s",
         f"SEND_BATCH_MESSAGE of {r.batch}, awaited",
         _cpu(r.produce_batch_broker_cpu_us_per_msg, r.produce_batch_client_cpu_us_per_msg)),
        ("produce pipelined", f"{r.produce_pipelined_msgs_per_s:,.0f} msgs/s",
         f"{r.in_flight} requests in flight",
         _cpu(r.produce_pipelined_broker_cpu_us_per_msg,
              r.produce_pipelined_client_cpu_us_per_msg)),
        ("consume", f"{r.consume_msgs_per_s:,.0f} msgs/s",
         f"PULL_MESSAGE x{PULL_BATCH}, {r.queues} queues in parallel, "
         f"{r.consumed_messages:,} msgs",
         _cpu(r.consume_broker_cpu_us_per_msg, r.consume_client_cpu_us_per_msg)),
        ("send p50", f"{r.send_p50_ms:,.3f} ms",
         f"{r.latency_messages:,} sends at {r.latency_rate_msgs_per_s:,.0f}/s "
         f"(achieved {r.latency_achieved_msgs_per_s:,.0f}/s)", ""),
        ("send p99", f"{r.send_p99_ms:,.3f} ms", f"max {r.send_max_ms:,.3f} ms", ""),
        ("loop stall", f"{r.loop_stall_max_ms:,.1f} ms",
         "the broker's event loop, longest over the run (new groups during latency)", ""),
    ]
    head = ("phase", "figure", "how", "cpu us/msg broker / client")
    widths = [max(len(row[k]) for row in [head, *rows]) for k in range(4)]
    lines = [f"evq bench net: backend {r.backend}, {r.messages:,} messages of {r.size} bytes "
             f"per produce phase, broker in its own process"]
    for row in [head, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip())
    lines.append(f"(waited {r.settle_seconds:.1f} s in all for the broker to go idle "
                 "before phases)")
    return "\n".join(lines)

