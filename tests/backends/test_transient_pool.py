"""The mmap store with RocketMQ's transient store pool: what readers see, buffers, the rule.

The conformance suite runs on ``mmap-pool`` too (each append committed at once); these tests
look at what lies between an append and its commit: readers (reads, bounds, lookups,
replication, arrivals) see only bytes that are in the segment file, a read stops before an
uncommitted record rather than skipping it, buffers come and go with the write segment, a
pool of one still takes any number of segments, and SYNC_FLUSH runs without the pool.
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import evq
from evq.backends.config import StoreConfig
from evq.backends.mmapfile import MmapMessageLog
from evq.backends.mmapfile.mapped_file import ALLOCATION_CHUNK, WARM_CHUNK, segment_name
from evq.backends.mmapfile.transient_pool import TransientStorePool
from evq.domain import topics as tp
from evq.domain.broker_config import BrokerConfig
from evq.domain.log import Dispatched, FlushMode, GetStatus, PutStatus
from evq.domain.record import put_record
from tests import waiting
from tests.backends.test_store import message, sized
from tests.conftest import SMALL
from tests.processes import python_env

SEG = SMALL.commitlog_segment_size
NEVER_MS = 3_600_000  # a commit interval no test outlives: only flush() and close() commit
DEADLINE_S = 10.0
wait_for = functools.partial(waiting.wait_for, within=DEADLINE_S, every=0.005)


def open_pool(root: Path, **overrides: object) -> MmapMessageLog:
    settings: dict[str, object] = {
        "transient_store_pool_enable": True, "commit_interval_ms": NEVER_MS,
        "commit_thorough_interval_ms": NEVER_MS,
    } | overrides
    config = StoreConfig(**{**_small(), **settings})  # type: ignore[arg-type]
    return MmapMessageLog.open(root, config, background=False)


def _small() -> dict[str, object]:
    return {"commitlog_segment_size": SEG, "consume_queue_entries": SMALL.consume_queue_entries,
            "index_slots": SMALL.index_slots, "index_entries": SMALL.index_entries,
            "warm_segments": False}


def append_n(log: MmapMessageLog, n: int, size: int = 1000, **kw: object) -> list[int]:
    results = log.append([put_record(sized(size, **kw)) for _ in range(n)])  # type: ignore[arg-type]
    assert [r.status for r in results] == [PutStatus.PUT_OK] * n
    return [r.physical_offset for r in results]


def file_bytes(root: Path, phys: int, size: int) -> bytes:
    """What the CommitLog segment file holds at ``phys``, read with pread, not the mapping."""
    start = phys - phys % SEG
    fd = os.open(root / "commitlog" / f"{start:020d}", os.O_RDONLY)
    try:
        return os.pread(fd, size, phys - start)
    finally:
        os.close(fd)


def test_appended_records_are_unseen_until_committed(tmp_path: Path) -> None:
    log = open_pool(tmp_path)
    try:
        offsets = append_n(log, 3)
        assert file_bytes(tmp_path, offsets[0], 1000) == bytes(1000)  # not in the file yet
        assert log.read("T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE  # as an empty queue
        assert log.bounds("T", 0) == (0, 0)
        assert log.lookup(offsets[0]) is None
        assert log.read_log(0, 1 << 20) == b""
        assert log.max_physical_offset == 0
        log.flush()
        got = log.read("T", 0, 0)
        assert got.status is GetStatus.FOUND and len(got.records) == 3
        assert log.bounds("T", 0) == (0, 3)
        assert log.max_physical_offset == offsets[-1] + 1000
        for phys, view in zip(offsets, got.records, strict=True):
            assert bytes(view) == file_bytes(tmp_path, phys, 1000)
    finally:
        log.close()


def test_a_new_subscriber_finds_what_was_appended_before_it_readable(tmp_path: Path) -> None:
    """Appends made while nobody listened build no reports, and with a pool their records
    become readable only once committed: subscribing commits them, so a listener that reads
    after subscribing and then waits for reports (the embedded ``subscribe``) misses none."""
    log = open_pool(tmp_path)
    try:
        append_n(log, 3)
        assert log.read("T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        reported: list[object] = []
        log.subscribe_dispatch(reported.extend)
        got = log.read("T", 0, 0)
        assert got.status is GetStatus.FOUND and got.queue_offsets == [0, 1, 2]
        assert reported == []  # appended before the subscription: read, not reported
    finally:
        log.close()


def test_queue_max_offsets_stop_at_the_committed_end(tmp_path: Path) -> None:
    """queues() (the spark source's and admin's list of queues with their max offsets) gives
    the figures bounds() gives: a max offset a pull can read up to, not the entries written
    ahead of their records' commit."""
    log = open_pool(tmp_path)
    try:
        append_n(log, 3)
        log.flush()
        append_n(log, 2)
        append_n(log, 4, topic="U")
        assert log.queues() == {("T", 0): 3, ("U", 0): 0}
        assert log.queues()[("T", 0)] == log.bounds("T", 0)[1]
        log.flush()
        assert log.queues() == {("T", 0): 5, ("U", 0): 4}
    finally:
        log.close()


