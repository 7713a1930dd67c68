"""The store's cost per message as it grows: flat is the goal.

``evq bench store --scale 100000,1000000,10000000`` fills one fresh store per size with the
store benchmark's workload (:class:`~evq.bench.store.Workload`: four topics of eight queues,
tags, a KEYS word and a UNIQ_KEY each) in batches, then reads every queue back and runs random
key and offset-for-time lookups; it reports each figure per message (or per lookup) and its
ratio at each size to the smallest size.  A store whose appends, reads or lookups slow down
as it holds more (an index that degrades, a lookup that scans) shows a ratio above 1.

Records are encoded a chunk at a time outside the timed regions, so 10^7 messages never sit
in memory at once and encoding is not counted; each store is removed before the next size
starts, so the disk holds one of them at a time.
"""

from __future__ import annotations

import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
from tqdm import tqdm

from evq.backends import registry
from evq.backends.config import StoreConfig
from evq.bench.backends import time_lookups
from evq.bench.scaffold import check_backend, progress, scratch, store_config
from evq.bench.store import BenchError, Workload, lookup_keys, read_all, settle
from evq.domain.record import put_record

T = TypeVar("T")

CHUNK = 50_000
"""Records encoded ahead of one timed stretch of appends."""


@attrs.frozen(slots=True, kw_only=True)
class ScaleOptions:
    backend: str = registry.DEFAULT_BACKEND
    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    size: int = 1024
    batch: int = 32
    lookups: int = 10_000
    segment_size: int | None = None
    data: Path | None = None
    progress: bool = False

    def __attrs_post_init__(self) -> None:
        check_backend(self.backend)
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError("scale sizes must be positive message counts")
        if min(self.batch, self.lookups) < 1 or self.size < 0:
            raise ValueError("batch and lookups must be at least 1, size not negative")

    def store_config(self) -> StoreConfig:
        return store_config(self.segment_size)


@attrs.frozen(slots=True)
class ScalePoint:
    messages: int
    append_us: float
    """Wall time per appended message (batches of ``batch``)."""
    read_us: float
    key_lookup_us: float
    time_lookup_us: float
    key_misses: int
    key_lookup_faults: float
    """Major page faults (reads from disk) per key lookup: above 0, the lookups ran on a
    store partly out of the page cache, and their figure says as much about the disk."""
    time_lookup_faults: float


FIGURES = ("append_us", "read_us", "key_lookup_us", "time_lookup_us")


def run_scale(opts: ScaleOptions) -> list[ScalePoint]:
    points = []
    with scratch(opts.data, "evq-bench-scale-") as root:
        for n in sorted(opts.sizes):
            with progress(opts.progress, f"{opts.backend} {n:,}", 2 * n) as bar:
                points.append(_one_size(opts, n, root / f"n-{n}", bar))
    return points


def _one_size(opts: ScaleOptions, n: int, path: Path, bar: tqdm[Any]) -> ScalePoint:
    workload = Workload(n, opts.size)
    body = bytes(opts.size)
    born = time.time_ns() // 1_000_000
    append_s = 0.0
    with registry.open_log(opts.backend, path, opts.store_config()) as store:
        settle()  # a fresh store may still be creating and pre-faulting files
        for start in range(0, n, CHUNK):
            records = [put_record(workload.message(i, body, born))
                       for i in range(start, min(n, start + CHUNK))]
            t0 = time.perf_counter()
            for j in range(0, len(records), opts.batch):
                store.append(records[j:j + opts.batch])
            append_s += time.perf_counter() - t0
            bar.update(len(records))
        count, read_s = read_all(store, bar)
        if count != n:
            raise BenchError(f"{opts.backend}: read {count} of {n} messages back")
        (misses, key_s), key_faults = _faulting(lambda: lookup_keys(store, workload,
                                                                    opts.lookups))
        time_s, time_faults = _faulting(lambda: time_lookups(store, opts.lookups))
    shutil.rmtree(path)
    return ScalePoint(n, append_s / n * 1e6, read_s / n * 1e6, key_s / opts.lookups * 1e6,
                      time_s / opts.lookups * 1e6, misses, key_faults / opts.lookups,
                      time_faults / opts.lookups)


def _faulting(run: Callable[[], T]) -> tuple[T, int]:
    """``run()`` and the major page faults this process took meanwhile."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    out = run()
    return out, resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before


def ratios(points: list[ScalePoint]) -> dict[str, list[float]]:
    """Each figure at each size over the same figure at the smallest size."""
    first = points[0]
    return {f: [getattr(p, f) / max(getattr(first, f), 1e-12) for p in points]
            for f in FIGURES}


def as_dict(opts: ScaleOptions, points: list[ScalePoint]) -> dict[str, Any]:
    return {"backend": opts.backend, "size": opts.size, "batch": opts.batch,
            "points": [attrs.asdict(p) for p in points], "ratios": ratios(points)}


def format_report(opts: ScaleOptions, points: list[ScalePoint]) -> str:
    rel = ratios(points)
    lines = [f"per-message cost by store size, {opts.backend}, {opts.size}-byte bodies "
             f"(ratio to {points[0].messages:,} messages in brackets; flat is 1.00)",
             f"{'messages':>12} {'append us':>16} {'read us':>16} {'key lookup us':>18} "
             f"{'time lookup us':>18}"]
    for k, p in enumerate(points):
        cells = [f"{getattr(p, f):8.2f} ({rel[f][k]:4.2f})" for f in FIGURES]
        lines.append(f"{p.messages:>12,} {cells[0]:>16} {cells[1]:>16} {cells[2]:>18} "
                     f"{cells[3]:>18}")
    if any(p.key_lookup_faults or p.time_lookup_faults for p in points):
        lines.append("page faults read from disk per lookup (key, time): " + ", ".join(
            f"{p.key_lookup_faults:.2f}/{p.time_lookup_faults:.2f}" for p in points))
    if any(p.key_misses for p in points):
        lines.append(f"key lookups that missed: {[p.key_misses for p in points]}")
    return "\n".join(lines) + "\n"
