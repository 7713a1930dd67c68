"""The store's cost per message as it grows: flat is the goal.

``evq bench store --scale 100000,1000000,10000000`` fills one fresh store per size with the
store benchmark's workload (:class:`~evq.bench.store.Workload`: four topics of eight queues,
tags, a KEYS word and a UNIQ_KEY each) in batches, smallest first, timing the appends; then,
with every store still open, it runs ``rounds`` rounds, each of which reads every queue back
and runs random key and offset-for-time lookups on each store in turn.  It reports each figure
per message (or per lookup) and its ratio at each size to the smallest size.  A store whose
appends, reads or lookups slow down as it holds more (an index that degrades, a lookup that
scans) shows a ratio above 1.

Why rounds: this machine's speed drifts up to twofold from one minute to the next, and the
10^7 store takes minutes to fill, so figures measured one size after another, minutes apart,
put the machine's drift into their ratios (key lookups at 10^7 measured 10.7x one run and
1.46x another on the same code).  Within a round the sizes are measured seconds apart, so a
ratio taken within one round compares like with like; each round starts at another size
(round ``r`` at size ``r % len(sizes)``), so no size is always the one measured first, right
after the fills.  A read-side figure is the median over the rounds, and its ratio the median
of the rounds' own ratios, not the ratio of two medians, which could pair figures from rounds
measured under different load; the spread of the rounds' ratios (lowest to highest) says how
much to trust it.

Appends can only be timed while a store is filled, and the fills run one after another, so
the append ratios still compare figures measured minutes apart and carry the drift.

Records are encoded a chunk at a time outside the timed regions, so 10^7 messages never sit
in memory at once and encoding is not counted.  Every store stays on disk until the end, so
the run first checks that the disk holds them all (:func:`disk_needed`) and stops before
filling anything if it does not; the scratch directory is removed however the run ends.
"""

from __future__ import annotations

import contextlib
import math
import resource
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
from tqdm import tqdm

from evq.backends import registry
from evq.backends.config import StoreConfig
from evq.bench.backends import time_lookups
from evq.bench.scaffold import check_backend, progress, scratch, store_config
from evq.bench.store import BenchError, Workload, lookup_keys, read_all, settle
from evq.domain.log import MessageLog
from evq.domain.record import put_record

T = TypeVar("T")

CHUNK = 50_000
"""Records encoded ahead of one timed stretch of appends."""

RECORD_OVERHEAD = 200
"""Bytes a CommitLog record takes besides its body (fixed header, topic, tags, KEYS and
UNIQ_KEY properties): about 170 measured with this workload."""
INDEX_OVERHEAD = 60
"""Bytes a message takes in the consume queue (20) and the key index (two keys, 40)."""
STORE_OVERHEAD = 128 << 20
"""Bytes a store holds besides its messages: the CommitLog written ahead of the writer, a
MiB per consume queue file, the index file's head (about 90 MiB measured with 32 queues)."""
DISK_MARGIN = 1.25
"""The estimate is rounded up by a quarter: running out of disk after a fill of minutes
wastes the minutes, an estimate too high only asks for more room than needed."""


@attrs.frozen(slots=True, kw_only=True)
class ScaleOptions:
    backend: str = registry.DEFAULT_BACKEND
    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    size: int = 1024
    batch: int = 32
    lookups: int = 10_000
    rounds: int = 5
    """Rounds of reads and lookups over every store (see the module docstring)."""
    segment_size: int | None = None
    data: Path | None = None
    progress: bool = False

    def __attrs_post_init__(self) -> None:
        check_backend(self.backend)
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError("scale sizes must be positive message counts")
        if len(set(self.sizes)) != len(self.sizes):
            raise ValueError("scale sizes must differ: each is one store, reported by its size")
        if min(self.batch, self.lookups, self.rounds) < 1 or self.size < 0:
            raise ValueError("batch, lookups and rounds must be at least 1, size not negative")

    def store_config(self) -> StoreConfig:
        return store_config(self.segment_size)


@attrs.frozen(slots=True)
class Reading:
    """One store's read side in one round."""

    read_us: float
    """Wall time per message of reading every queue from its start."""
    key_lookup_us: float
    time_lookup_us: float
    key_misses: int
    key_lookup_faults: float
    """Major page faults (reads from disk) per key lookup: above 0, the lookups ran on a
    store partly out of the page cache, and their figure says as much about the disk."""
    time_lookup_faults: float


READ_FIGURES = ("read_us", "key_lookup_us", "time_lookup_us")


