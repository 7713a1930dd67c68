"""``evq bench compare``: evq beside Redis Streams in one harness, the yardstick of issue 18.

The same shape for every system, each with its own standard Python client:

1. a fresh server with an empty data directory (evq: ``evq serve``, mmap store, ASYNC_FLUSH,
   topic ``bench`` of one queue; Redis: ``redis-server`` with AOF, ``appendfsync everysec``,
   stream ``bench`` with one consumer group);
2. one producer process sends ``messages`` 1 KiB messages (an 8-byte sequence number, then
   random bytes) and exits;
3. one consumer process reads and acknowledges all of them, checking the count and the sum of
   the sequence numbers.

``sync`` is one message per request, awaited; ``batch`` is ``batch`` messages per request
(:mod:`evq.bench.compare_workers` says what each client sends).  Each phase reports its rate
and the CPU time per message of the server process (``/proc``, over the worker's run) and of
the client process (over its timed phase).  The rates move from day to day on a shared machine;
the ratios of evq to Redis measured in one run do not, and they are what the goals are about.

The rates also move within minutes on such a machine (2x between two runs of the same code,
seen on one day), so the systems take turns (:func:`schedule`): each run measures one mode on
evq and on Redis back to back, the system that goes first alternating from run to run, and
a ratio is the median over the runs of the ratio within each run (:func:`paired_ratio`), not
the ratio of two medians that may come from different minutes.

Redis is left out, with a note saying why, when ``redis-server`` is not on the ``PATH`` or
redis-py (the ``bench`` extra) is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, Final

import attrs
from tqdm import tqdm

from evq import logs
from evq.bench.broker_process import (
    BrokerProcess,
    BrokerProcessError,
    listening_address,
    stop_process,
)
from evq.bench.compare_workers import (
    CLIENTS,
    PAYLOAD_SIZE,
    REDIS_GROUP,
    TOPIC,
    Job,
    Outcome,
    command_args,
)
from evq.bench.scaffold import free_port, scratch
from evq.bench.store import BenchError

log = logs.get_logger(__name__)

HOST: Final = "127.0.0.1"
MODES: Final = ("sync", "batch")
ROLES: Final = ("produce", "consume")
PHASES: Final = tuple(f"{mode}_{role}" for mode in MODES for role in ROLES)
FIGURES: Final = ("msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg", "p50_us",
                   "p99_us")
START_TIMEOUT_S: Final = 60.0
ROUTE_POLL_S: Final = 0.05
SETTLE_MAX_S: Final = 30.0
WORKER_GRACE_S: Final = 120.0
"""A worker's start-up and connection on top of its ``max_seconds`` of timed work."""
REDIS_ARGS: Final = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


@attrs.frozen(kw_only=True)
class CompareOptions:
    messages: int = 100_000
    """Messages of a batch phase."""
    sync_messages: int = 20_000
    """Messages of a sync phase (one round trip each: the slow one)."""
    batch: int = 32
    runs: int = 1
    max_seconds: float = 60.0
    """A producer stops there; the consumer then reads what was sent."""
    data: Path | None = None
    redis: bool = True
    client: str = "asyncio"
    """evq's client in the worker processes (:data:`~evq.bench.compare_workers.CLIENTS`);
    Redis's is redis-py, blocking."""
    progress: bool = False
    """A bar on stderr, a step per phase (the CLI's, when stderr is a terminal)."""

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "sync_messages", "batch", "runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.max_seconds > 0:
            raise ValueError("max_seconds must be positive")
        if self.client not in CLIENTS:
            raise ValueError(f"unknown client {self.client!r}; choose one of: "
                             f"{', '.join(CLIENTS)}")
        if self.client == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("--client uvloop: uvloop is not installed")

    def messages_of(self, mode: str) -> int:
        return self.sync_messages if mode == "sync" else self.messages


