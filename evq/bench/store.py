"""The store benchmark: what one :class:`~evq.domain.log.MessageLog` does per second.

One run measures, each phase on a fresh store directory under a scratch directory:

* **append**: batches of ``batch`` records per :meth:`append` call, then single-record calls;
* **read**: every queue read back from offset 0, ``max_count=32`` per call, nothing decoded;
* **key lookups**: :meth:`query_keys` on random UNIQ_KEY and KEYS values;
* **recovery**: a child process appends every record and is SIGKILLed; the parent times
  :func:`~evq.backends.registry.open_log` on what it left (abnormal recovery);
* **floor**: a plain Python loop copying the same records into a pre-faulted mapping by slice
  assignment and nothing else: what any Python store must at least spend;
* **sync**: ``producers`` threads each looping ``append([record])`` + ``wait_durable`` on a
  SYNC_FLUSH store (group commit), then the same with ``producers`` coroutines on one event
  loop awaiting durability through one ``on_durable`` request a flush round
  (:class:`~evq.net.durable.DurableWaker`, as the network broker waits).

Records are encoded once with :func:`~evq.domain.record.put_record` before anything is timed
and spooled to disk in pickled chunks, so every phase appends the very same bytes without
re-encoding and without holding N records in memory.  Only the calls being measured are inside
the timed regions; loading the next chunk, progress bars and checks are outside.

Each throughput phase waits after opening its store until the process is idle (:func:`settle`):
a fresh store may still be creating and pre-faulting files in the background, and racing that
skews the figures of short runs.  Appends and the floor report the timing thread's CPU time next to
wall-clock time, since on a shared machine the latter moves with everything else running.
The floor's mapping is MAP_POPULATE'd, as the floor is defined: a shared file mapping
populated that way still takes a light write fault on the first write to each page, which the
store's allocator avoids by pre-faulting pages writable ahead of the writer, off the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
from tqdm import tqdm

from evq import logs
from evq.backends import registry
from evq.backends.config import StoreConfig
from evq.bench.scaffold import check_backend, populated_mapping, progress, scratch, store_config
from evq.domain.log import FlushMode, GetStatus, MessageLog
from evq.domain.message import Message, Prop, new_message
from evq.domain.record import PutRecord, put_record
from evq.net.durable import DurableWaker

log = logs.get_logger(__name__)

MB = 1_000_000  # throughput figures count 10**6 bytes of stored records as one MB
TOPICS = 4
QUEUES = 8
TAGS = ("TagA", "TagB", "TagC")
UNIQ_PREFIX = "AC11000200002A9F"  # 16 hex digits; the message number fills the other 16
READ_MAX_COUNT = 32
LOOKUP_MAX_COUNT = 32
SYNC_TIMEOUT_S = 5.0
CHUNK_BYTES = 128 * 1024 * 1024  # records held in memory at once, roughly
PROGRESS_EVERY = 8192  # records between progress updates of the crash child
SETTLE_WINDOW_S = 0.25
SETTLE_BUSY = 0.2  # "idle": under a fifth of one core over a window
SETTLE_MAX_S = 30.0


class BenchError(Exception):
    """The benchmark could not run or its store misbehaved (lost or rejected records)."""


@attrs.define
class Stopwatch:
    """Wall-clock and calling-thread CPU seconds of the timed regions, and the calling
    thread's page faults in them.

    CPU time is what the appending thread itself burned: on a shared machine it moves far less
    than wall time when other processes compete for the cores.  Page faults are the suspect
    for append/floor ratios that move between machines: a fresh page costs a fault (allocate,
    zero, map), and a shared file page the kernel has written back costs a write-protect
    fault again; minor faults (no I/O) and major ones (I/O) are counted apart.
    """

    wall: float = 0.0
    cpu: float = 0.0
    minflt: int = 0
    majflt: int = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.cpu += time.thread_time() - cpu
            self.wall += time.perf_counter() - wall
            after = resource.getrusage(resource.RUSAGE_THREAD)
            self.minflt += after.ru_minflt - usage.ru_minflt
            self.majflt += after.ru_majflt - usage.ru_majflt


def settle(max_seconds: float = SETTLE_MAX_S) -> float:
    """Wait until this process is nearly idle; returns the seconds waited.

    A freshly opened store pre-allocates and warms files in the background (the mmap
    backend creates its next segment); a long-running broker has that behind it, so the
    throughput phases start once it is done rather than racing it.
    """
    started = time.perf_counter()
    while time.perf_counter() - started < max_seconds:
        cpu = time.process_time()
        time.sleep(SETTLE_WINDOW_S)
        if time.process_time() - cpu < SETTLE_BUSY * SETTLE_WINDOW_S:
            break
    return time.perf_counter() - started


@attrs.frozen(kw_only=True)
class StoreBenchOptions:
    backend: str = registry.DEFAULT_BACKEND
    messages: int = 200_000
    size: int = 1024
    flush: FlushMode = FlushMode.ASYNC_FLUSH
    producers: int = 16
    data: Path | None = None
    segment_size: int | None = None
    batch: int = 32
    sync_messages: int = 50_000
    lookups: int = 10_000
    progress: bool = False
    transient_store_pool: bool = False
    """Also run the batched append phase with RocketMQ's transient store pool."""

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "producers", "batch", "sync_messages", "lookups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.size < 0:
            raise ValueError("size must not be negative")
        if self.transient_store_pool and self.backend != "mmap":
            raise ValueError("the transient store pool is the mmap backend's")

    def store_config(self, flush: FlushMode | None = None) -> StoreConfig:
        return store_config(self.segment_size, flush=flush or self.flush)


