"""The backend comparison: one workload on every backend, one after another, in one process.

Records are encoded once (:class:`~evq.bench.store.Spool`, the store benchmark's workload:
4 topics x 8 queues, tags, a KEYS word and a UNIQ_KEY each) and every backend appends the very
same bytes.  Per backend, each phase on a fresh store:

* **append**: ``1`` and ``writers`` threads, one record per ``append`` call followed by
  ``wait_durable`` (the store benchmark's producers), under ASYNC_FLUSH (all N messages) and
  SYNC_FLUSH (the first ``sync_messages``: each acknowledgement waits for an fsync); the
  time runs until the last record is durable (a closing ``flush``);
* **read hot**: every queue read back right after the single-writer append, 32 per pull;
* **read cold**: the same after closing the store, dropping its files from the page cache
  (``posix_fadvise(DONTNEED)`` on every file, the most an unprivileged process can do; the
  kernel honours it for clean pages only, so everything is flushed first) and reopening;
* **key lookups** and **offset-for-time lookups**: random UNIQ_KEY/KEYS queries and random
  (queue, time) searches on that store, the fastest of three rounds of other queries;
* **recovery**: a child process appends everything and is SIGKILLed; the parent times the
  reopen (not for ``memory``, which keeps nothing past its process);
* **disk bytes per message**: blocks the store's files occupy after close (sparse holes not
  counted) over N (not for ``memory``);
* **scale**: append, reads, lookups and disk use measured again with N/10 messages; the ratio
  N-figure / (N/10)-figure shows whether the per-message cost stays flat (1.0 = flat).

The mmap backend pre-allocates and warms whole segments, so ``segment_size`` (64 MiB here by
default, 1 GiB in production) shows in its disk figure at small N.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from tqdm import tqdm

from evq import logs
from evq.backends import registry
from evq.backends.config import MIB, StoreConfig
from evq.bench.store import (
    BenchError,
    Spool,
    StoreBenchOptions,
    Workload,
    check_appended,
    lookup_keys,
    measure_recovery,
    read_all,
    settle,
    sync_producers,
)
from evq.domain.log import FlushMode, MessageLog
from evq.domain.record import PutRecord

log = logs.get_logger(__name__)

SCALE_DIVISOR = 10
LOOKUP_SEEDS = (1, 2, 3)
"""Lookups run in rounds of other random queries and count the fastest round, as ``timeit``
does: what else runs (a compaction finishing, the append's write-back) only slows a round,
and one round of 10,000 lookups is a fifth of a second, where that moved the scale ratios by
a fifth between runs.  Each round asks for other keys and times, so no round finds what an
earlier one warmed."""
PHASES = ("scale", "append", "writers", "sync", "sync writers", "recovery")
RATIO_FIGURES = (
    "append_async_1_msgs_per_s",
    "read_hot_msgs_per_s",
    "key_lookups_per_s",
    "time_lookups_per_s",
    "disk_bytes_per_msg",
)


@attrs.frozen(kw_only=True)
class BackendsBenchOptions:
    backends: tuple[str, ...] = tuple(sorted(registry.BACKENDS))
    messages: int = 100_000
    size: int = 1024
    writers: int = 16
    sync_messages: int = 5_000
    lookups: int = 10_000
    segment_size: int = 64 * MIB
    data: Path | None = None
    progress: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "writers", "sync_messages", "lookups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.messages < SCALE_DIVISOR:
            raise ValueError(f"messages must be at least {SCALE_DIVISOR} (the scale phase "
                             f"runs N/{SCALE_DIVISOR})")
        if self.size < 0:
            raise ValueError("size must not be negative")
        unknown = [b for b in self.backends if b not in registry.BACKENDS]
        if unknown or not self.backends:
            raise registry.UnknownBackend(
                f"unknown backend {', '.join(map(repr, unknown)) or 'list (empty)'}; choose "
                f"from: {', '.join(sorted(registry.BACKENDS))}"
            )
        self.config()  # validates the segment size

    def config(self, flush: FlushMode = FlushMode.ASYNC_FLUSH) -> StoreConfig:
        return StoreConfig(flush=flush, commitlog_segment_size=self.segment_size)


@attrs.frozen(kw_only=True)
class BackendFigures:
    """One backend's figures; attribute names are the JSON keys (None: not applicable)."""

    backend: str
    messages: int
    size: int
    writers: int
    sync_messages: int
    append_async_1_msgs_per_s: float
    append_async_many_msgs_per_s: float
    append_sync_1_msgs_per_s: float
    append_sync_many_msgs_per_s: float
    sync_timeouts: int
    read_hot_msgs_per_s: float
    read_cold_msgs_per_s: float
    key_lookups_per_s: float
    key_lookup_misses: int
    time_lookups_per_s: float
    recovery_seconds: float | None
    disk_bytes_per_msg: float | None
    scale_messages: int
    scale_ratios: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


# --- measuring ------------------------------------------------------------------------------


def time_lookups(store: MessageLog, lookups: int, seed: int = 2) -> float:
    """Seconds for ``lookups`` offset-for-time searches at random times of random queues."""
    rng = random.Random(seed)
    spans = []
    for (topic, queue_id), end in sorted(store.queues().items()):
        lo = store.bounds(topic, queue_id)[0]
        if end > lo:
            first = store.store_time_at(topic, queue_id, lo)
            last = store.store_time_at(topic, queue_id, end - 1)
            spans.append((topic, queue_id, first, last))
    if not spans:
        raise BenchError("offset-for-time: the store holds no queue")
    queries = []
    for _ in range(lookups):
        topic, queue_id, first, last = rng.choice(spans)
        queries.append((topic, queue_id, rng.randint(first - 1, last + 1)))
    t0 = time.perf_counter()
    for topic, queue_id, ts in queries:
        store.offset_for_time(topic, queue_id, ts)
    return time.perf_counter() - t0


def disk_bytes(root: Path) -> int:
    """Bytes of disk the files under ``root`` occupy (allocated blocks: holes are free)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


@attrs.frozen
class MemoryStep:
    """The machine's own cost of touching memory at random at the scale phase's two sizes."""

    small_entries: int
    big_entries: int
    small_ns: float
    big_ns: float


def memory_step(messages: int, lookups: int = 200_000) -> MemoryStep:
    """Nanoseconds a random lookup takes in a Python dict of 16-byte keys as many as the
    scale phase's two stores hold messages (``messages`` and a tenth of it).

    A store's lookup is a few such random touches of memory, so its scale ratio can be no
    flatter than the machine's: once a working set outgrows the CPU caches every touch costs
    more (on a 2-core VM with 4 MiB of L2: about 3x from 10^5 to 10^6 keys, little beyond).
    The report prints this beside the ratios to tell that step from a store's own growth."""
    small_entries = messages // SCALE_DIVISOR
    rng = random.Random(4)
    timings = []
    for entries in (small_entries, messages):
        table = {rng.randbytes(16): i for i in range(entries)}
        keys = list(table)
        probes = [keys[rng.randrange(entries)] for _ in range(lookups)]
        del keys
        t0 = time.perf_counter()
        for key in probes:
            table[key]
        timings.append((time.perf_counter() - t0) / lookups * 1e9)
    return MemoryStep(small_entries, messages, timings[0], timings[1])


def drop_cached_pages(root: Path) -> None:
    """Ask the kernel to drop the page cache of every file under ``root``; without root this is
    the nearest thing to a cold cache, and it works for clean pages only."""
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _append_all(store: MessageLog, records: Sequence[PutRecord], writers: int,
                phase: str) -> tuple[float, int]:
    """msgs/s from the first append until every record is durable.

    The closing flush is part of the time: under ASYNC_FLUSH a run of 10^5 records ends
    within the first flush interval, and without it the figure would be the page cache's
    speed while a run of 10^6 pays for write-back all along (the mmap backend's scale ratio
    was 0.73 that way and is 0.95-0.97 with it; with flushing switched off it is flat too).
    """
    settle()
    seconds, timeouts = sync_producers(store, list(records), writers)
    t0 = time.perf_counter()
    store.flush()
    seconds += time.perf_counter() - t0
    check_appended(store, len(records), phase)
    return len(records) / seconds, timeouts


@attrs.frozen
class _Scale:
    """What one store of n messages measured after its single-writer append."""

    append: float
    read_hot: float
    key_lookups: float
    key_misses: int
    time_lookups: float
    disk: float | None


def _measure_scale(
    name: str, opts: BackendsBenchOptions, records: Sequence[PutRecord], work: Path,
    *, cold: bool,
) -> tuple[_Scale, float]:
    """Append ``records`` with one writer, read, look up; returns the figures and, if
    ``cold``, the cold read rate."""
    n = len(records)
    quiet = tqdm(disable=True)
    persistent = registry.TRAITS[name].persistent
    path = work / "store"
    with registry.open_log(name, path, opts.config()) as store:
        append, _ = _append_all(store, records, 1, "append")
        count, read_s = read_all(store, quiet)
        if count != n:
            raise BenchError(f"{name}: read {count} of {n} messages back")
        workload = Workload(n, opts.size)
        keys = [lookup_keys(store, workload, opts.lookups, seed) for seed in LOOKUP_SEEDS]
        misses = sum(m for m, _ in keys)
        key_s = min(seconds for _, seconds in keys)
        time_s = min(time_lookups(store, opts.lookups, seed) for seed in LOOKUP_SEEDS)
    disk = disk_bytes(path) / n if persistent else None
    cold_rate = 0.0
    if cold:
        if persistent:
            drop_cached_pages(path)
        with registry.open_log(name, path, opts.config()) as store:
            count, cold_s = read_all(store, quiet)
        cold_rate = count / cold_s
    figures = _Scale(append, n / read_s, opts.lookups / key_s, misses, opts.lookups / time_s,
                     disk)
    return figures, cold_rate


@contextlib.contextmanager
def _phase(run: Path, name: str, bar: tqdm[Any], backend: str) -> Iterator[Path]:
    bar.set_description(f"{backend}: {name}")
    with tempfile.TemporaryDirectory(prefix=f"{name.replace(' ', '-')}-", dir=run) as d:
        yield Path(d)
    bar.update(1)


def bench_backend(
    name: str, opts: BackendsBenchOptions, spool: Spool, records: Sequence[PutRecord],
    run: Path, bar: tqdm[Any],
) -> BackendFigures:
    """Every phase on one backend."""
    n = len(records)
    small_n = n // SCALE_DIVISOR
    sync_records = records[: min(opts.sync_messages, n)]
    # The small store first: measured after the big one it would reuse the memory the big
    # one freed (the memory backend appended 18% faster that way than on a fresh heap).
    with _phase(run, "scale", bar, name) as work:
        small, _ = _measure_scale(name, opts, records[:small_n], work, cold=False)
    with _phase(run, "append", bar, name) as work:
        big, cold = _measure_scale(name, opts, records, work, cold=True)
    rates: list[float] = []
    timeouts = 0
    for phase, flush, writers, recs in (
        ("writers", FlushMode.ASYNC_FLUSH, opts.writers, records),
        ("sync", FlushMode.SYNC_FLUSH, 1, sync_records),
        ("sync writers", FlushMode.SYNC_FLUSH, opts.writers, sync_records),
    ):
        with (_phase(run, phase, bar, name) as work,
              registry.open_log(name, work / "store", opts.config(flush)) as store):
            rate, late = _append_all(store, recs, writers, phase)
            rates.append(rate)
            timeouts += late
    recovery: float | None = None
    with _phase(run, "recovery", bar, name) as work:
        if registry.TRAITS[name].persistent:
            store_opts = StoreBenchOptions(backend=name, segment_size=opts.segment_size)
            recovery, _ = measure_recovery(store_opts, spool, work, tqdm(disable=True))
    ratios = {
        "append_async_1_msgs_per_s": big.append / small.append,
        "read_hot_msgs_per_s": big.read_hot / small.read_hot,
        "key_lookups_per_s": big.key_lookups / small.key_lookups,
        "time_lookups_per_s": big.time_lookups / small.time_lookups,
        "disk_bytes_per_msg": big.disk / small.disk if big.disk and small.disk else None,
    }
    return BackendFigures(
        backend=name, messages=n, size=opts.size, writers=opts.writers,
        sync_messages=len(sync_records), append_async_1_msgs_per_s=big.append,
        append_async_many_msgs_per_s=rates[0], append_sync_1_msgs_per_s=rates[1],
        append_sync_many_msgs_per_s=rates[2], sync_timeouts=timeouts,
        read_hot_msgs_per_s=big.read_hot, read_cold_msgs_per_s=cold,
        key_lookups_per_s=big.key_lookups, key_lookup_misses=big.key_misses + small.key_misses,
        time_lookups_per_s=big.time_lookups, recovery_seconds=recovery,
        disk_bytes_per_msg=big.disk, scale_messages=small_n, scale_ratios=ratios,
    )


def run_backends_bench(opts: BackendsBenchOptions) -> dict[str, BackendFigures]:
    """Encode once, then every phase on every backend in turn."""
    results: dict[str, BackendFigures] = {}
    if opts.data is not None:
        opts.data.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="evq-bench-backends-", dir=opts.data) as d:
        run = Path(d)
        workload = Workload(opts.messages, opts.size)
        with tqdm(total=opts.messages, desc="encode", unit="msg", unit_scale=True,
                  file=sys.stderr, disable=not opts.progress, leave=False) as bar:
            spool = Spool.write(run / "records.spool", workload, bar)
        records = [r for chunk in spool.chunks() for r in chunk]
        with tqdm(total=len(opts.backends) * len(PHASES), unit="phase", file=sys.stderr,
                  disable=not opts.progress, dynamic_ncols=True) as bar:
            for name in opts.backends:
                started = time.perf_counter()
                results[name] = bench_backend(name, opts, spool, records, run, bar)
                log.info("bench_backend_done", backend=name,
                         seconds=round(time.perf_counter() - started, 1))
    return results