@attrs.frozen(kw_only=True)
class PhaseFigures:
    """One phase of one system; CPU per message of the server is None without ``/proc``."""

    messages: int
    msgs_per_s: float
    server_cpu_us_per_msg: float | None
    client_cpu_us_per_msg: float
    p50_us: float
    """The median step of the worker's loop (a request of one message or a batch, see
    :mod:`evq.bench.compare_workers`), in microseconds."""
    p99_us: float


@attrs.frozen(kw_only=True)
class SystemFigures:
    version: str
    phases: dict[str, PhaseFigures]
    """By phase name (:data:`PHASES`), medians over the runs."""
    runs: dict[str, list[PhaseFigures]]
    """By phase name, each run's figures in run order (what the ratios pair)."""


@attrs.frozen(kw_only=True)
class CompareResult:
    options: CompareOptions
    systems: dict[str, SystemFigures]
    redis_note: str | None
    """Why Redis was left out; None when it ran."""

    def ratios(self) -> dict[str, dict[str, float | None]] | None:
        """evq's figure over Redis's, per phase and figure (:func:`paired_ratio` of the
        runs): above 1 is better for a rate, below 1 for CPU per message and for a step's
        time.  None when Redis did not run."""
        if "redis" not in self.systems:
            return None
        ours, theirs = self.systems["evq"].runs, self.systems["redis"].runs
        return {phase: {figure: paired_ratio([getattr(f, figure) for f in ours[phase]],
                                             [getattr(f, figure) for f in theirs[phase]])
                        for figure in FIGURES} for phase in PHASES}

    def rate_ratios(self) -> dict[str, list[float | None]] | None:
        """Each run's ratio of evq's rate to Redis's, per phase, in run order: the spread
        the median in :meth:`ratios` comes from.  None when Redis did not run."""
        if "redis" not in self.systems:
            return None
        ours, theirs = self.systems["evq"].runs, self.systems["redis"].runs
        return {phase: run_ratios([f.msgs_per_s for f in ours[phase]],
                                  [f.msgs_per_s for f in theirs[phase]])
                for phase in PHASES}

    def as_dict(self) -> dict[str, object]:
        o = self.options
        return {
            "messages": o.messages, "sync_messages": o.sync_messages, "batch": o.batch,
            "size": PAYLOAD_SIZE, "runs": o.runs, "max_seconds": o.max_seconds, "client": o.client,
            "systems": {name: {"version": s.version,
                               **{p: attrs.asdict(f) for p, f in s.phases.items()}}
                        for name, s in self.systems.items()},
            "ratios": self.ratios(),
            "rate_ratios_by_run": self.rate_ratios(),
            "redis_note": self.redis_note,
        }


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def run_ratios(ours: list[float | None], theirs: list[float | None]) -> list[float | None]:
    """``ours[k] / theirs[k]`` for each run ``k``; None where either figure is unknown."""
    return [_ratio(a, b) for a, b in zip(ours, theirs, strict=True)]


def paired_ratio(ours: list[float | None], theirs: list[float | None]) -> float | None:
    """The median over runs of ``ours[k] / theirs[k]``: each ratio from two measurements
    made back to back, so a machine that slows down between runs moves both sides of it.
    Runs where either figure is unknown (no ``/proc``) are left out; None if none is left."""
    return _median_known(run_ratios(ours, theirs))


def _median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def schedule(runs: int, systems: list[str]) -> list[tuple[int, str, str]]:
    """The order of the measurements, as ``(run, mode, system)``: within a run each mode is
    measured on every system back to back, and the system that goes first rotates from run
    to run, so neither system always meets the machine as the other left it."""
    order: list[tuple[int, str, str]] = []
    for run in range(runs):
        turn = systems[run % len(systems):] + systems[:run % len(systems)]
        order += [(run, mode, system) for mode in MODES for system in turn]
    return order


@attrs.frozen
class Server:
    """A running server of the comparison, fresh for one run of one mode."""

    process: BrokerProcess
    address: str
    """Where its workers connect: evq's name server, or Redis itself."""


