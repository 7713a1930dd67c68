"""The worker processes of ``evq bench compare``: one producer or one consumer, each system
driven by its own standard Python client.

Each worker is a process of its own (``python -m evq.bench.compare_workers SYSTEM ROLE ...``)
so that its CPU time is its client's alone, and prints one JSON line when done (an
:class:`Outcome`).  The timed phase runs from the first request to the last answer; connecting
and looking routes up happen before it.

* **produce**: ``n`` messages of ``PAYLOAD_SIZE`` bytes, an 8-byte big-endian sequence number
  then random bytes; ``sync`` sends one per request and awaits it, ``batch`` sends ``batch``
  per request (evq's ``send_batch``, a Redis pipeline of XADDs).
* **consume**: reads and acknowledges all ``n`` (evq: ``poll`` of 1 or ``batch`` and the
  offset commit; Redis: XREADGROUP of 1 or ``batch`` and one XACK of their ids) and checks the
  count and the sum of the sequence numbers.

Each worker also times every step of its loop (a send of one or a batch; a read of one or a
batch, with Redis's XACK of it) and reports the median and the 99th percentile: a rate is one
over the mean step, and the percentiles tell a slower typical step from a heavier tail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from evq import logs

if TYPE_CHECKING:
    import redis

    from evq.domain.queues import MessageQueue

TOPIC: Final = "bench"
"""The evq topic and the Redis stream."""
REDIS_GROUP: Final = "bench"
REDIS_CONSUMER: Final = "c1"
REDIS_FIELD: Final = b"d"
PRODUCER_GROUP: Final = "BenchCompareProducer"
CONSUMER_GROUP: Final = "BenchCompareConsumer"
PAYLOAD_SIZE: Final = 1024
SEQ_BYTES: Final = 8
DEADLINE_CHECK_EVERY: Final = 1024
REDIS_BLOCK_MS: Final = 1000
CLIENTS: Final = ("asyncio", "uvloop", "blocking")
"""evq's client in a worker: the asyncio one on the standard library's loop (as ``asyncio.run``
gives) or on uvloop, or the blocking one (``SyncProducer`` / ``SyncPullConsumer``), the shape
of redis-py's."""


@attrs.frozen(kw_only=True)
class Outcome:
    """What a worker did: messages done in ``seconds`` of wall time and ``cpu_seconds`` of its
    own CPU time (user + system) over the timed phase; ``ok`` is a consumer's check."""

    done: int
    seconds: float
    cpu_seconds: float
    p50_us: float
    """The median step (see the module docstring) in microseconds."""
    p99_us: float
    ok: bool = True
    detail: str = ""


@attrs.frozen(kw_only=True)
class Job:
    system: str
    role: str
    mode: str
    n: int
    batch: int
    address: str
    """evq: the name server ``host:port``; Redis: the server's ``host:port``."""
    max_seconds: float
    client: str = "asyncio"
    """evq's client (:data:`CLIENTS`)."""


def payloads(n: int) -> Iterator[bytes]:
    """``n`` bodies: sequence number ``i`` then the same random tail."""
    tail = os.urandom(PAYLOAD_SIZE - SEQ_BYTES)
    for i in range(n):
        yield i.to_bytes(SEQ_BYTES, "big") + tail


@attrs.define
class Checker:
    """Counts what a consumer read and adds up the sequence numbers, which must come to
    ``0 + 1 + ... + n-1``: nothing lost, nothing read twice."""

    count: int = 0
    seq_sum: int = 0
    wrong_size: int = 0

    def add(self, body: bytes) -> None:
        if len(body) != PAYLOAD_SIZE:
            self.wrong_size += 1
            return
        self.count += 1
        self.seq_sum += int.from_bytes(body[:SEQ_BYTES], "big")

    def ok(self, n: int) -> bool:
        return self.count == n and self.seq_sum == n * (n - 1) // 2 and not self.wrong_size

    def detail(self, n: int) -> str:
        return (f"read {self.count} of {n}, sequence sum {self.seq_sum} "
                f"(want {n * (n - 1) // 2}), {self.wrong_size} of the wrong size")


