"""The program test_crash.py kills: append, wait until durable, acknowledge, until SIGKILL.

Run from the repository root::

    python -m tests.backends.crash_child BACKEND PATH ROUND SEED [pool]

It opens the store at PATH with :data:`CONFIG` (SYNC_FLUSH, 64 KiB log segments so a round
rolls over several of them), prints ``READY`` once the store is open, then appends small
batches from :data:`WRITERS` threads across :data:`TOPICS` x :data:`QUEUES`, plus one thread
that appends without waiting (its messages are never acknowledged; it keeps the process busy
appending, so the kill often tears a record).  Only after ``wait_durable`` returned True for a
batch does a writer print one line per message of it::

    ACK <key> <topic> <queue> <queue offset> <physical offset> <msgId> <UNIQ_KEY>

so every ACK line is a promise the store made: that message survives any crash from then on.
With ``pool`` the store runs :data:`POOL_CONFIG` (ASYNC_FLUSH and the transient store pool,
committing every 20 ms) and a writer acknowledges a batch once it is committed (readers see
it, :attr:`max_physical_offset` reaches it) instead of durable: what the pool promises a
killed process keeps.
Logs go to stderr as JSON (stdout carries the protocol only).  The bodies are a function of the
key (:func:`body_for`), so the test checks them without being told.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import zlib

import attrs

from evq.backends.config import StoreConfig
from evq.domain.log import FlushMode, PutStatus
from evq.domain.message import Prop, new_message
from evq.domain.record import put_record

TOPICS = ("CrashA", "CrashB", "CrashC")
QUEUES = 4
WRITERS = 2
BORN_HOST = ("10.0.0.7", 40404)

CONFIG = StoreConfig(
    flush=FlushMode.SYNC_FLUSH,
    commitlog_segment_size=64 * 1024,
    consume_queue_entries=64,
    index_slots=97,
    index_entries=200,
    warm_segments=False,
)
"""The store as the child runs it; the test reopens it with the same sizes."""

POOL_CONFIG = attrs.evolve(
    CONFIG, flush=FlushMode.ASYNC_FLUSH, transient_store_pool_enable=True,
    commit_interval_ms=20, commit_thorough_interval_ms=20,
)
COMMIT_TIMEOUT_S = 10.0

SIZES = {
    "commitlog_segment_size": CONFIG.commitlog_segment_size,
    "consume_queue_entries": CONFIG.consume_queue_entries,
    "index_slots": CONFIG.index_slots,
    "index_entries": CONFIG.index_entries,
}


def body_for(key: str) -> bytes:
    """The body stored under ``key``: mostly 30..730 bytes, now and then up to ~20 KiB (so a
    record sometimes leaves a large BLANK at a segment end)."""
    h = zlib.crc32(key.encode())
    n = 30 + h % 700 if h % 40 else 6000 + h % 14000
    head = f"crash-body|{key}|".encode()
    fill = (key.encode() + b".") * (n // (len(key) + 1) + 1)
    return head + fill[:n]


def uniq_key_for(key: str) -> str:
    return "U" + key.replace("-", "_").upper()


def _writer(
    log, round_no: int, seed: int, thread_no: int, out_lock: threading.Lock | None
) -> None:
    """Append batches; with ``out_lock`` wait for durability and acknowledge each message,
    without it append only (never acknowledged: the kill often lands mid-append)."""
    rng = random.Random(f"{seed}/{round_no}/{thread_no}")
    seq = 0
    while True:
        records, keys = [], []
        for _ in range(rng.randint(1, 6)):
            key = f"r{round_no}t{thread_no}-{seq}" if out_lock else f"r{round_no}n-{seq}"
            seq += 1
            topic = rng.choice(TOPICS)
            m = new_message(topic, body_for(key), tags=f"tag{seq % 3}", keys=[key],
                            properties={Prop.UNIQ_KEY: uniq_key_for(key)}, compress_over=None)
            m.queue_id = rng.randrange(QUEUES)
            m.born_timestamp = time.time_ns() // 1_000_000
            m.born_host = BORN_HOST
            records.append(put_record(m))
            keys.append(key)
        results = log.append(records)
        for r in results:
            if r.status is not PutStatus.PUT_OK:
                sys.stderr.write(f"CHILD-FAIL append returned {r.status}\n")
                sys.stderr.flush()
                os._exit(3)
        if out_lock is None:
            time.sleep(0.002)
            continue
        end = max(r.end_offset for r in results)
        if not _wait_acknowledgeable(log, end):
            sys.stderr.write(f"CHILD-FAIL waiting for {end} to be durable or committed timed "
                             f"out\n")
            sys.stderr.flush()
            os._exit(4)
        with out_lock:
            for key, rec, r in zip(keys, records, results, strict=True):
                sys.stdout.write(
                    f"ACK {key} {rec.topic} {rec.queue_id} {r.queue_offset} "
                    f"{r.physical_offset} {r.msg_id} {uniq_key_for(key)}\n"
                )
                sys.stdout.flush()


def _wait_acknowledgeable(log, end: int) -> bool:
    """Durable up to ``end`` (SYNC_FLUSH), or with the pool committed up to it."""
    if log.config.flush is FlushMode.SYNC_FLUSH:
        return bool(log.wait_durable(end, COMMIT_TIMEOUT_S))
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    while log.max_physical_offset < end:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def main(argv: list[str]) -> int:
    backend, path, round_no, seed = argv[0], argv[1], int(argv[2]), int(argv[3])
    pool = argv[4:] == ["pool"]
    from evq import logs
    from evq.backends.registry import open_log

    logs.configure("info", json=True)  # to stderr: stdout is the ACK protocol
    log = open_log(backend, path, POOL_CONFIG if pool else CONFIG, background=False)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    out_lock = threading.Lock()
    threads = [
        threading.Thread(target=_writer, args=(log, round_no, seed, t, out_lock), daemon=True)
        for t in range(WRITERS)
    ]
    threads.append(threading.Thread(target=_writer, args=(log, round_no, seed, WRITERS, None),
                                    daemon=True))
    for t in threads:
        t.start()
    for t in threads:  # until SIGKILL; a writer only returns by os._exit on failure
        t.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