def test_a_broker_applies_its_metadata_events_at_once(tmp_path: Path) -> None:
    """Metadata events are applied from the log right after they are appended: with the pool
    they are committed for it, or a topic created would appear only once something else
    happened to be written (a broker started with none registered with the name server)."""
    config = StoreConfig(**{**_small(), "transient_store_pool_enable": True,  # type: ignore[arg-type]
                            "commit_interval_ms": NEVER_MS,
                            "commit_thorough_interval_ms": NEVER_MS})
    with evq.Broker.open(tmp_path / "data", store_config=config,
                         broker_config=BrokerConfig(auto_create_topic_enable=True)) as b:
        assert b.core.log._pool is not None  # type: ignore[attr-defined]
        assert b.core.topic(tp.AUTO_CREATE_TOPIC) is not None
        b.create_topic("Orders", 2)
        assert b.core.topic("Orders") is not None


def test_a_read_stops_before_an_uncommitted_record_instead_of_skipping_it(
    tmp_path: Path,
) -> None:
    log = open_pool(tmp_path)
    try:
        append_n(log, 5)
        log.flush()
        append_n(log, 5)
        first = log.read("T", 0, 0, max_count=32)
        assert (first.status, len(first.records), first.next_offset) == (GetStatus.FOUND, 5, 5)
        assert log.read("T", 0, 5).status is GetStatus.NO_NEW_MESSAGE
        log.flush()
        rest = log.read("T", 0, 5, max_count=32)
        assert (len(rest.records), rest.next_offset) == (5, 10)
    finally:
        log.close()


def test_the_commit_service_commits_and_then_announces_arrivals(tmp_path: Path) -> None:
    """A subscriber (long polling) hears of records only once a reader can read them from
    the file: it reads them in its callback."""
    log = open_pool(tmp_path, commit_interval_ms=20, commit_thorough_interval_ms=20)
    seen: list[tuple[int, bytes, bytes]] = []
    heard = threading.Event()

    def on_dispatch(batch: Sequence[Dispatched]) -> None:
        for d in batch:
            view = log.lookup(d.physical_offset)
            seen.append((d.queue_offset, bytes(view) if view is not None else b"",
                         file_bytes(tmp_path, d.physical_offset, d.size)))
        heard.set()

    log.subscribe_dispatch(on_dispatch)
    try:
        append_n(log, 4)
        assert heard.wait(DEADLINE_S), "no arrival announced after the commit interval"
        wait_for("all four arrivals", lambda: len(seen) == 4)
        assert [qo for qo, _, _ in seen] == [0, 1, 2, 3]
        for _qo, view, on_disk in seen:
            assert view and view == on_disk
    finally:
        log.close()


def test_roll_over_hands_the_buffer_back_once_the_full_segment_is_committed(
    tmp_path: Path,
) -> None:
    log = open_pool(tmp_path, transient_store_pool_size=3)
    pool = log._pool
    assert pool is not None
    try:
        assert pool.available == 2  # the write segment holds one
        per_segment = SEG // 1000
        append_n(log, per_segment + 5)  # into the second segment
        assert pool.available == 1  # the full first segment waits for its commit
        log.flush()
        assert pool.available == 2
        total, offset = 0, 0
        while offset < per_segment + 5:
            r = log.read("T", 0, offset, max_count=1000, max_bytes=1 << 30)
            total += len(r.records)
            offset = r.next_offset
        assert total == per_segment + 5
    finally:
        log.close()


def test_a_pool_of_one_takes_many_segments_in_one_batch(tmp_path: Path) -> None:
    """Every buffer waiting for its segment's commit: the writer commits those itself and
    takes the freed buffer (bounded work, nothing refused, order kept)."""
    log = open_pool(tmp_path, transient_store_pool_size=1)
    try:
        n = 3 * SEG // 1000
        offsets = append_n(log, n)
        last_start = offsets[-1] - offsets[-1] % SEG
        assert last_start >= 2 * SEG
        assert log.max_physical_offset >= last_start  # earlier segments committed
        log.flush()
        assert log.bounds("T", 0) == (0, n)
    finally:
        log.close()
    reopened = open_pool(tmp_path, transient_store_pool_size=1)
    try:
        assert reopened.bounds("T", 0) == (0, n)
    finally:
        reopened.close()