@attrs.frozen(slots=True)
class ScalePoint:
    """One size's figures: the append cost of its fill, and the read side over the rounds
    (median figures; key misses summed; page faults per lookup over every round's lookups, as
    a median would hide the one round whose lookups read from disk)."""

    messages: int
    append_us: float
    """Wall time per appended message (batches of ``batch``)."""
    read_us: float
    key_lookup_us: float
    time_lookup_us: float
    key_misses: int
    key_lookup_faults: float
    time_lookup_faults: float


@attrs.frozen(slots=True)
class ScaleResult:
    """A run's figures by size, and every round's readings the read side's come from."""

    points: tuple[ScalePoint, ...]
    """One per size, smallest first."""
    rounds: tuple[tuple[Reading, ...], ...]
    """Per round, one reading per size in the order of :attr:`points`."""

    def figures(self, figure: str) -> list[list[float]]:
        """``figure`` of every size, a list per round."""
        return [[getattr(r, figure) for r in readings] for readings in self.rounds]

    def ratios(self) -> dict[str, list[float]]:
        """Each figure's ratio to the smallest size: appends from the one fill per size, the
        read side the median of the rounds' ratios."""
        out = {"append_us": relative([p.append_us for p in self.points])}
        for figure in READ_FIGURES:
            out[figure] = [statistics.median(c) for c in ratio_columns(self.figures(figure))]
        return out

    def ratio_ranges(self) -> dict[str, list[tuple[float, float]]]:
        """The lowest and highest of the rounds' ratios of each read-side figure per size."""
        return {f: [spread(c) for c in ratio_columns(self.figures(f))] for f in READ_FIGURES}


def relative(values: Sequence[float]) -> list[float]:
    """Each value over the first (the smallest store's)."""
    return [v / max(values[0], 1e-12) for v in values]