@attrs.frozen(kw_only=True)
class StoreBenchResult:
    """One run's figures; attribute names are the JSON keys."""

    backend: str
    flush: str
    messages: int
    size: int
    record_bytes: float  # mean encoded record size
    batch: int
    append_msgs_per_s: float
    append_mb_per_s: float
    append_cpu_us_per_msg: float
    append_single_msgs_per_s: float
    read_msgs_per_s: float
    key_lookups: int
    key_lookups_per_s: float
    key_lookup_misses: int
    recovery_seconds: float
    recovered_bytes: int
    floor_msgs_per_s: float
    floor_mb_per_s: float
    floor_cpu_us_per_msg: float
    ratio_to_floor: float
    ratio_to_floor_cpu: float
    append_minflt_per_msg: float
    append_majflt_per_msg: float
    floor_minflt_per_msg: float
    floor_majflt_per_msg: float
    fresh_page_us: float
    """Microseconds the kernel took to bring in each fresh page of the floor's file, before
    its timed loop: what every page of a growing log costs on this machine today."""
    sync_msgs_per_s: float
    sync_async_msgs_per_s: float
    sync_async_timeouts: int
    sync_producers: int
    sync_messages: int
    sync_timeouts: int
    settle_seconds: float
    # The batched append phase again with the transient store pool (--transient-store-pool).
    pool_append_msgs_per_s: float | None = None
    pool_append_cpu_us_per_msg: float | None = None
    pool_ratio_to_floor: float | None = None
    pool_ratio_to_floor_cpu: float | None = None
    pool_append_minflt_per_msg: float | None = None
    pool_append_majflt_per_msg: float | None = None
    pool_buffers: int | None = None
    pool_locked: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


# --- the workload ----------------------------------------------------------------------------


