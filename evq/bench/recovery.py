"""Recovery time after a crash, by log size: it must follow what was written since the last
checkpoint, not how big the log is.

For each size, a child process opens a fresh store (with its flusher and checkpoint running,
as a broker does), appends records until the log holds that many bytes, makes everything
durable (:meth:`~evq.domain.log.MessageLog.flush`: log, projections, checkpoint), appends a
fixed tail past that checkpoint, says where its log ends and waits to be SIGKILLed.  The
parent then times :func:`~evq.backends.registry.open_log` on what it left (abnormal
recovery) and checks the recovered end.  A store that rescans its whole log after a crash
shows a time that grows with the size; RocketMQ's rule (recheck from the segment holding the
checkpoint) keeps it flat: the ratio of the largest size's time to the smallest's is the
figure to watch.  The recovered store is then closed and opened again, timed too: the restart
after a clean shutdown, which re-checks the last three segments as RocketMQ's
``recoverNormally`` does (so it grows with the log up to three segments, then stays).

The records are one batch of ``batch`` encoded once and appended again and again (the same
bytes, so encoding costs nothing and a 10 GiB log takes about as long as the disk needs).

Run the child as ``python -m evq.bench.recovery --store DIR --bytes N ...``; the parent is
``evq bench recovery``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from evq import logs
from evq.backends import registry
from evq.backends.config import StoreConfig
from evq.bench.scaffold import check_backend, scratch, store_config
from evq.domain.message import Message, new_message
from evq.domain.record import put_record

GIB = 1024**3
TOPIC = "RecoveryBench"
QUEUES = 8


class RecoveryBenchError(Exception):
    """A run that did not measure what it should (a child died, an end not recovered)."""


@attrs.frozen(slots=True, kw_only=True)
class RecoveryOptions:
    backend: str = "mmap"
    sizes: tuple[int, ...] = (GIB, 10 * GIB)
    """Log sizes in bytes, each its own store."""
    tail: int = 64 * 1024 * 1024
    """Bytes appended after the checkpoint: what recovery must re-read."""
    size: int = 1024
    """Body bytes of each record."""
    batch: int = 32
    segment_size: int | None = None
    data: Path | None = None
    """Where the scratch stores go (the system's temp dir if None)."""

    def __attrs_post_init__(self) -> None:
        check_backend(self.backend)
        if not self.sizes or min(self.sizes) <= 0 or self.tail < 0 or self.size <= 0:
            raise ValueError("sizes must be positive, the tail and record size non-negative")


@attrs.frozen(slots=True)
class RecoveryFigure:
    log_bytes: int
    seconds: float
    """The open after the SIGKILL."""
    clean_seconds: float
    """The open after that store was closed again (a clean shutdown)."""


def run_recovery_bench(opts: RecoveryOptions) -> list[RecoveryFigure]:
    """One crash and one timed reopen per size, smallest first."""
    figures = []
    with scratch(opts.data, "evq-bench-recovery-") as root:
        # The first open in a process pays for imports and caches: not recovery's cost.
        registry.open_log(opts.backend, root / "warm-up", _config(opts),
                          background=False).close()
        for size in sorted(opts.sizes):
            store = root / f"log-{size}"
            end = _crash_child(opts, store, size)
            seconds = _timed_open(opts, store, end, "recovery after the SIGKILL")
            clean = _timed_open(opts, store, end, "the reopen after a clean shutdown")
            figures.append(RecoveryFigure(end, seconds, clean))
    return figures


def as_dict(opts: RecoveryOptions, figures: list[RecoveryFigure]) -> dict[str, Any]:
    return {"backend": opts.backend, "tail_bytes": opts.tail, "record_size": opts.size,
            "runs": [attrs.asdict(f) for f in figures],
            "ratio_largest_to_smallest": figures[-1].seconds / max(figures[0].seconds, 1e-9)}


def format_report(opts: RecoveryOptions, figures: list[RecoveryFigure]) -> str:
    lines = [f"recovery after SIGKILL, {opts.backend}, {opts.tail / 2**20:g} MiB written "
             "after the last checkpoint:"]
    lines += [f"  log {f.log_bytes / 2**20:10,.0f} MiB: {f.seconds:7.3f} s "
              f"(reopen after a clean shutdown: {f.clean_seconds:.3f} s)" for f in figures]
    lines.append(f"  largest / smallest: {as_dict(opts, figures)['ratio_largest_to_smallest']:.2f}"
                 " (flat is 1.00)")
    return "\n".join(lines) + "\n"


def _timed_open(opts: RecoveryOptions, store: Path, end: int, what: str) -> float:
    """Seconds to open the store at ``store``, which must find its log ending at ``end``;
    the store is closed (cleanly) after."""
    t0 = time.perf_counter()
    log = registry.open_log(opts.backend, store, _config(opts), background=False)
    seconds = time.perf_counter() - t0
    try:
        if log.max_physical_offset != end:
            raise RecoveryBenchError(f"{what} found the log end at {log.max_physical_offset}, "
                                     f"the child wrote {end}")
    finally:
        log.close()
    return seconds


def _config(opts: RecoveryOptions) -> StoreConfig:
    return store_config(opts.segment_size)


def _crash_child(opts: RecoveryOptions, store: Path, size: int) -> int:
    cmd = [sys.executable, "-m", "evq.bench.recovery", "--backend", opts.backend,
           "--store", str(store), "--bytes", str(size), "--tail", str(opts.tail),
           "--size", str(opts.size), "--batch", str(opts.batch)]
    if opts.segment_size is not None:
        cmd += ["--segment-size", str(opts.segment_size)]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        assert child.stdout is not None
        end = None
        for line in child.stdout:
            word, _, value = line.strip().partition(" ")
            if word == "end":
                end = int(value)
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    if end is None:
        raise RecoveryBenchError(f"the crash child exited ({child.returncode}) before its end")
    return end


def _message(i: int, size: int) -> Message:
    msg = new_message(TOPIC, os.urandom(size), keys=f"k{i}", compress_over=None)
    msg.queue_id = i % QUEUES
    return msg


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m evq.bench.recovery")
    p.add_argument("--backend", required=True)
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--tail", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--segment-size", type=int, default=None)
    args = p.parse_args(argv)
    logs.configure("warning")
    opts = RecoveryOptions(backend=args.backend, sizes=(args.bytes,), tail=args.tail,
                           size=args.size, batch=args.batch, segment_size=args.segment_size)
    batch = [put_record(_message(i, args.size)) for i in range(args.batch)]
    store = registry.open_log(args.backend, args.store, _config(opts), background=True)
    while store.max_physical_offset < args.bytes:
        store.append(batch)
    store.flush()  # log, projections and the checkpoint cover everything so far
    target = store.max_physical_offset + args.tail
    while store.max_physical_offset < target:
        store.append(batch)
    print(f"end {store.max_physical_offset}", flush=True)
    sys.stdin.read()  # until killed, or until the parent is gone
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
