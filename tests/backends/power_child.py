"""The program test_power_loss.py runs under strace: append under SYNC_FLUSH, acknowledge.

Run from the repository root::

    python -m tests.backends.power_child BACKEND ROOT COUNT

It opens a fresh store at ROOT (which must not exist yet, so that every directory and file of
the store is created during the run) with :data:`CONFIG`: SYNC_FLUSH and files small enough
that COUNT messages roll over several CommitLog segments, ConsumeQueue files and IndexFiles.
It appends one message a batch across :data:`TOPICS` x :data:`QUEUES` and, once
``wait_durable`` returned True for it, writes one line naming the file that holds it::

    ACK <path relative to ROOT> [<first byte> <end byte>]

The byte range, within that file, is given where the record sits at a place the store chose
(a CommitLog segment); a key-value backend's record lives somewhere in its library's data file
(LMDB's ``data.mdb``, RocksDB's current write-ahead log), named without a range.  Before the
messages it acknowledges the abort marker (once the store is open, a crash must be recovered
as one) and one metadata row it committed through the SQL metadata store in ``ROOT/config``
(``config/meta.sqlite``).  After the messages it calls ``flush()`` and, on the mmap store,
acknowledges every file of the store but the lock and a file the allocator is still building
(under a temporary name): a flush promises the projections (ConsumeQueues, index files,
checkpoint) are on disk as well.

Every ACK line is a write(2) of its own on stdout, so the acknowledgement appears in the trace
in order with the sync calls that made it true (see tests/backends/sync_trace.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from evq import logs
from evq.backends.config import StoreConfig
from evq.backends.mmapfile.mapped_file import BUILDING_SUFFIX, segment_name
from evq.backends.registry import open_log
from evq.domain.log import AppendResult, FlushMode, PutStatus
from evq.domain.message import new_message
from evq.domain.metadata import Change, Table, Watermark
from evq.domain.record import put_record
from evq.meta.sql import SqlMetadataStore

TOPICS = ("PowerA", "PowerB", "%RETRY%PowerGroup")
QUEUES = 2
DURABLE_TIMEOUT_S = 30.0

CONFIG = StoreConfig(
    flush=FlushMode.SYNC_FLUSH,
    commitlog_segment_size=64 * 1024,
    consume_queue_entries=16,
    index_slots=97,
    index_entries=100,
)

SEGMENT = CONFIG.commitlog_segment_size
UNACKNOWLEDGED = ("lock", "config")
"""Files not acknowledged after the final flush: the lock holds nothing (a lost one is created
again), the metadata database is acknowledged on its own."""


def _holder(backend: str, root: Path, result: AppendResult) -> str:
    """The file (and byte range in it) that holds an appended record."""
    if backend == "mmap":
        start = result.physical_offset % SEGMENT
        name = segment_name(result.physical_offset - start)
        return f"commitlog/{name} {start} {start + result.size}"
    if backend == "rocks":  # the write-ahead log RocksDB writes now: the newest
        return f"rocks/{max((root / 'rocks').glob('*.log')).name}"
    return "lmdb/data.mdb"


def _ack(line: str) -> None:
    os.write(1, f"ACK {line}\n".encode())


def _fail(why: str) -> None:
    os.write(2, f"CHILD-FAIL {why}\n".encode())
    os._exit(3)


def main(argv: list[str]) -> int:
    backend, root, count = argv[0], Path(argv[1]), int(argv[2])
    logs.configure("info", json=True)  # to stderr: stdout carries the ACK lines only
    if root.exists():
        _fail(f"{root} exists: the run must create the whole store")
    log = open_log(backend, root, CONFIG, background=False)
    _ack("abort")  # the promise that a crash from now on is recovered as one
    meta = SqlMetadataStore.in_dir(root / "config")
    meta.commit([Change(Table.TOPICS, ("PowerA",), {"topicName": "PowerA"})], Watermark(1, 0))
    _ack("config/meta.sqlite")
    for i in range(count):
        body = (f"power-{i}|".encode() * 400)[: 300 + (i * 797) % 2500]
        m = new_message(TOPICS[i % len(TOPICS)], body, keys=[f"k{i}"], compress_over=None)
        m.queue_id = i % QUEUES
        [result] = log.append([put_record(m)])
        if result.status is not PutStatus.PUT_OK:
            _fail(f"append returned {result.status}")
        if not log.wait_durable(result.end_offset, DURABLE_TIMEOUT_S):
            _fail(f"wait_durable({result.end_offset}) timed out")
        _ack(_holder(backend, root, result))
    log.flush()
    if backend == "mmap":  # its files are all evq's own; a key-value store's are its library's
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root)
            # A file still being built is not part of the store yet (the allocator's).
            if rel.parts[0] not in UNACKNOWLEDGED and not path.name.endswith(BUILDING_SUFFIX):
                _ack(str(rel))
    meta.close()
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