ServerFactory = Callable[[Path], contextlib.AbstractAsyncContextManager[Server]]


def run_compare(opts: CompareOptions) -> CompareResult:
    return asyncio.run(_compare(opts))


async def _compare(opts: CompareOptions) -> CompareResult:
    note = redis_unavailable() if opts.redis else "left out (--no-redis)"
    systems: dict[str, tuple[str, ServerFactory]] = {
        "evq": (evq_version(opts.client), evq_server)}
    if note is None:
        systems["redis"] = (redis_version(), redis_server)
    runs: dict[str, dict[str, list[PhaseFigures]]] = {
        name: {phase: [] for phase in PHASES} for name in systems}
    order = schedule(opts.runs, list(systems))
    with (scratch(opts.data, prefix="evq-bench-compare-") as root,
          tqdm(total=len(order) * len(ROLES), unit="phase", file=sys.stderr,
               disable=not opts.progress, dynamic_ncols=True) as bar):
        for run, mode, name in order:
            log.info("compare_run", run=run + 1, of=opts.runs, mode=mode, system=name)
            bar.set_description(f"run {run + 1}/{opts.runs} {mode} {name}")
            produced, consumed = await _measure_mode(opts, name, systems[name][1], mode,
                                                     root / name / f"{mode}-{run}", bar)
            runs[name][f"{mode}_produce"].append(produced)
            runs[name][f"{mode}_consume"].append(consumed)
    figures = {name: SystemFigures(version=version,
                                   phases={p: _median(f) for p, f in runs[name].items()},
                                   runs=runs[name])
               for name, (version, _) in systems.items()}
    return CompareResult(options=opts, systems=figures, redis_note=note)


async def _measure_mode(opts: CompareOptions, system: str, factory: ServerFactory, mode: str,
                        data: Path, bar: tqdm[Any]) -> tuple[PhaseFigures, PhaseFigures]:
    """One run of ``mode`` on a fresh server: the produce phase, then the consume phase."""
    async with factory(data) as server:
        produced = await _phase(server, opts, system, "produce", mode, opts.messages_of(mode))
        bar.update()
        consumed = await _phase(server, opts, system, "consume", mode, produced.messages)
        bar.update()
    shutil.rmtree(data, ignore_errors=True)
    return produced, consumed


async def _phase(server: Server, opts: CompareOptions, system: str, role: str, mode: str,
                 n: int) -> PhaseFigures:
    await server.process.settle(SETTLE_MAX_S)  # start-up work, the flusher's trail
    job = Job(system=system, role=role, mode=mode, n=n, batch=opts.batch,
              address=server.address, max_seconds=opts.max_seconds, client=opts.client)
    before = server.process.cpu_seconds
    outcome = await _run_worker(job)
    after = server.process.cpu_seconds
    server.process.check_alive()
    if not outcome.ok:
        raise BenchError(f"{system} {mode} {role}: the consumer's check failed: "
                         f"{outcome.detail}")
    if outcome.done == 0:
        raise BenchError(f"{system} {mode} {role}: nothing done in {opts.max_seconds:g} s")
    server_cpu = None if before is None or after is None else after - before
    return PhaseFigures(
        messages=outcome.done, msgs_per_s=outcome.done / outcome.seconds,
        server_cpu_us_per_msg=None if server_cpu is None else server_cpu * 1e6 / outcome.done,
        client_cpu_us_per_msg=outcome.cpu_seconds * 1e6 / outcome.done,
        p50_us=outcome.p50_us, p99_us=outcome.p99_us)


async def _run_worker(job: Job) -> Outcome:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "evq.bench.compare_workers", *command_args(job),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(job.max_seconds + WORKER_GRACE_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BenchError(f"{job.system} {job.role} worker did not finish") from None
    lines = out.decode(errors="replace").strip().splitlines()
    if process.returncode != 0 or not lines:
        tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-5:])
        raise BenchError(f"{job.system} {job.role} worker failed with status "
                         f"{process.returncode}: {tail}")
    return Outcome(**json.loads(lines[-1]))