class Timer:
    """Wall and CPU time from :meth:`start` on, and the wall time of each step between
    :meth:`step` calls (the first step from :meth:`start`)."""

    def __init__(self, max_seconds: float) -> None:
        self.max_seconds = max_seconds
        self._wall = self._last = time.perf_counter()
        self._cpu = time.process_time()
        self._steps = array("d")
        self.done = 0
        """Messages a producer sent (:func:`requests` counts them)."""

    def start(self) -> None:
        self._wall = self._last = time.perf_counter()
        self._cpu = time.process_time()

    def step(self) -> None:
        now = time.perf_counter()
        self._steps.append(now - self._last)
        self._last = now

    def expired(self) -> bool:
        return time.perf_counter() - self._wall > self.max_seconds

    def outcome(self, checker: Checker | None = None, n: int = 0) -> Outcome:
        """The phase's figures: a producer's :attr:`done`, or what ``checker`` read of
        ``n``."""
        done = self.done if checker is None else checker.count
        seconds = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        steps = sorted(self._steps) or [0.0]
        p50, p99 = (steps[min(len(steps) - 1, len(steps) * q // 100)] * 1e6 for q in (50, 99))
        return Outcome(done=done, seconds=seconds, cpu_seconds=cpu, p50_us=p50, p99_us=p99,
                       ok=checker is None or checker.ok(n),
                       detail="" if checker is None else checker.detail(n))


def chunks(bodies: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for body in bodies:
        chunk.append(body)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def requests(job: Job, timer: Timer) -> Iterator[list[bytes]]:
    """The bodies of a producer's requests over its timed phase, a list a request (one body
    in ``sync`` mode, up to ``job.batch`` in ``batch``): the timer starts at the first and
    takes a step as each next one is asked for (the one before answered); the phase ends at
    ``job.max_seconds``, checked each batch and every :data:`DEADLINE_CHECK_EVERY` single
    sends.  Every system's producer loops over it, so they pay for the same loop."""
    size = 1 if job.mode == "sync" else job.batch
    every = DEADLINE_CHECK_EVERY if size == 1 else 1
    done = 0
    timer.start()
    for i, chunk in enumerate(chunks(payloads(job.n), size), 1):
        yield chunk
        timer.step()
        done += len(chunk)
        timer.done = done
        if i % every == 0 and timer.expired():
            break


def polls(job: Job, timer: Timer, checker: Checker, queues: list[MessageQueue]
          ) -> Iterator[MessageQueue]:
    """The queue of each of an evq consumer's polls over its timed phase, round the queues
    until the checker has all ``job.n`` or time is up; a step as each next one is asked for
    (the poll before read and checked)."""
    timer.start()
    while checker.count < job.n and not timer.expired():
        for queue in queues:
            yield queue
            timer.step()


# -- evq --------------------------------------------------------------------------------------


async def evq_produce(job: Job) -> Outcome:
    from evq.client.producer import Producer
    from evq.domain.message import new_message

    timer = Timer(job.max_seconds)
    async with Producer(PRODUCER_GROUP, job.address) as producer:
        await producer.publish_queues(TOPIC)  # the route, looked up before the timing
        for bodies in requests(job, timer):
            if job.mode == "sync":
                await producer.send(new_message(TOPIC, bodies[0]))
            else:
                await producer.send_batch([new_message(TOPIC, body) for body in bodies])
        return timer.outcome()


async def evq_consume(job: Job) -> Outcome:
    from evq.client.pull_consumer import PullConsumer

    timer, checker = Timer(job.max_seconds), Checker()
    max_nums = 1 if job.mode == "sync" else job.batch
    async with PullConsumer(CONSUMER_GROUP, job.address) as consumer:
        queues = await consumer.queues(TOPIC)
        await consumer.assign(queues)
        for queue in queues:
            await consumer.seek_to_begin(queue)
        for queue in polls(job, timer, checker, queues):
            for msg in (await consumer.poll(queue, max_nums)).messages:
                checker.add(msg.payload())
        await consumer.commit()  # the acknowledgement: the group's position, stored
        return timer.outcome(checker, job.n)


def evq_produce_blocking(job: Job) -> Outcome:
    """:func:`evq_produce` with :class:`~evq.client.blocking.SyncProducer`."""
    from evq.client.blocking import SyncProducer
    from evq.domain.message import new_message

    timer = Timer(job.max_seconds)
    with SyncProducer(PRODUCER_GROUP, job.address) as producer:
        producer.publish_queues(TOPIC)  # the route, looked up before the timing
        for bodies in requests(job, timer):
            if job.mode == "sync":
                producer.send(new_message(TOPIC, bodies[0]))
            else:
                producer.send_batch([new_message(TOPIC, body) for body in bodies])
        return timer.outcome()


def evq_consume_blocking(job: Job) -> Outcome:
    """:func:`evq_consume` with :class:`~evq.client.blocking.SyncPullConsumer`."""
    from evq.client.blocking import SyncPullConsumer

    timer, checker = Timer(job.max_seconds), Checker()
    max_nums = 1 if job.mode == "sync" else job.batch
    with SyncPullConsumer(CONSUMER_GROUP, job.address) as consumer:
        queues = consumer.queues(TOPIC)
        consumer.assign(queues)
        for queue in queues:
            consumer.seek_to_begin(queue)
        for queue in polls(job, timer, checker, queues):
            for msg in consumer.poll(queue, max_nums).messages:
                checker.add(msg.payload())
        consumer.commit()
        return timer.outcome(checker, job.n)


# -- Redis Streams ------------------------------------------------------------------------------


def _redis(address: str) -> redis.Redis:
    import redis

    host, _, port = address.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    client.ping()
    return client


def redis_produce(job: Job) -> Outcome:
    client = _redis(job.address)
    timer = Timer(job.max_seconds)
    for bodies in requests(job, timer):
        if job.mode == "sync":
            client.xadd(TOPIC, {REDIS_FIELD: bodies[0]})
        else:
            pipe = client.pipeline(transaction=False)
            for body in bodies:
                pipe.xadd(TOPIC, {REDIS_FIELD: body})
            pipe.execute()
    return timer.outcome()


def redis_consume(job: Job) -> Outcome:
    client = _redis(job.address)
    timer = Timer(job.max_seconds)
    checker = Checker()
    count = 1 if job.mode == "sync" else job.batch
    timer.start()
    while checker.count < job.n and not timer.expired():
        answer = client.xreadgroup(REDIS_GROUP, REDIS_CONSUMER, {TOPIC: ">"}, count=count,
                                   block=REDIS_BLOCK_MS)
        if not answer:
            timer.step()  # a read that found nothing is a step too, as evq's empty poll is
            continue
        entries = answer[0][1]
        for _, fields in entries:
            checker.add(fields[REDIS_FIELD])
        client.xack(TOPIC, REDIS_GROUP, *(entry_id for entry_id, _ in entries))
        timer.step()
    outcome = timer.outcome(checker, job.n)
    pending = int(client.xpending(TOPIC, REDIS_GROUP)["pending"])
    if pending:
        return attrs.evolve(outcome, ok=False, detail=f"{outcome.detail}; {pending} unacked")
    return outcome


def run(job: Job) -> Outcome:
    if job.system == "evq" and job.client == "blocking":
        return evq_produce_blocking(job) if job.role == "produce" else evq_consume_blocking(job)
    if job.system == "evq":
        work = evq_produce(job) if job.role == "produce" else evq_consume(job)
        if job.client == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(work)
        return asyncio.run(work)
    return redis_produce(job) if job.role == "produce" else redis_consume(job)


def command_args(job: Job) -> list[str]:
    """The arguments :func:`main` parses back into ``job``."""
    return [job.system, job.role, "--mode", job.mode, "--n", str(job.n), "--batch",
            str(job.batch), "--address", job.address, "--max-seconds", f"{job.max_seconds:g}",
            "--client", job.client]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evq.bench.compare_workers")
    parser.add_argument("system", choices=["evq", "redis"])
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--mode", choices=["sync", "batch"], required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--max-seconds", type=float, required=True)
    parser.add_argument("--client", choices=CLIENTS, default="asyncio")
    args = parser.parse_args(argv)
    logs.configure("warning")
    outcome = run(Job(system=args.system, role=args.role, mode=args.mode, n=args.n,
                      batch=args.batch, address=args.address, max_seconds=args.max_seconds,
                      client=args.client))
    print(json.dumps(attrs.asdict(outcome)), flush=True)  # the result line the parent reads
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
