"""The program test_index_write_back.py kills: keyed appends around one explicit flush.

Run from the repository root::

    python -m tests.backends.index_child PATH FLUSH_INDEX_INTERVAL_MS

It opens an mmap store at PATH (ASYNC_FLUSH, a projection round every 20 ms, the index head
written back by those rounds at most every FLUSH_INDEX_INTERVAL_MS), appends :data:`EARLY`
keyed messages, flushes everything (log, projections, index, checkpoint), appends
:data:`LATE` more and prints ``WRITTEN <store time of the last late record>``; then it waits
to be SIGKILLed.  Keys are ``early-<i>`` and ``late-<i>`` (each message also has a UNIQ_KEY,
``U`` and the key), all on topic :data:`TOPIC`.
"""

from __future__ import annotations

import sys
import threading
import time

from evq.backends.config import StoreConfig
from evq.backends.mmapfile.store import MmapMessageLog
from evq.domain.log import FlushMode, PutStatus
from evq.domain.message import Prop, new_message
from evq.domain.record import put_record

TOPIC = "IndexWriteBack"
EARLY = 150
LATE = 150


def config(flush_index_interval_ms: int) -> StoreConfig:
    """The store as the child runs it; the test reopens it with the same sizes."""
    return StoreConfig(
        flush=FlushMode.ASYNC_FLUSH, commitlog_segment_size=64 * 1024, index_slots=97,
        index_entries=2_000, flush_consume_queue_interval_ms=20,
        flush_index_interval_ms=flush_index_interval_ms, warm_segments=False,
    )


def _append(log: MmapMessageLog, name: str, count: int) -> int:
    """Append ``count`` messages keyed ``<name>-<i>``; the last one's store time."""
    last = 0
    for i in range(count):
        key = f"{name}-{i}"
        m = new_message(TOPIC, key.encode(), keys=[key], properties={Prop.UNIQ_KEY: "U" + key})
        (result,) = log.append([put_record(m)])
        if result.status is not PutStatus.PUT_OK:
            raise SystemExit(f"CHILD-FAIL append returned {result.status}")
        last = result.store_timestamp
    return last


def main(argv: list[str]) -> int:
    path, interval = argv[0], int(argv[1])
    log = MmapMessageLog.open(path, config(interval))
    _append(log, "early", EARLY)
    log.flush()
    time.sleep(0.002)  # the late records' store times come after the flush's
    last = _append(log, "late", LATE)
    sys.stdout.write(f"WRITTEN {last}\n")
    sys.stdout.flush()
    threading.Event().wait()  # until SIGKILL
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