def _median(figures: list[PhaseFigures]) -> PhaseFigures:
    med = _median_known
    rate = med(f.msgs_per_s for f in figures)
    client = med(f.client_cpu_us_per_msg for f in figures)
    p50, p99 = med(f.p50_us for f in figures), med(f.p99_us for f in figures)
    assert rate is not None and client is not None  # every run has these
    assert p50 is not None and p99 is not None
    return PhaseFigures(messages=min(f.messages for f in figures), msgs_per_s=rate,
                        server_cpu_us_per_msg=med(f.server_cpu_us_per_msg for f in figures),
                        client_cpu_us_per_msg=client, p50_us=p50, p99_us=p99)


# -- the servers --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def evq_server(data: Path) -> AsyncIterator[Server]:
    """``evq serve`` (name server and broker in one process) with topic ``bench`` of one
    queue, visible in the name server's route before the first worker starts."""
    data.mkdir(parents=True)
    command = [sys.executable, "-m", "evq.cli", "--log-level", "warning", "serve",
               "--backend", "mmap", "--flush", "ASYNC_FLUSH", "--data", str(data / "store"),
               "--host", HOST, "--port", "0", "--namesrv-port", "0"]
    async with _child(command, data / "serve.log") as process:
        namesrv, broker = await _evq_addresses(process)
        await _create_topic(namesrv, broker)
        yield Server(BrokerProcess(process, *_split(broker)), namesrv)


async def _evq_addresses(process: asyncio.subprocess.Process) -> tuple[str, str]:
    """The name server's and the broker's addresses, from the lines ``evq serve`` prints."""
    assert process.stdout is not None
    found: dict[str, str] = {}
    async with asyncio.timeout(START_TIMEOUT_S):
        while len(found) < 2 and (line := (await process.stdout.readline()).decode()):
            address = listening_address(line)
            if address is not None:
                found["namesrv" if "namesrv" in line else "broker"] = f"{address[0]}:{address[1]}"
    if len(found) < 2:
        raise BrokerProcessError(f"evq serve exited with status {process.returncode} before "
                                 "listening")
    return found["namesrv"], found["broker"]


async def _create_topic(namesrv: str, broker: str) -> None:
    from evq.admin.operations import Admin, AdminError
    from evq.domain.topics import TopicConfig

    async with Admin(namesrv) as admin:
        one_queue = TopicConfig(topic_name=TOPIC, read_queue_nums=1, write_queue_nums=1)
        await admin.update_topic(one_queue, broker=broker)
        # The broker registers the topic with the name server in the background; a producer
        # that looked it up before then would send through TBW102's route, to four queues.
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                with contextlib.suppress(AdminError):
                    if len((await admin.topic_route(TOPIC)).publish_queues()) == 1:
                        return
                await asyncio.sleep(ROUTE_POLL_S)


@contextlib.asynccontextmanager
async def redis_server(data: Path) -> AsyncIterator[Server]:
    """``redis-server`` with AOF (``appendfsync everysec``) on a free port, stream ``bench``
    with its consumer group created."""
    import redis

    data.mkdir(parents=True)
    exe = shutil.which("redis-server")
    assert exe is not None  # redis_unavailable() said so
    port = free_port(HOST)
    command = [exe, "--port", str(port), "--bind", HOST, "--dir", str(data),
               "--daemonize", "no", "--logfile", str(data / "redis.log"), *REDIS_ARGS]
    async with _child(command, data / "redis.stderr") as process:
        await _await_connectable(process, port)
        client = redis.Redis(host=HOST, port=port)
        client.xgroup_create(TOPIC, REDIS_GROUP, id="0", mkstream=True)
        client.close()
        yield Server(BrokerProcess(process, HOST, port), f"{HOST}:{port}")