@attrs.frozen
class Workload:
    """Message ``i`` of a run: a few topics x 8 queues, tags, one KEYS word and a UNIQ_KEY."""

    messages: int
    size: int
    topics: int = TOPICS
    queues: int = QUEUES

    def topic(self, i: int) -> str:
        return f"BenchTopic{i % self.topics}"

    def queue_id(self, i: int) -> int:
        return (i // self.topics) % self.queues

    @staticmethod
    def uniq_key(i: int) -> str:
        return f"{UNIQ_PREFIX}{i:016X}"

    @staticmethod
    def key(i: int) -> str:
        return f"order-{i}"

    def message(self, i: int, body: bytes, born_ms: int) -> Message:
        m = new_message(
            self.topic(i), body, tags=TAGS[i % len(TAGS)], keys=self.key(i),
            properties={Prop.UNIQ_KEY: self.uniq_key(i)}, compress_over=None,
        )
        m.queue_id = self.queue_id(i)
        m.born_timestamp = born_ms
        return m


class Spool:
    """Records encoded once, pickled in chunks to one file; :meth:`chunks` reloads them."""

    def __init__(self, path: Path, counts: list[int], total_bytes: int):
        self.path = path
        self.counts = counts
        self.total_bytes = total_bytes

    @property
    def messages(self) -> int:
        return sum(self.counts)

    @classmethod
    def write(cls, path: Path, workload: Workload, bar: tqdm[Any]) -> Spool:
        body = random.Random(workload.size).randbytes(workload.size)
        born = time.time_ns() // 1_000_000
        counts: list[int] = []
        total = 0
        chunk: list[PutRecord] = []
        chunk_bytes = 0
        with path.open("wb") as f:
            for i in range(workload.messages):
                r = put_record(workload.message(i, body, born))
                chunk.append(r)
                chunk_bytes += len(r.data)
                if chunk_bytes >= CHUNK_BYTES or i == workload.messages - 1:
                    pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
                    counts.append(len(chunk))
                    total += chunk_bytes
                    bar.update(len(chunk))
                    chunk, chunk_bytes = [], 0
            f.flush()
            os.fsync(f.fileno())  # written back now, not by the kernel in a timed phase
        return cls(path, counts, total)

    def chunks(self) -> Iterator[list[PutRecord]]:
        with self.path.open("rb") as f:
            for _ in self.counts:
                yield pickle.load(f)

    def first(self, n: int) -> list[PutRecord]:
        out: list[PutRecord] = []
        for chunk in self.chunks():
            out += chunk[: n - len(out)]
            if len(out) >= n:
                break
        return out


# --- phases ---------------------------------------------------------------------------------


def copy_records(mm: mmap.mmap, pos: int, records: Sequence[PutRecord]) -> int:
    """The floor: slice-assign each record's bytes into ``mm`` from ``pos``; nothing else."""
    for r in records:
        data = r.data
        n = len(data)
        mm[pos : pos + n] = data
        pos += n
    return pos


def measure_floor(spool: Spool, work: Path, bar: tqdm[Any]) -> tuple[Stopwatch, float]:
    """Time of the floor loop for every record, into a fresh file mapped with MAP_POPULATE,
    and the microseconds the population took a page (outside the timed region, as the floor
    is defined; see :func:`~evq.bench.scaffold.populated_mapping`)."""
    path = work / "floor"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mm, fresh_page = populated_mapping(fd, spool.total_bytes)
        watch = Stopwatch()
        pos = 0
        try:
            for chunk in spool.chunks():
                with watch.running():
                    pos = copy_records(mm, pos, chunk)
                bar.update(len(chunk))
        finally:
            mm.close()
    finally:
        os.close(fd)
        path.unlink()
    if pos != spool.total_bytes:
        raise BenchError(f"floor copied {pos} bytes, expected {spool.total_bytes}")
    return watch, fresh_page


def append_batches(
    store: MessageLog, spool: Spool, batch: int, bar: tqdm[Any], *, durable: bool
) -> Stopwatch:
    """Time spent in ``append`` (and ``wait_durable`` when ``durable``) for every record,
    ``batch`` records per call."""
    watch = Stopwatch()
    for chunk in spool.chunks():
        batches = [chunk[i : i + batch] for i in range(0, len(chunk), batch)]
        if durable:
            with watch.running():
                for b in batches:
                    res = store.append(b)
                    store.wait_durable(res[-1].end_offset, SYNC_TIMEOUT_S)
        else:
            with watch.running():
                for b in batches:
                    store.append(b)
        bar.update(len(chunk))
    return watch


def check_appended(store: MessageLog, expected: int, phase: str) -> None:
    held = sum(store.queues().values())
    if held != expected:
        raise BenchError(
            f"{phase}: the store holds {held} of {expected} messages (records rejected?)"
        )


def read_all(store: MessageLog, bar: tqdm[Any]) -> tuple[int, float]:
    """Read every queue from offset 0 to its end; (records read, seconds)."""
    count = 0
    elapsed = 0.0
    for (topic, queue_id), end in sorted(store.queues().items()):
        offset = 0
        got = 0
        t0 = time.perf_counter()
        while offset < end:
            res = store.read(topic, queue_id, offset, READ_MAX_COUNT)
            if res.status is not GetStatus.FOUND:
                break
            got += len(res.records)
            offset = res.next_offset
        elapsed += time.perf_counter() - t0
        count += got
        bar.update(got)
    return count, elapsed


def lookup_keys(
    store: MessageLog, workload: Workload, lookups: int, seed: int = 1
) -> tuple[int, float]:
    """``lookups`` random key queries, alternating UNIQ_KEY and KEYS; (misses, seconds)."""
    rng = random.Random(seed)
    picks = [rng.randrange(workload.messages) for _ in range(lookups)]
    queries = [
        (workload.topic(i), workload.uniq_key(i) if n % 2 == 0 else workload.key(i))
        for n, i in enumerate(picks)
    ]
    end_ms = time.time_ns() // 1_000_000 + 3_600_000
    misses = 0
    t0 = time.perf_counter()
    for topic, key in queries:
        if not store.query_keys(topic, key, LOOKUP_MAX_COUNT, 0, end_ms).records:
            misses += 1
    return misses, time.perf_counter() - t0


def append_single(
    store: MessageLog, spool: Spool, bar: tqdm[Any], *, durable: bool
) -> Stopwatch:
    """Time spent appending every record with one-record ``append`` calls."""
    watch = Stopwatch()
    for chunk in spool.chunks():
        singles = [[r] for r in chunk]
        if durable:
            with watch.running():
                for one in singles:
                    res = store.append(one)
                    store.wait_durable(res[0].end_offset, SYNC_TIMEOUT_S)
        else:
            with watch.running():
                for one in singles:
                    store.append(one)
        bar.update(len(chunk))
    return watch


def measure_recovery(
    opts: StoreBenchOptions, spool: Spool, work: Path, bar: tqdm[Any]
) -> tuple[float, int]:
    """A child appends every record and is SIGKILLed; (seconds to reopen, log end)."""
    store_dir = work / "recovery"
    cmd = [
        sys.executable, "-m", "evq.bench.crash_child", "--backend", opts.backend,
        "--store", str(store_dir), "--spool", str(spool.path), "--batch", str(opts.batch),
        "--flush", opts.flush.value,
    ]
    for n in spool.counts:
        cmd += ["--count", str(n)]
    if opts.segment_size is not None:
        cmd += ["--segment-size", str(opts.segment_size)]
    with subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        end = _await_child(child.stdout, bar)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if end is None:
            raise BenchError(f"the crash child exited ({child.returncode}) before appending")
    t0 = time.perf_counter()
    store = registry.open_log(opts.backend, store_dir, opts.store_config(), background=False)
    seconds = time.perf_counter() - t0
    try:
        recovered = store.max_physical_offset
        check_appended(store, spool.messages, "recovery")
    finally:
        store.close()
    if recovered != end:
        raise BenchError(f"recovery found the log end at {recovered}, the child wrote {end}")
    return seconds, recovered


def _await_child(out: IO[str], bar: tqdm[Any]) -> int | None:
    done = 0
    for line in out:
        word, _, value = line.strip().partition(" ")
        if word == "progress":
            bar.update(int(value) - done)
            done = int(value)
        elif word == "end":
            return int(value)
    return None


def sync_producers(
    store: MessageLog, records: list[PutRecord], producers: int
) -> tuple[float, int]:
    """``producers`` threads each append their share one record at a time and wait for it to
    be durable; (seconds, timeouts)."""
    shares = [records[k::producers] for k in range(producers)]
    start = threading.Barrier(producers + 1)
    timeouts = [0] * producers
    errors: list[BaseException] = []

    def produce(k: int) -> None:
        mine = [[r] for r in shares[k]]
        start.wait()
        try:
            late = 0
            for one in mine:
                res = store.append(one)
                if not store.wait_durable(res[0].end_offset, SYNC_TIMEOUT_S):
                    late += 1
            timeouts[k] = late
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=produce, args=(k,), name=f"bench-producer-{k}")
        for k in range(producers)
    ]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise BenchError(f"a sync producer failed: {errors[0]!r}") from errors[0]
    return seconds, sum(timeouts)