def ratio_columns(rounds: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per size, its ratio to the smallest size in each round: the ratios are taken within a
    round, whose figures were measured seconds apart, before anything is taken across rounds."""
    return [list(column) for column in zip(*(relative(r) for r in rounds), strict=True)]


def spread(values: Sequence[float]) -> tuple[float, float]:
    return min(values), max(values)


def disk_needed(sizes: Sequence[int], size: int) -> int:
    """Bytes of disk the stores of ``sizes`` messages of ``size``-byte bodies need at once,
    estimated generously (see :data:`DISK_MARGIN`)."""
    per_message = size + RECORD_OVERHEAD + INDEX_OVERHEAD
    return math.ceil(DISK_MARGIN * sum(n * per_message + STORE_OVERHEAD for n in sizes))


def check_disk(opts: ScaleOptions, root: Path) -> None:
    """Refuse a run whose stores would not fit on ``root``'s filesystem, before any is filled."""
    needed = disk_needed(opts.sizes, opts.size)
    free = shutil.disk_usage(root).free
    if needed > free:
        raise BenchError(
            f"{len(opts.sizes)} stores of {', '.join(f'{n:,}' for n in sorted(opts.sizes))} "
            f"messages with {opts.size:,}-byte bodies need about {needed:,} bytes of disk at once "
            f"({needed / 2**30:,.1f} GiB); {root.parent} has {free:,} bytes free "
            f"({free / 2**30:,.1f} GiB)")


@attrs.frozen(slots=True)
class _Filled:
    """A store filled and still open, and what its fill's appends cost a message."""

    workload: Workload
    store: MessageLog
    append_us: float


def run_scale(opts: ScaleOptions) -> ScaleResult:
    sizes = sorted(opts.sizes)
    with scratch(opts.data, "evq-bench-scale-") as root, contextlib.ExitStack() as opened:
        check_disk(opts, root)
        filled = []
        for n in sizes:
            store = opened.enter_context(
                registry.open_log(opts.backend, root / f"n-{n}", opts.store_config()))
            filled.append(_fill(opts, n, store))
        rounds = tuple(_round(opts, filled, r) for r in range(opts.rounds))
    points = tuple(_point(f, [readings[k] for readings in rounds])
                   for k, f in enumerate(filled))
    return ScaleResult(points, rounds)


def _fill(opts: ScaleOptions, n: int, store: MessageLog) -> _Filled:
    workload = Workload(n, opts.size)
    body = bytes(opts.size)
    born = time.time_ns() // 1_000_000
    append_s = 0.0
    with progress(opts.progress, f"{opts.backend} fill {n:,}", n) as bar:
        settle()  # a fresh store may still be creating and pre-faulting files
        for start in range(0, n, CHUNK):
            records = [put_record(workload.message(i, body, born))
                       for i in range(start, min(n, start + CHUNK))]
            t0 = time.perf_counter()
            for j in range(0, len(records), opts.batch):
                store.append(records[j:j + opts.batch])
            append_s += time.perf_counter() - t0
            bar.update(len(records))
    return _Filled(workload, store, append_s / n * 1e6)


def _round(opts: ScaleOptions, filled: list[_Filled], r: int) -> tuple[Reading, ...]:
    """Round ``r``: every store read and looked up in turn, starting at store ``r`` (mod the
    count), once the process is idle (the last fill's write-back and index work would
    otherwise be charged to the first store the round measures)."""
    first = r % len(filled)
    readings: dict[int, Reading] = {}
    total = sum(f.workload.messages + 2 * opts.lookups for f in filled)
    with progress(opts.progress, f"{opts.backend} round {r + 1}/{opts.rounds}", total) as bar:
        settle()
        for f in filled[first:] + filled[:first]:
            readings[f.workload.messages] = _reading(opts, f, r, bar)
    return tuple(readings[f.workload.messages] for f in filled)


def _reading(opts: ScaleOptions, filled: _Filled, r: int, bar: tqdm[Any]) -> Reading:
    """One store's read side in round ``r``: key and time lookups draw other random queries
    each round (seed ``r``), so a round does not find its queries' pages in the CPU's caches
    where the previous round left them."""
    store, n = filled.store, filled.workload.messages
    count, read_s = read_all(store, bar)
    if count != n:
        raise BenchError(f"{opts.backend}: read {count} of {n} messages back")
    (misses, key_s), key_faults = _faulting(
        lambda: lookup_keys(store, filled.workload, opts.lookups, seed=r))
    bar.update(opts.lookups)
    time_s, time_faults = _faulting(lambda: time_lookups(store, opts.lookups, seed=r))
    bar.update(opts.lookups)
    return Reading(read_s / n * 1e6, key_s / opts.lookups * 1e6, time_s / opts.lookups * 1e6,
                   misses, key_faults / opts.lookups, time_faults / opts.lookups)


def _point(filled: _Filled, readings: Sequence[Reading]) -> ScalePoint:
    def median(figure: str) -> float:
        return statistics.median(getattr(r, figure) for r in readings)

    return ScalePoint(filled.workload.messages, filled.append_us, median("read_us"),
                      median("key_lookup_us"), median("time_lookup_us"),
                      sum(r.key_misses for r in readings),
                      statistics.fmean(r.key_lookup_faults for r in readings),
                      statistics.fmean(r.time_lookup_faults for r in readings))


def _faulting(run: Callable[[], T]) -> tuple[T, int]:
    """``run()`` and the major page faults this process took meanwhile."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    out = run()
    return out, resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before


def as_dict(opts: ScaleOptions, result: ScaleResult) -> dict[str, Any]:
    """The run as JSON: ``points`` and ``ratios`` as before rounds, ``ratio_ranges`` of the
    read side, and ``rounds``, each round's readings keyed by store size."""
    return {"backend": opts.backend, "size": opts.size, "batch": opts.batch,
            "lookups": opts.lookups,
            "points": [attrs.asdict(p) for p in result.points], "ratios": result.ratios(),
            "ratio_ranges": result.ratio_ranges(),
            "rounds": [{str(p.messages): attrs.asdict(reading)
                        for p, reading in zip(result.points, readings, strict=True)}
                       for readings in result.rounds]}


def format_report(opts: ScaleOptions, result: ScaleResult) -> str:
    points = result.points
    rel, ranges = result.ratios(), result.ratio_ranges()
    lines = [f"per-message cost by store size, {opts.backend}, {opts.size}-byte bodies "
             f"(ratio to {points[0].messages:,} messages in brackets; flat is 1.00)",
             "append: timed during the fills, one size after another, so its ratios carry "
             "the machine's drift between them",
             f"read and lookups: the median of {len(result.rounds)} rounds over every store; "
             "its ratio the median of the rounds' own, then their lowest-highest",
             f"{'messages':>12} {'append us':>16} {'read us':>26} {'key lookup us':>26} "
             f"{'time lookup us':>26}"]
    for k, p in enumerate(points):
        cells = [f"{p.append_us:8.2f} ({rel['append_us'][k]:4.2f})"] + [
            f"{getattr(p, f):8.2f} ({rel[f][k]:4.2f}, {ranges[f][k][0]:4.2f}-"
            f"{ranges[f][k][1]:4.2f})" for f in READ_FIGURES]
        lines.append(f"{p.messages:>12,} {cells[0]:>16} {cells[1]:>26} {cells[2]:>26} "
                     f"{cells[3]:>26}")
    if any(p.key_lookup_faults or p.time_lookup_faults for p in points):
        lines.append("page faults read from disk per lookup, all rounds (key, time): "
                     + ", ".join(f"{p.key_lookup_faults:.2f}/{p.time_lookup_faults:.2f}"
                                 for p in points))
    if any(p.key_misses for p in points):
        lines.append(f"key lookups that missed, all rounds: {[p.key_misses for p in points]}")
    return "\n".join(lines) + "\n"