# --- the report -----------------------------------------------------------------------------

_ROWS = (
    ("append_async_1_msgs_per_s", "append, async, 1 writer (msgs/s)"),
    ("append_async_many_msgs_per_s", "append, async, {writers} writers (msgs/s)"),
    ("append_sync_1_msgs_per_s", "append, sync, 1 writer (msgs/s)"),
    ("append_sync_many_msgs_per_s", "append, sync, {writers} writers (msgs/s)"),
    ("read_hot_msgs_per_s", "read by queue, hot (msgs/s)"),
    ("read_cold_msgs_per_s", "read by queue, cold (msgs/s)"),
    ("key_lookups_per_s", "key lookups (/s)"),
    ("time_lookups_per_s", "offset-for-time lookups (/s)"),
    ("recovery_seconds", "open after SIGKILL (s)"),
    ("disk_bytes_per_msg", "disk bytes per message"),
)


def _cell(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def format_markdown(results: dict[str, BackendFigures], rerun: str, step: MemoryStep) -> str:
    """The Markdown report: the figures, the scale ratios beside the machine's memory step,
    the command and the machine."""
    names = list(results)
    first = next(iter(results.values()))
    head = "| figure | " + " | ".join(names) + " |"
    rule = "|---|" + "---:|" * len(names)
    lines = [
        f"Backends compared with {first.messages:,} messages of {first.size}-byte bodies "
        f"(sync phases: the first {first.sync_messages:,}).",
        "",
        head,
        rule,
    ]
    for key, label in _ROWS:
        cells = [_cell(getattr(results[n], key)) for n in names]
        lines.append(f"| {label.format(writers=first.writers)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Per-message cost from {first.scale_messages:,} to {first.messages:,} messages: "
        f"figure at {first.messages:,} / figure at {first.scale_messages:,} "
        "(1.00 = flat; below 1 for a rate or above 1 for bytes = dearer per message).",
        "",
        head,
        rule,
    ]
    labels = dict(_ROWS)
    for key in RATIO_FIGURES:
        cells = [_cell(results[n].scale_ratios[key]) for n in names]
        lines.append(f"| {labels[key].format(writers=first.writers)} | " + " | ".join(cells)
                     + " |")
    lines += [
        "",
        f"The machine's step: a random lookup in a Python dict of {step.small_entries:,} keys "
        f"takes {step.small_ns:.0f} ns and of {step.big_entries:,} keys {step.big_ns:.0f} ns "
        f"(ratio {step.small_ns / step.big_ns:.2f}); a store's lookups pay it for every random "
        "touch of memory they make.",
        "",
        f"Command: `{rerun}`",
        f"Machine: {machine()}",
    ]
    return "\n".join(lines) + "\n"


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def charts_available() -> bool:
    """Whether matplotlib (the ``bench`` extra) is installed: a broker install has no
    plotting library, and the report is then the markdown table alone."""
    return importlib.util.find_spec("matplotlib") is not None


def write_charts(results: dict[str, BackendFigures], out: Path) -> list[Path]:
    """PNG bar charts, one panel per figure with its own axis: throughputs, recovery and
    disk, scale ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    first = next(iter(results.values()))
    labels = dict(_ROWS)
    charts = (
        ("throughput.png", "per second", [k for k, _ in _ROWS[:8]],
         lambda n, k: getattr(results[n], k)),
        ("recovery_and_disk.png", "seconds / bytes", ["recovery_seconds", "disk_bytes_per_msg"],
         lambda n, k: getattr(results[n], k)),
        ("scale.png", f"figure at {first.messages:,} / at {first.scale_messages:,}",
         list(RATIO_FIGURES), lambda n, k: results[n].scale_ratios[k]),
    )
    written = []
    for filename, ylabel, keys, value in charts:
        fig, axes = plt.subplots(1, len(keys), figsize=(2.2 * len(keys) + 2, 4), squeeze=False)
        for ax, key in zip(axes[0], keys, strict=True):
            heights = [value(n, key) or 0.0 for n in names]
            ax.bar(names, heights, color=[f"C{i}" for i in range(len(names))])
            ax.set_title(labels[key].format(writers=first.writers), fontsize=8, wrap=True)
            ax.tick_params(axis="x", labelsize=8, rotation=45)
        axes[0][0].set_ylabel(ylabel)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_report(
    results: dict[str, BackendFigures], out: Path, rerun: str, step: MemoryStep
) -> list[Path]:
    """``backends.md`` and the charts in ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / "backends.md"
    md.write_text(format_markdown(results, rerun, step))
    return [md, *(write_charts(results, out) if charts_available() else [])]