def sync_coroutines(
    store: MessageLog, records: list[PutRecord], producers: int
) -> tuple[float, int]:
    """``producers`` coroutines on one event loop, each appending one record at a time and
    awaiting its durability through a :class:`DurableWaker`: how the network broker waits,
    with no thread hand-off per message; (seconds, timeouts)."""
    shares = [records[k::producers] for k in range(producers)]

    async def produce(mine: list[PutRecord], waker: DurableWaker) -> int:
        late = 0
        for r in mine:
            res = store.append([r])
            if not await waker.wait(res[0].end_offset):
                late += 1
        return late

    async def main() -> int:
        waker = DurableWaker(asyncio.get_running_loop(), store, SYNC_TIMEOUT_S)
        return sum(await asyncio.gather(*(produce(share, waker) for share in shares)))

    t0 = time.perf_counter()
    timeouts = asyncio.run(main())
    return time.perf_counter() - t0, timeouts


# --- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def _phase_dir(run: Path, name: str) -> Iterator[Path]:
    path = run / name
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_store_bench(opts: StoreBenchOptions) -> StoreBenchResult:
    """Run every phase once and return the figures."""
    check_backend(opts.backend)
    config = opts.store_config()  # validates the segment size before the long encoding pass
    workload = Workload(opts.messages, opts.size)
    durable = opts.flush is FlushMode.SYNC_FLUSH
    n = opts.messages
    with scratch(opts.data) as run:
        log.info("bench_started", backend=opts.backend, messages=n, size=opts.size,
                 scratch=str(run))
        with progress(opts.progress, "encode", n) as bar:
            spool = Spool.write(run / "records.spool", workload, bar)
        record_bytes = spool.total_bytes / n
        limit = min(config.max_message_size, config.commitlog_segment_size - 8)
        if record_bytes > limit:
            raise BenchError(f"records of {record_bytes:.0f} bytes exceed the store's limit "
                             f"of {limit} bytes; lower --size or raise --segment-size")

        with _phase_dir(run, "floor") as work, progress(opts.progress, "floor", n) as bar:
            floor, fresh_page = measure_floor(spool, work, bar)
        log.info("bench_phase_done", phase="floor", seconds=round(floor.wall, 3))

        settled = 0.0
        with (
            _phase_dir(run, "append") as work,
            registry.open_log(opts.backend, work / "store", config) as store,
        ):
            settled += settle()
            with progress(opts.progress, f"append x{opts.batch}", n) as bar:
                append = append_batches(store, spool, opts.batch, bar, durable=durable)
            check_appended(store, n, "append")
            log.info("bench_phase_done", phase="append", seconds=round(append.wall, 3))
            with progress(opts.progress, "read", n) as bar:
                read_count, read_s = read_all(store, bar)
            if read_count != n:
                raise BenchError(f"read: got {read_count} of {n} messages back")
            log.info("bench_phase_done", phase="read", seconds=round(read_s, 3))
            misses, lookup_s = lookup_keys(store, workload, opts.lookups)
            if misses:
                log.warning("bench_key_lookup_misses", misses=misses, lookups=opts.lookups)
            log.info("bench_phase_done", phase="keys", seconds=round(lookup_s, 3))

        pool_figures: dict[str, Any] = {}
        if opts.transient_store_pool:
            pool_figures = _append_with_pool(opts, spool, run, config, floor)
            settled += pool_figures.pop("settled")

        with (
            _phase_dir(run, "single") as work,
            registry.open_log(opts.backend, work / "store", config) as store,
        ):
            settled += settle()
            with progress(opts.progress, "append x1", n) as bar:
                single = append_single(store, spool, bar, durable=durable)
            check_appended(store, n, "single append")
            log.info("bench_phase_done", phase="single", seconds=round(single.wall, 3))

        with _phase_dir(run, "recovery") as work, progress(opts.progress, "crash child", n) as bar:
            recovery_s, recovered = measure_recovery(opts, spool, work, bar)
        log.info("bench_phase_done", phase="recovery", seconds=round(recovery_s, 3))

        sync_n = min(opts.sync_messages, n)
        records = spool.first(sync_n)
        sync_config = opts.store_config(FlushMode.SYNC_FLUSH)
        sync_figures = []
        for phase, producer in (("sync", sync_producers), ("sync-async", sync_coroutines)):
            with (
                _phase_dir(run, phase) as work,
                registry.open_log(opts.backend, work / "store", sync_config) as store,
            ):
                settled += settle()
                sync_figures.append(producer(store, records, opts.producers))
                check_appended(store, sync_n, phase)
                log.info("bench_phase_done", phase=phase, seconds=round(sync_figures[-1][0], 3))
        (sync_s, timeouts), (sync_co_s, co_timeouts) = sync_figures
        del records

    append_rate = n / append.wall
    floor_rate = n / floor.wall
    return StoreBenchResult(
        backend=opts.backend,
        flush=opts.flush.value,
        messages=n,
        size=opts.size,
        record_bytes=round(record_bytes, 1),
        batch=opts.batch,
        append_msgs_per_s=append_rate,
        append_mb_per_s=spool.total_bytes / MB / append.wall,
        append_cpu_us_per_msg=append.cpu / n * 1e6,
        append_single_msgs_per_s=n / single.wall,
        read_msgs_per_s=read_count / read_s,
        key_lookups=opts.lookups,
        key_lookups_per_s=opts.lookups / lookup_s,
        key_lookup_misses=misses,
        recovery_seconds=recovery_s,
        recovered_bytes=recovered,
        floor_msgs_per_s=floor_rate,
        floor_mb_per_s=spool.total_bytes / MB / floor.wall,
        floor_cpu_us_per_msg=floor.cpu / n * 1e6,
        ratio_to_floor=append_rate / floor_rate,
        ratio_to_floor_cpu=floor.cpu / append.cpu,
        sync_msgs_per_s=sync_n / sync_s,
        sync_async_msgs_per_s=sync_n / sync_co_s,
        sync_async_timeouts=co_timeouts,
        sync_producers=opts.producers,
        sync_messages=sync_n,
        sync_timeouts=timeouts,
        settle_seconds=round(settled, 2),
        append_minflt_per_msg=append.minflt / n,
        append_majflt_per_msg=append.majflt / n,
        floor_minflt_per_msg=floor.minflt / n,
        floor_majflt_per_msg=floor.majflt / n,
        fresh_page_us=fresh_page,
        **pool_figures,
    )


