"""``evq bench ha``: what replication costs a producer, and how far a slave trails.

Three broker groups, one after another, each in child processes with fresh stores: a master
with no slave, an ASYNC_MASTER with a slave, a SYNC_MASTER with a slave.  Against each master
``in_flight`` senders produce ``messages`` single-message sends; every send's latency is
timed, and while they run the master's and the slave's log ends are sampled
(GET_BROKER_RUNTIME_INFO) every :data:`LAG_SAMPLE_S` for the replication lag in bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs

from evq import logs
from evq.bench.broker_process import BrokerProcess, broker_process
from evq.bench.net import Producer, create_topic, percentile
from evq.bench.scaffold import check_backend, free_port, scratch
from evq.bench.store import BenchError, Workload
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, run

log = logs.get_logger(__name__)

SETUPS = ("no slave", "ASYNC_MASTER", "SYNC_MASTER")
LAG_SAMPLE_S = 0.05
READY_TIMEOUT_S = 60.0
SETTLE_MAX_S = 30.0


@attrs.frozen(kw_only=True)
class HABenchOptions:
    backend: str = "mmap"
    messages: int = 20_000
    size: int = 1024
    in_flight: int = 32
    queues: int = 8
    data: Path | None = None

    def __attrs_post_init__(self) -> None:
        if self.messages < 1 or self.in_flight < 1 or self.queues < 1 or self.size < 0:
            raise ValueError("messages, in-flight and queues must be positive, size >= 0")


@attrs.frozen(kw_only=True)
class SetupFigures:
    setup: str
    produce_msgs_per_s: float
    send_p50_ms: float
    send_p99_ms: float
    lag_mean_bytes: float | None  # None without a slave
    lag_max_bytes: int | None
    lag_samples: int


@attrs.frozen(kw_only=True)
class HABenchResult:
    backend: str
    messages: int
    size: int
    in_flight: int
    setups: tuple[SetupFigures, ...]

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def run_ha_bench(opts: HABenchOptions) -> HABenchResult:
    check_backend(opts.backend)
    return run(_run(opts))


async def _run(opts: HABenchOptions) -> HABenchResult:
    figures = []
    with scratch(opts.data, "evq-bench-ha-") as run_dir:
        for n, setup in enumerate(SETUPS):
            figures.append(await _measure(opts, setup, run_dir / f"setup{n}"))
    return HABenchResult(backend=opts.backend, messages=opts.messages, size=opts.size,
                         in_flight=opts.in_flight, setups=tuple(figures))


@contextlib.asynccontextmanager
async def _group(opts: HABenchOptions, setup: str, root: Path
                 ) -> AsyncIterator[tuple[BrokerProcess, BrokerProcess | None]]:
    root.mkdir(parents=True)
    host = "127.0.0.1"
    ha_port = free_port(host)
    role = "SYNC_MASTER" if setup == "SYNC_MASTER" else "ASYNC_MASTER"
    async with broker_process(opts.backend, root / "master",
                              settings={"broker_role": role, "ha_listen_port": ha_port}) as master:
        if setup == "no slave":
            yield master, None
            return
        async with broker_process(opts.backend, root / "slave", settings={
                "broker_role": "SLAVE", "broker_id": 1,
                "master_ha_addr": f"{host}:{ha_port}"}) as slave:
            yield master, slave


async def log_end(client: RemotingClient) -> int:
    answer = await client.invoke(
        RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0)
    return int(json.loads(answer.body)["table"]["commitLogMaxOffset"])


async def _slave_ready(master: RemotingClient, slave: RemotingClient, producer: Producer
                       ) -> None:
    """Until a send is answered SUCCESS and the slave's log has caught up with it (a
    SYNC_MASTER answers SLAVE_NOT_AVAILABLE before its slave connects).  No send follows the
    first answered one: an ASYNC_MASTER's slave trails each send by a moment, and comparing
    the two ends after every new send could miss it catching up for as long as a loaded
    machine keeps that moment longer than the comparison."""
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            try:
                await producer.send(0)
                break
            except BenchError:  # SLAVE_NOT_AVAILABLE: the slave is not connected yet
                await asyncio.sleep(0.1)
        end = await log_end(master)
        while await log_end(slave) < end:
            await asyncio.sleep(0.05)


async def _measure(opts: HABenchOptions, setup: str, root: Path) -> SetupFigures:
    workload = Workload(opts.messages, opts.size, topics=1, queues=opts.queues)
    body = workload.size * b"\x5a"
    async with _group(opts, setup, root) as (master, slave), \
            RemotingClient(master.host, master.port) as client, \
            RemotingClient(master.host, master.port) as probe:
        producer = Producer(client, workload, body, time.time_ns() // 1_000_000)
        await create_topic(client, producer.topic, opts.queues)
        lags: list[int] = []
        if slave is not None:
            async with RemotingClient(slave.host, slave.port) as slave_probe:
                await _slave_ready(probe, slave_probe, producer)
                await master.settle(SETTLE_MAX_S)
                sampler = asyncio.create_task(_sample_lag(probe, slave_probe, lags))
                try:
                    wall, latencies = await _produce(producer, opts)
                finally:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
        else:
            await master.settle(SETTLE_MAX_S)
            wall, latencies = await _produce(producer, opts)
        master.check_alive()
    ms = sorted(s * 1000 for s in latencies)
    log.info("bench_ha_setup_done", setup=setup, seconds=round(wall, 3))
    return SetupFigures(
        setup=setup, produce_msgs_per_s=opts.messages / wall,
        send_p50_ms=percentile(ms, 50), send_p99_ms=percentile(ms, 99),
        lag_mean_bytes=sum(lags) / len(lags) if lags else None,
        lag_max_bytes=max(lags) if lags else None, lag_samples=len(lags))


async def _produce(producer: Producer, opts: HABenchOptions) -> tuple[float, list[float]]:
    """``in_flight`` senders over one shared sequence; each send's seconds, and the wall."""
    todo = iter(range(opts.messages))
    latencies: list[float] = []

    async def sender() -> None:
        for i in todo:
            started = time.perf_counter()
            await producer.send(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(opts.in_flight, opts.messages)):
                group.create_task(sender())
    except* BenchError as errors:
        raise errors.exceptions[0] from None
    return time.perf_counter() - started, latencies


async def _sample_lag(master: RemotingClient, slave: RemotingClient, out: list[int]) -> None:
    while True:
        m, s = await asyncio.gather(log_end(master), log_end(slave))
        out.append(max(0, m - s))
        await asyncio.sleep(LAG_SAMPLE_S)


def format_report(result: HABenchResult) -> str:
    r = result
    head = ("setup", "produce msgs/s", "send p50 ms", "send p99 ms", "lag mean / max bytes")
    rows = [head]
    for f in r.setups:
        lag = ("-" if f.lag_max_bytes is None
               else f"{f.lag_mean_bytes:,.0f} / {f.lag_max_bytes:,}")
        rows.append((f.setup, f"{f.produce_msgs_per_s:,.0f}", f"{f.send_p50_ms:,.3f}",
                     f"{f.send_p99_ms:,.3f}", lag))
    widths = [max(len(row[k]) for row in rows) for k in range(len(head))]
    lines = [f"evq bench ha: backend {r.backend}, {r.messages:,} sends of {r.size} bytes, "
             f"{r.in_flight} in flight, brokers in their own processes"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)