async def _await_connectable(process: asyncio.subprocess.Process, port: int) -> None:
    async with asyncio.timeout(START_TIMEOUT_S):
        while process.returncode is None:
            try:
                _, writer = await asyncio.open_connection(HOST, port)
            except OSError:
                await asyncio.sleep(ROUTE_POLL_S)
                continue
            writer.close()
            await writer.wait_closed()
            return
    raise BrokerProcessError(f"redis-server exited with status {process.returncode}")


@contextlib.asynccontextmanager
async def _child(command: list[str], stderr_path: Path
                 ) -> AsyncIterator[asyncio.subprocess.Process]:
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=stderr)
    try:
        yield process
    finally:
        await stop_process(process)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def redis_unavailable() -> str | None:
    """Why Redis cannot be compared here, or None when it can."""
    if shutil.which("redis-server") is None:
        return "left out: redis-server is not on the PATH (Debian: apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "left out: redis-py is not installed (pip install -e '.[bench]')"
    return None


def redis_version() -> str:
    import redis

    exe = shutil.which("redis-server")
    assert exe is not None
    server = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    words = dict(w.split("=", 1) for w in server.stdout.split() if "=" in w)
    return (f"Redis {words.get('v', '?')}, AOF appendfsync everysec; "
            f"redis-py {redis.__version__}")


def evq_version(client: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("evq")
    except PackageNotFoundError:
        ours = "?"
    if client == "blocking":
        return f"evq {ours} serve, mmap ASYNC_FLUSH; evq.client SyncProducer / SyncPullConsumer"
    return (f"evq {ours} serve, mmap ASYNC_FLUSH; evq.client Producer / PullConsumer on "
            f"{client}")


# -- the report ---------------------------------------------------------------------------------


def format_report(result: CompareResult) -> str:
    """The human table (the CLI prints it): a row per figure, a column per system, and evq's
    ratio to Redis."""
    o = result.options
    names = list(result.systems)
    ratios = result.ratios()
    head = ["figure", *names, *(["evq/redis"] if ratios else [])]
    rows = [head]
    for figure, label, fmt in (("msgs_per_s", "msgs/s", "{:,.0f}"),
                               ("server_cpu_us_per_msg", "server CPU us/msg", "{:,.1f}"),
                               ("client_cpu_us_per_msg", "client CPU us/msg", "{:,.1f}"),
                               ("p50_us", "p50 us/request", "{:,.0f}"),
                               ("p99_us", "p99 us/request", "{:,.0f}")):
        for phase in PHASES:
            cells = [f"{phase.replace('_', ' ')} {label}"]
            for name in names:
                value = getattr(result.systems[name].phases[phase], figure)
                cells.append("-" if value is None else fmt.format(value))
            if ratios:
                ratio = ratios[phase][figure]
                cells.append("-" if ratio is None else f"{ratio:.2f}")
            rows.append(cells)
    widths = [max(len(row[k]) for row in rows) for k in range(len(head))]
    lines = [f"evq bench compare: {o.sync_messages:,} sync / {o.messages:,} batch messages of "
             f"{PAYLOAD_SIZE} bytes, batches of {o.batch}, median of {o.runs} run(s)"]
    lines += ["  ".join(cell.rjust(w) if k else cell.ljust(w)
                        for k, (cell, w) in enumerate(zip(row, widths, strict=True)))
              for row in rows]
    lines += [f"{name}: {s.version}" for name, s in result.systems.items()]
    if ratios:
        lines.append("evq/redis: above 1 is better for msgs/s, below 1 for CPU per message "
                     "and time per request; the median of each run's ratio (systems measured "
                     "back to back)")
    by_run = result.rate_ratios()
    if by_run and o.runs > 1:
        lines += [f"evq/redis msgs/s by run, {phase.replace('_', ' ')}: "
                  + " ".join("-" if r is None else f"{r:.2f}" for r in by_run[phase])
                  for phase in PHASES]
    if result.redis_note:
        lines.append(f"redis: {result.redis_note}")
    return "\n".join(lines)