def test_close_commits_and_flushes_everything(tmp_path: Path) -> None:
    log = open_pool(tmp_path)
    append_n(log, 10)
    log.close()
    reopened = open_pool(tmp_path)
    try:
        assert reopened.bounds("T", 0) == (0, 10)
        assert len(reopened.read("T", 0, 0).records) == 10
    finally:
        reopened.close()


def test_sync_flush_runs_without_the_pool_and_says_so(tmp_path: Path) -> None:
    with capture_logs() as logs:
        log = open_pool(tmp_path, flush=FlushMode.SYNC_FLUSH)
    try:
        ignored = [e for e in logs if e["event"] == "transient_store_pool_ignored"]
        assert len(ignored) == 1 and "SYNC_FLUSH" in ignored[0]["reason"]
        assert log._pool is None
        append_n(log, 2)
        assert log.bounds("T", 0) == (0, 2)  # the mapped-write path: readable at once
    finally:
        log.close()


_UNLOCKABLE_CHILD = """
import json, resource
from structlog.testing import capture_logs
from evq.backends.mmapfile.transient_pool import TransientStorePool
_soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))
with capture_logs() as logs:
    pool = TransientStorePool(3, 65536)
buf = pool.borrow()
buf[:4] = b"evq!"
pool.give_back(buf)
pool.close()
print(json.dumps({"locked": pool.locked, "events": [e["event"] for e in logs]}))
"""


def test_a_pool_that_cannot_be_locked_warns_once_and_works() -> None:
    """RLIMIT_MEMLOCK of 0 in a child process (without CAP_IPC_LOCK when run as root, which
    would lock past the limit): one warning, unlocked buffers that work."""
    command = [sys.executable, "-c", _UNLOCKABLE_CHILD]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root locks memory past RLIMIT_MEMLOCK and setpriv is not installed "
                        "to drop CAP_IPC_LOCK")
        command = ["setpriv", "--bounding-set", "-ipc_lock", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=python_env(),
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"locked": False, "events": ["transient_store_pool_unlocked"]}


def test_a_pool_within_the_memlock_limit_is_locked() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard != resource.RLIM_INFINITY and hard < 4 * SEG:
        pytest.skip(f"RLIMIT_MEMLOCK hard limit {hard} is below two {SEG}-byte buffers")
    pool = TransientStorePool(2, SEG)
    try:
        assert pool.locked
        assert pool.available == 2
    finally:
        pool.close()


def test_keys_are_found_only_once_committed(tmp_path: Path) -> None:
    log = open_pool(tmp_path)
    try:
        log.append([put_record(message("T", b"body", keys="order-1"))])
        assert log.query_keys("T", "order-1", 10, 0, 2**62).records == []
        log.flush()
        assert len(log.query_keys("T", "order-1", 10, 0, 2**62).records) == 1
    finally:
        log.close()



def resident_pages(path: Path, start: int, end: int) -> int:
    """How many pages of ``path``'s ``[start, end)`` are in the page cache: mincore on a
    fresh mapping, which faults nothing in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, end) as mm:
            vec = ctypes.create_string_buffer((end - start) // mmap.PAGESIZE)
            anchor = ctypes.c_char.from_buffer(mm)
            try:
                rc = libc.mincore(ctypes.addressof(anchor) + start, end - start, vec)
            finally:
                del anchor
            assert rc == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw)
    finally:
        os.close(fd)


@pytest.mark.parametrize("pool", [False, True], ids=["mapped-write", "pool"])
def test_the_allocator_warms_no_segment_mapping_the_pool_replaces(tmp_path: Path,
                                                                 pool: bool) -> None:
    """The next segment is built ahead either way (and its first chunk's blocks allocated:
    disk-full safety); only the mapped write has its first pages faulted in, for with the
    pool nothing writes through the mapping."""
    seg = 2 * WARM_CHUNK
    log = open_pool(tmp_path, transient_store_pool_enable=pool, transient_store_pool_size=2,
                    commitlog_segment_size=seg, warm_segments=True)
    try:
        append_n(log, 1)
        nxt = tmp_path / "commitlog" / segment_name(seg)
        allocator = log._allocator
        wait_for("the next segment built ahead",
                 lambda: nxt in allocator._ready)
        assert os.stat(nxt).st_blocks * 512 >= ALLOCATION_CHUNK
        warmed = resident_pages(nxt, ALLOCATION_CHUNK, WARM_CHUNK)
        if pool:
            assert warmed == 0
        else:
            assert warmed == (WARM_CHUNK - ALLOCATION_CHUNK) // mmap.PAGESIZE
    finally:
        log.close()