def _append_with_pool(
    opts: StoreBenchOptions, spool: Spool, run: Path, config: StoreConfig, floor: Stopwatch,
) -> dict[str, Any]:
    """The batched append phase on a store with the transient store pool: the figures
    (``pool_*`` fields of the result) and the seconds waited for the store to settle.

    The pool holds as many buffers as the run fills segments, plus one, at most RocketMQ's 5:
    each is a segment's size of (locked, if the limit allows) memory."""
    n = opts.messages
    buffers = min(5, spool.total_bytes // config.commitlog_segment_size + 2)
    pool_config = attrs.evolve(config, transient_store_pool_enable=True,
                               transient_store_pool_size=buffers)
    with (
        _phase_dir(run, "append-pool") as work,
        registry.open_log(opts.backend, work / "store", pool_config) as store,
    ):
        settled = settle()
        with progress(opts.progress, f"append x{opts.batch}, pool", n) as bar:
            watch = append_batches(store, spool, opts.batch, bar, durable=False)
        store.flush()  # committed: the count below reads what readers see
        check_appended(store, n, "append with the pool")
        pool = getattr(store, "_pool", None)
        locked = pool.locked if pool is not None else None
    log.info("bench_phase_done", phase="append-pool", seconds=round(watch.wall, 3))
    return {
        "settled": settled,
        "pool_append_msgs_per_s": n / watch.wall,
        "pool_append_cpu_us_per_msg": watch.cpu / n * 1e6,
        "pool_ratio_to_floor": floor.wall / watch.wall,
        "pool_ratio_to_floor_cpu": floor.cpu / watch.cpu,
        "pool_append_minflt_per_msg": watch.minflt / n,
        "pool_append_majflt_per_msg": watch.majflt / n,
        "pool_buffers": buffers,
        "pool_locked": locked,
    }


# --- the report -----------------------------------------------------------------------------


def format_report(result: StoreBenchResult) -> str:
    """The human table (the CLI prints it)."""
    r = result
    flush = "sync: each call waits for durability" if r.flush == "SYNC_FLUSH" else "async flush"
    rows = [
        ("append", f"{r.append_msgs_per_s:,.0f} msgs/s",
         f"{r.batch} records per call, {flush}"),
        ("append", f"{r.append_mb_per_s:,.1f} MB/s", f"{r.record_bytes:,.0f}-byte records"),
        ("append cpu", f"{r.append_cpu_us_per_msg:,.2f} us/msg", "appending thread's CPU time"),
        ("append single", f"{r.append_single_msgs_per_s:,.0f} msgs/s", "1 record per call"),
        ("read", f"{r.read_msgs_per_s:,.0f} msgs/s",
         f"every queue, max_count={READ_MAX_COUNT}, no decoding"),
        ("key lookups", f"{r.key_lookups_per_s:,.0f} /s",
         f"{r.key_lookups:,} queries, {r.key_lookup_misses} missed"),
        ("recovery", f"{r.recovery_seconds:,.3f} s",
         f"open after SIGKILL, {r.recovered_bytes / MB:,.1f} MB of log"),
        ("floor", f"{r.floor_msgs_per_s:,.0f} msgs/s",
         f"{r.floor_mb_per_s:,.1f} MB/s slice copy into a pre-faulted mmap"),
        ("floor cpu", f"{r.floor_cpu_us_per_msg:,.2f} us/msg", "copying thread's CPU time"),
        ("ratio to floor", f"{r.ratio_to_floor:.3f}", "append / floor (wall clock)"),
        ("ratio, cpu", f"{r.ratio_to_floor_cpu:.3f}", "floor CPU / append CPU"),
        ("page faults", f"{r.append_minflt_per_msg:.4f} /msg",
         f"appending thread: minor; major {r.append_majflt_per_msg:.4f}; the floor's "
         f"{r.floor_minflt_per_msg:.4f} and {r.floor_majflt_per_msg:.4f}"),
        ("fresh page", f"{r.fresh_page_us:,.2f} us",
         f"a 4 KiB page-cache page brought in (the floor's, before timing): a log grows at "
         f"most {mmap.PAGESIZE / r.fresh_page_us:,.0f} MB/s on this machine now"),
        ("sync", f"{r.sync_msgs_per_s:,.0f} msgs/s",
         f"{r.sync_producers} producers, append 1 + wait_durable, {r.sync_messages:,} msgs, "
         f"{r.sync_timeouts} timeouts"),
        ("sync, asyncio", f"{r.sync_async_msgs_per_s:,.0f} msgs/s",
         f"{r.sync_producers} coroutines, append 1 + on_durable, "
         f"{r.sync_async_timeouts} timeouts"),
    ]
    if r.pool_append_msgs_per_s is not None:
        locked = "locked" if r.pool_locked else "not locked (RLIMIT_MEMLOCK)"
        rows[4:4] = [
            ("append, pool", f"{r.pool_append_msgs_per_s:,.0f} msgs/s",
             f"transient store pool, {r.pool_buffers} buffers {locked}"),
            ("append cpu, pool", f"{r.pool_append_cpu_us_per_msg:,.2f} us/msg",
             f"ratio to floor {r.pool_ratio_to_floor:.3f} (wall), "
             f"{r.pool_ratio_to_floor_cpu:.3f} (cpu)"),
            ("page faults, pool", f"{r.pool_append_minflt_per_msg:.4f} /msg",
             f"appending thread: minor; major {r.pool_append_majflt_per_msg:.4f}"),
        ]
    head = (f"evq store benchmark: backend {r.backend}, {r.messages:,} messages, "
            f"{r.size}-byte bodies (stores settled {r.settle_seconds:.1f} s after opening)")
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [head, ""]
    lines += [f"  {a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    return "\n".join(lines)
