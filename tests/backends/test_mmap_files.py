"""The mmap backend's building blocks on their own: msync and pre-faulting, the allocator's
warm-ahead chunks, the IndexFile's slots and chains, and the flusher's two threads."""

from __future__ import annotations

import mmap
import os
import resource
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.backends.config import StoreConfig
from evq.backends.flush import Flusher
from evq.backends.mmapfile.append_loop import NO_QUEUE_ENTRY
from evq.backends.mmapfile.appended import ILLEGAL, REFUSED, AppendedBatch
from evq.backends.mmapfile.consume_queue import ENTRY_SIZE, ConsumeQueue
from evq.backends.mmapfile.index_file import (
    COPY_CHUNKS,
    HEAD_CHUNK,
    HEADER,
    HEADER_SIZE,
    IndexFile,
    IndexService,
    index_file_name,
    take_runs,
)
from evq.backends.mmapfile.mapped_file import (
    ALLOCATION_CHUNK,
    WARM_AHEAD,
    WARM_CHUNK,
    Allocator,
    MappedFile,
    msync,
    prefault,
    segment_name,
)
from evq.backends.registry import open_log
from evq.domain import sysflag as sf
from evq.domain.broker import SendResult
from evq.domain.hashing import index_key_hash
from evq.domain.log import AppendedRecords, AppendResult, FlushMode, PutStatus
from evq.domain.message import new_message
from evq.domain.record import offset_msg_id, put_record
from tests.pagecache import dirty_pages, present_pages


def test_the_append_paths_one_bit_test_is_not_consumable() -> None:
    for sysflag in range(1 << 12):
        assert bool(sysflag & NO_QUEUE_ENTRY) == (
            sysflag & sf.TRANSACTION_MASK in sf.NOT_CONSUMABLE
        ), sysflag


# --- append results ------------------------------------------------------------------------------


_places = st.tuples(st.integers(0, 2**40), st.integers(91, 2**22), st.integers(0, 2**40))


@given(st.lists(st.one_of(st.sampled_from([ILLEGAL, REFUSED]), _places), max_size=6),
       st.integers(0, 2**41), st.sampled_from([b"\x7f\0\0\1\0\0\x2a\x9f", bytes(20)]))
def test_an_appended_batch_reads_as_the_list_of_its_results(
    places: list[tuple[int, int, int]], now: int, host: bytes
) -> None:
    expected = [
        AppendResult(PutStatus.MESSAGE_ILLEGAL) if p == ILLEGAL
        else AppendResult(PutStatus.SERVICE_NOT_AVAILABLE) if p == REFUSED
        else AppendResult(PutStatus.PUT_OK, *p, now, host)
        for p in places
    ]
    batch = AppendedBatch(places, now, host)
    assert len(batch) == len(expected)
    assert list(batch) == expected and batch == expected and expected == batch
    assert [batch[i] for i in range(-len(batch), len(batch))] == expected + expected
    assert batch[1:] == expected[1:] and batch[::-1] == expected[::-1]
    assert batch + batch == expected * 2
    assert list(expected) + batch == expected * 2  # a list on the left: __radd__
    assert repr(batch) == repr(expected)
    if expected:
        assert batch[-1].end_offset == expected[-1].end_offset
    with pytest.raises(IndexError):
        batch[len(batch)]


@st.composite
def _appended_places(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Places as one append makes them: stored records one after another (a segment's end
    may skip ahead), refused ones anywhere among them."""
    places, at = [], draw(st.integers(0, 2**40))
    for refused in draw(st.lists(st.sampled_from([None, ILLEGAL, REFUSED]), max_size=6)):
        if refused is not None:
            places.append(refused)
            continue
        size = draw(st.integers(91, 2**22))
        places.append((at, size, draw(st.integers(0, 2**40))))
        at += size + draw(st.sampled_from([0, 0, 1, 2**20]))
    return places


@given(_appended_places(), st.sampled_from([b"\x7f\0\0\1\0\0\x2a\x9f", bytes(20)]))
def test_an_appended_batch_sums_up_as_its_results_do(
    places: list[tuple[int, int, int]], host: bytes
) -> None:
    """A send's answer reads status, end, size and msgIds from the places, as it would
    from the results."""
    batch = AppendedBatch(places, 1, host)
    results = list(batch)
    assert batch.status() == next(
        (r.status for r in results if r.status is not PutStatus.PUT_OK), PutStatus.PUT_OK)
    assert batch.end_offset() == max([r.end_offset for r in results], default=0)
    assert batch.size() == sum(r.size for r in results)
    assert batch.msg_ids() == ",".join(r.msg_id for r in results)
    # The summary a send's answer reads in one call, and the same read off a list of results
    # (what another backend returns).
    summary = batch.summary()
    assert summary == (
        results[0].physical_offset if results else -1, results[0].queue_offset if results else -1,
        batch.end_offset(), batch.msg_ids(), len(results), batch.size())
    assert SendResult(batch.status(), "T", 0, results).summary() == summary
    # A single stored record's place and host, as the send lane reads them.
    single = batch.single()
    if len(results) == 1 and results[0].status is PutStatus.PUT_OK:
        assert single is not None
        (physical, size, queue_offset), raw = single
        r = results[0]
        assert (physical, size, queue_offset) == (r.physical_offset, r.size, r.queue_offset)
        assert offset_msg_id(raw, physical) == r.msg_id
    else:
        assert single is None



def test_an_append_from_a_dispatch_subscriber_leaves_the_outer_append_its_results(
    tmp_path: Path,
) -> None:
    """The store keeps one append run and its put lock is reentrant: a subscriber that
    appends while the store notifies it must not hand the outer append its own results."""
    log = open_log("mmap", tmp_path / "store", StoreConfig(), background=False)
    inner: list[AppendedRecords] = []
    calls = []

    def append_once(_batch: object) -> None:
        calls.append(None)
        if len(calls) == 1:  # the inner append notifies too: once is enough
            inner.append(log.append([put_record(new_message("T", b"inner"))]))

    try:
        log.subscribe_dispatch(append_once)
        outer = log.append([put_record(new_message("T", b"outer %d" % i)) for i in range(2)])
        assert [r.queue_offset for r in outer] == [0, 1]
        assert [r.queue_offset for r in inner[0]] == [2]
        assert outer[1].end_offset == inner[0][0].physical_offset
    finally:
        log.close()

# --- msync and pre-faulting ----------------------------------------------------------------------


def _mapped(tmp_path: Path, size: int) -> MappedFile:
    return MappedFile(tmp_path / "seg", 0, size, create=True)


def test_msync_writes_a_range_and_refuses_a_closed_mapping(tmp_path: Path) -> None:
    mf = _mapped(tmp_path, 4 * mmap.PAGESIZE)
    mf.mm[mmap.PAGESIZE : mmap.PAGESIZE + 5] = b"hello"
    msync(mf.mm, mmap.PAGESIZE, mmap.PAGESIZE)
    with (tmp_path / "seg").open("rb") as f:  # the file, not the mapping, holds the bytes
        f.seek(mmap.PAGESIZE)
        assert f.read(5) == b"hello"
    mf.close()
    with pytest.raises(ValueError, match="closed"):
        msync(mf.mm, 0, mmap.PAGESIZE)


def test_msync_outside_the_mapping_is_an_os_error(tmp_path: Path) -> None:
    mf = _mapped(tmp_path, mmap.PAGESIZE)
    try:
        with pytest.raises(OSError):
            msync(mf.mm, 64 * 1024 * 1024 * 1024, mmap.PAGESIZE)
    finally:
        mf.close()


def _faults_writing(mm: mmap.mmap, start: int, end: int) -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for pos in range(start, end, mmap.PAGESIZE):
        mm[pos] = 1
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_prefault_maps_a_range_writable_so_writes_there_do_not_fault(tmp_path: Path) -> None:
    pages = 64
    mf = _mapped(tmp_path, 2 * pages * mmap.PAGESIZE)
    try:
        half = pages * mmap.PAGESIZE
        if not prefault(mf.mm, half - 100, half + 100):  # an unaligned start is rounded down
            pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
        # (Not exactly zero: writeback under memory pressure may clean a page meanwhile.)
        assert _faults_writing(mf.mm, half, 2 * half) <= pages // 10
        assert _faults_writing(mf.mm, 0, half) >= pages // 2  # untouched pages do fault
    finally:
        mf.close()


def test_zero_from_clears_data_past_a_position_without_faulting_in_the_holes(
    tmp_path: Path,
) -> None:
    size = 64 * 1024 * 1024
    mf = MappedFile(tmp_path / "seg", 0, size, create=True)
    try:
        mf.mm[100:110] = b"k" * 10  # kept: before the cut
        mf.mm[5000:5020] = b"x" * 20
        mf.mm[40_000_000:40_000_003] = b"end"
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        dropped = mf.zero_from(4096)
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
        assert dropped == 40_000_003 - 4096  # up to the last byte that held data
        assert faults < 1000  # the 16,384 pages of holes were never read
        assert mf.mm[100:110] == b"k" * 10
        assert mf.mm.find(b"x") == -1 and mf.mm.find(b"end") == -1
        assert mf.zero_from(4096) == 0
    finally:
        mf.close()


def test_a_truncation_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """The zeros over cut records are synced: after a power cut, recovery would otherwise
    scan on from the new records into the cut ones (their offsets match their places), and
    an HA slave would bring back the history it truncated to follow its master."""
    if not Path("/proc/kpageflags").exists():
        pytest.skip("the kernel does not expose /proc/kpageflags")
    # Not warmed: the allocator's pre-faulting writes pages too (MADV_POPULATE_WRITE dirties
    # the clean pages it touches), at moments of its own.
    log = open_log("mmap", tmp_path / "store", StoreConfig(warm_segments=False),
                   background=False)
    try:
        results = [log.append([put_record(new_message("T", b"r%d" % i * 300))])[0]
                   for i in range(40)]
        log.flush()
        segment = tmp_path / "store" / "commitlog" / segment_name(0)
        end = results[-1].end_offset
        assert dirty_pages(segment, 0, end) == 0
        cut = results[10].physical_offset
        log.truncate(cut)
        assert dirty_pages(segment, cut, end) == 0
        with segment.open("rb") as f:
            f.seek(cut)
            assert f.read(end - cut) == bytes(end - cut)
    finally:
        log.close()


# --- the allocator -----------------------------------------------------------------------------


def test_warm_ahead_asks_again_at_each_chunk_boundary_and_at_the_segment_end(
    tmp_path: Path,
) -> None:
    allocator = Allocator(warm=False)  # the offsets are the point here, not the faulting
    try:
        size = 3 * WARM_CHUNK + WARM_CHUNK // 2
        start = 10 * size
        mf = MappedFile(tmp_path / "seg", start, size, create=True)
        assert allocator.warm_ahead(mf, 0) == start + WARM_CHUNK
        assert allocator.warm_ahead(mf, WARM_CHUNK - 1) == start + WARM_CHUNK
        assert allocator.warm_ahead(mf, WARM_CHUNK) == start + 2 * WARM_CHUNK
        assert allocator.warm_ahead(mf, 3 * WARM_CHUNK) == start + size  # the last, short one
        assert allocator.warm_ahead(mf, size) == start + size
        mf.close()
    finally:
        allocator.close()


def test_the_allocator_faults_in_the_chunks_ahead_of_the_writer(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / "00000000000000000000", 0, 3 * WARM_CHUNK, create=True)
    if not prefault(mf.mm, mmap.PAGESIZE):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    allocator = Allocator()
    try:
        allocator.warm_ahead(mf, WARM_CHUNK)
        # The thread warms before it builds, so once the next segment is built (take waits
        # for that) the chunks are warm.
        allocator.prefetch(mf)
        allocator.take(tmp_path / "00000000000012582912", mf.end, mf.size).destroy()
        pages = 2 * WARM_CHUNK // mmap.PAGESIZE
        assert _faults_writing(mf.mm, WARM_CHUNK, 3 * WARM_CHUNK) <= pages // 10
    finally:
        allocator.close()
        mf.close()


def test_the_allocator_keeps_tens_of_megabytes_warm_ahead_of_the_writer(tmp_path: Path) -> None:
    """The warming thread lags the writer (the GIL, a busy machine), so it works 32 MiB
    ahead, not one chunk: the chunk that far is faulted in (dirty, as a write leaves a page)
    while the writer is still in its first."""
    path = tmp_path / "00000000000000000000"
    lead = 32 * 1024 * 1024
    mf = MappedFile(path, 0, lead + 2 * WARM_CHUNK, create=True)
    if not prefault(mf.mm, mmap.PAGESIZE):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    allocator = Allocator()
    try:
        allocator.warm_ahead(mf, WARM_CHUNK // 2)
        allocator.prefetch(mf)  # warmed before built: once take has it, the chunks are warm
        allocator.take(tmp_path / segment_name(mf.end), mf.end, mf.size).destroy()
        pages = WARM_CHUNK // mmap.PAGESIZE
        # (Not all: writeback under memory pressure may clean a page meanwhile.)
        assert dirty_pages(path, lead, lead + WARM_CHUNK) >= pages // 2
        assert dirty_pages(path, (WARM_AHEAD + 1) * WARM_CHUNK, mf.size) == 0  # no further
    finally:
        allocator.close()
        mf.close()


def test_the_allocator_allocates_the_blocks_it_warms_so_the_writer_allocates_none(
    tmp_path: Path,
) -> None:
    """The writer's own fallocate waited for the warming thread's faults in the same file:
    the blocks ahead are allocated in the background with the pages."""
    path = tmp_path / "00000000000000000000"
    mf = MappedFile(path, 0, (WARM_AHEAD + 2) * WARM_CHUNK, create=True,
                    allocate=ALLOCATION_CHUNK)
    allocator = Allocator()
    try:
        allocator.warm_ahead(mf, WARM_CHUNK // 2)
        allocator.prefetch(mf)  # allocated before built: once take has it, so are the blocks
        allocator.take(tmp_path / segment_name(mf.end), mf.end, mf.size).destroy()
        ahead = (WARM_AHEAD + 1) * WARM_CHUNK
        assert mf.allocated == ahead
        assert os.fstat(mf.fd).st_blocks * 512 >= ahead
        mf.reserve(ahead)  # nothing left to allocate
        assert mf.allocated == ahead
    finally:
        allocator.close()
        mf.close()


def test_a_file_closed_before_the_allocator_reaches_it_is_left_alone(tmp_path: Path) -> None:
    """A warm request outlives the file it was made for (a segment cut or removed): its fd
    number may belong to another file by then, which must not be allocated through it."""
    mf = MappedFile(tmp_path / "00000000000000000000", 0, 4 * WARM_CHUNK, create=True)
    allocator = Allocator()
    allocator._lock.acquire()  # hold the thread off until the file is closed
    try:
        allocator.warm_ahead(mf, 0)
        mf.close()
        other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
        assert other == mf.fd  # the number is reused, as the kernel hands out the lowest
    finally:
        allocator._lock.release()
    try:
        allocator.prefetch(mf)
        allocator.take(tmp_path / segment_name(mf.end), mf.end, mf.size).destroy()
        assert os.fstat(other).st_size == 0 and os.fstat(other).st_blocks == 0
        with pytest.raises(ValueError, match="closed"):
            mf.reserve(2 * ALLOCATION_CHUNK)
    finally:
        allocator.close()
        os.close(other)


def test_a_store_warms_where_its_appends_go_when_it_opens(tmp_path: Path) -> None:
    """Before its first append, so that the first burst after a start does not race the
    warming (it did: the first warm request came with the first append)."""
    probe = _mapped(tmp_path, mmap.PAGESIZE)
    supported = prefault(probe.mm, mmap.PAGESIZE)
    probe.close()
    if not supported:
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    config = StoreConfig(commitlog_segment_size=64 * 1024 * 1024)
    log = open_log("mmap", tmp_path / "store", config, background=False)
    try:
        segment = tmp_path / "store" / "commitlog" / segment_name(0)
        deadline = time.monotonic() + 10.0
        while dirty_pages(segment, WARM_CHUNK, 2 * WARM_CHUNK) < WARM_CHUNK // mmap.PAGESIZE // 2:
            if time.monotonic() > deadline:
                raise AssertionError("gave up after 10 s waiting for the second chunk to be warm")
            time.sleep(0.01)
    finally:
        log.close()


# --- the ConsumeQueue --------------------------------------------------------------------------


def test_a_queue_entry_across_an_allocation_chunk_end_is_allocated_whole(tmp_path: Path) -> None:
    """A megabyte is not a multiple of 20 bytes: entry 52,428 starts inside the first chunk
    and ends past it.  Preparing it allocates the next chunk (and says so in ready_below),
    rather than leave its last bytes on blocks the file system never promised."""
    cq = ConsumeQueue("T", 0, tmp_path / "T" / "0", 60_000)
    straddling = ALLOCATION_CHUNK // ENTRY_SIZE
    assert straddling * ENTRY_SIZE < ALLOCATION_CHUNK < (straddling + 1) * ENTRY_SIZE
    try:
        cq.prepare(0)
        assert cq.ready_below == straddling  # the entries wholly in the first chunk
        cq.prepare(straddling)
        assert cq.ready_below > straddling
        assert cq.files.files[0].allocated >= (straddling + 1) * ENTRY_SIZE
    finally:
        cq.close()


# --- the IndexFile -------------------------------------------------------------------------------

TS = 1_700_000_000_000
KEYS = [f"k{i}" for i in range(12)]


def _service(tmp_path: Path, slots: int = 7, entries: int = 40) -> IndexService:
    return IndexService(tmp_path / "index", slots, entries)


def _hashes(*keys: str) -> tuple[int, ...]:
    return tuple(index_key_hash("T", k) for k in keys)


@given(st.lists(st.lists(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), max_size=8),
                max_size=12))
def test_index_finds_every_key_newest_first_across_collisions_and_files(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[list[str]]]
) -> None:
    """Seven slots for twelve keys: buckets are shared within and across batches, a key may
    repeat inside one record, and forty entries a file make the service roll files."""
    service = _service(tmp_path_factory.mktemp("idx"))
    model: dict[str, list[int]] = {k: [] for k in KEYS}
    phys = 0
    try:
        for batch in batches:
            items = []
            for keys in batch:
                items.append((_hashes(*keys), phys))
                for k in keys:
                    model[k].append(phys)
                phys += 100
            service.put(items, TS)
        for k, offsets in model.items():
            assert service.lookup("T", k, 0, TS + 1000, 10_000) == offsets[::-1]
    finally:
        service.close()


def test_the_next_index_file_is_built_before_it_is_needed(tmp_path: Path) -> None:
    """With an allocator the service asks for a file up front and again once the current one
    is three quarters full; each is the file the following put writes to, and one never used
    is gone when the allocator closes."""
    allocator = Allocator(warm=False)
    service = IndexService(tmp_path / "index", 7, 20, allocator)
    try:
        service.prepare(TS)
        first = _built(allocator, tmp_path / "index")
        service.put([(_hashes("a"), 0)], TS)
        assert service.files[-1].path == first
        service.put([(_hashes(*KEYS), 100)], TS)  # 14 of 20 entries: under three quarters
        assert _built(allocator, tmp_path / "index") == first
        service.put([(_hashes("b"), 200)], TS + 1)  # 15: the next file is asked for
        second = _built(allocator, tmp_path / "index", after=first)
        service.put([(_hashes(*KEYS), 300)], TS + 2)  # does not fit: the next file starts
        assert service.files[-1].path == second
        assert service.lookup("T", "b", 0, TS + 1000, 10) == [200]
        service.put([(_hashes(*KEYS[:4]), 400)], TS + 3)  # 17 of 20: asks for a third
        third = _built(allocator, tmp_path / "index", after=second)
    finally:
        allocator.close()
        service.close()
    assert not third.exists()  # never written to: not part of the index


def test_a_new_index_files_slots_are_faulted_in_off_the_put_path(tmp_path: Path) -> None:
    """Keys hash to slots all over a new file's head; with an allocator, its thread zeroes
    the head's pages, and the puts that follow touch them without a fault of their own."""
    slots = 1 << 20  # a 4 MiB head: 1,024 pages
    allocator = Allocator(warm=True)
    service = IndexService(tmp_path / "index", slots, 1 << 16, allocator)
    try:
        service.put([(_hashes("first"), 0)], TS)
        head = service.files[-1].slot
        if not prefault(mmap.mmap(-1, mmap.PAGESIZE), mmap.PAGESIZE):
            pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
        pages = -(-head.nbytes // mmap.PAGESIZE)
        deadline = time.monotonic() + 30
        while (present := present_pages(head)) < pages - 1:  # waits on the allocator
            assert time.monotonic() < deadline, f"head faulted in: {present} of {pages} pages"
            time.sleep(0.01)
        items = [(_hashes(f"key-{i}"), 100 + i) for i in range(3000)]
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for item in items:
            service.put([item], TS + 1)
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
        # 3,000 keys land on about 950 of the 1,024 pages; the entries' own 15 pages fault.
        assert faults < 100
        assert service.lookup("T", "key-7", 0, TS + 1000, 10) == [107]
    finally:
        allocator.close()
        service.close()


def _built(allocator: Allocator, directory: Path, after: Path | None = None) -> Path:
    """The newest file in ``directory`` once the allocator has built it (``after``: a newer
    one than that)."""
    for _ in range(200):
        with allocator._lock:
            busy = bool(allocator._build)
        names = sorted(directory.iterdir())
        if not busy and names and (after is None or names[-1] != after):
            return names[-1]
        threading.Event().wait(0.01)
    raise AssertionError(f"no file built in {directory}")


@given(st.lists(st.booleans(), max_size=3 * COPY_CHUNKS + 5), st.integers(1, COPY_CHUNKS + 2))
def test_a_flush_takes_the_dirty_head_chunks_in_bounded_runs(flags: list[bool], most: int) -> None:
    """Every dirty chunk is in one run, as its byte range, in runs of at most ``most`` chunks
    (the pure copy gives the GIL up between them, so a whole dirty slot table no longer stops
    the broker's loop for one long copy), and every flag is cleared."""
    dirty = bytearray(flags)
    runs = take_runs(dirty, most)
    assert all(0 < end - start <= most * HEAD_CHUNK and start % HEAD_CHUNK == end % HEAD_CHUNK == 0
               for start, end in runs)
    taken = [c for start, end in runs for c in range(start // HEAD_CHUNK, end // HEAD_CHUNK)]
    assert taken == [c for c, flag in enumerate(flags) if flag]
    assert not any(dirty)


def test_index_slots_are_little_endian_entry_numbers(tmp_path: Path) -> None:
    service = _service(tmp_path, slots=1009, entries=100)
    (h,) = _hashes("order-1")
    service.put([((h,), 0), ((h,), 100)], TS)
    service.flush()
    f = service.files[-1]
    at = HEADER_SIZE + (h % 1009) * 4
    assert bytes(f.file.mm[at : at + 4]) == (2).to_bytes(4, "little")  # entry 2 is the newest
    service.close()


def test_entries_a_killed_process_wrote_past_the_header_keep_older_chains(tmp_path: Path) -> None:
    """A head torn by a power cut (the slots' sectors newer than the header's) leaves slots
    naming entries past ``count``; the next puts overwrite those entries and must still chain
    to everything the header counted."""
    path = tmp_path / "index" / index_file_name(TS)
    path.parent.mkdir()
    f = IndexFile(path, 7, 100, create=True)
    lock = threading.Lock()
    older = [((h,), 100 * i) for i, h in enumerate(_hashes(*KEYS))]
    f.put(older, TS)
    f.flush(lock)
    counted = HEADER.unpack_from(f.file.mm, 0)
    f.put([(_hashes(*KEYS[:5]), 5000), (_hashes(*KEYS[5:]), 6000)], TS)
    f.flush(lock)
    HEADER.pack_into(f.file.mm, 0, *counted)  # the header never got past the first batch
    f.close()
    service = _service(tmp_path, slots=7, entries=100)
    service.load()
    try:
        service.put([(_hashes("k3"), 7000)], TS)
        for i, k in enumerate(KEYS):
            expected = [7000, 300] if k == "k3" else [100 * i]
            assert service.lookup("T", k, 0, TS + 1000, 100) == expected
    finally:
        service.close()


def test_files_a_killed_process_never_flushed_go_and_later_names_sort_after(
    tmp_path: Path,
) -> None:
    """Files at the end that count nothing were filled after the last flush (their heads
    never reached the file): opening drops them, since recovery indexes their records again.
    Recovery indexes with the records' store times, older than the files' names: the files
    it makes must still sort after every file there, or the next open takes them in the
    wrong order."""
    service = _service(tmp_path, slots=7, entries=20)
    service.put([(_hashes(*KEYS[:9]), 0), (_hashes(*KEYS), 100)], TS)  # 21 entries: two files
    service.flush()
    service.put([(_hashes(*KEYS), 200), (_hashes(*KEYS), 300)], TS + 1)  # two more, unflushed
    names = [f.path.name for f in service.files]
    assert len(names) == 4
    for f in service.files:  # killed: nothing more reaches the files
        f._mapped.release()
        f.file.close()
    service = _service(tmp_path, slots=7, entries=20)
    service.load()
    try:
        assert [f.path.name for f in service.files] == names[:2]
        assert sorted(p.name for p in (tmp_path / "index").iterdir()) == names[:2]
        service.put([(_hashes(*KEYS), 200), (_hashes(*KEYS), 300)], TS - 60_000)
        on_disk = sorted(p.name for p in (tmp_path / "index").iterdir())
        assert on_disk == [f.path.name for f in service.files] and len(on_disk) == 4
        assert service.lookup("T", "k11", 0, TS + 1000, 10) == [300, 200, 100]
    finally:
        service.close()


# --- the flusher ---------------------------------------------------------------------------------


def _flusher(flush_log: object, flush_projections: object, **cfg: object) -> Flusher:
    config = StoreConfig(flush=FlushMode.SYNC_FLUSH, **cfg)  # type: ignore[arg-type]
    written = [1000]
    return Flusher(config, written=lambda: written[0], flush_log=flush_log,  # type: ignore[arg-type]
                   flush_projections=flush_projections, durable=0)  # type: ignore[arg-type]


def test_sync_acknowledgements_do_not_wait_for_projection_flushes(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    def slow_projections(periodic: bool) -> None:
        started.set()
        release.wait(10)

    flusher = _flusher(lambda target: target, slow_projections,
                       flush_consume_queue_interval_ms=1)
    try:
        assert started.wait(10)  # the projection thread is stuck in its flush
        assert flusher.wait(1000, 5.0) is True
        assert flusher.durable == 1000
    finally:
        release.set()
        flusher.close()


def test_a_flush_that_finishes_last_never_takes_the_durable_end_back() -> None:
    """A flush round that started from a smaller target and returns after a caller's own
    flush made more durable: the durable end stays where the caller left it.  It went back,
    and a SYNC_FLUSH writer whose wait had just returned read a durable end below its
    record (seen with 16 writers calling flush() after each append)."""
    in_round, finish = threading.Event(), threading.Event()

    def flush_log(target: int) -> int:
        in_round.set()
        finish.wait(10)  # the test decides when the round's msync returns
        return target

    flusher = _flusher(flush_log, lambda periodic: None, flush_consume_queue_interval_ms=60_000)
    served = threading.Event()
    try:
        flusher.request(1000, lambda ok: served.set(), 10.0)  # a round from the target 1000
        assert in_round.wait(10)
        flusher.advance(2000, flusher.round_start())  # a caller's flush() meanwhile
        assert flusher.wait(2000, 0.0) is True
        finish.set()
        assert served.wait(10)  # the round has returned 1000 and served its request
        assert flusher.durable == 2000
    finally:
        finish.set()
        flusher.close()


@pytest.mark.parametrize("how", ["cut", "restart"])
def test_a_flush_from_before_the_log_was_cut_back_vouches_for_nothing_after(how: str) -> None:
    """A round flushing up to 1000 is in flight when the log is cut back to 500 (a slave
    truncating to its master), or an empty log restarts there, and is written again past it.
    The round's end must not count: the bytes now at 500..800 were written after its msync
    began, and their SYNC_FLUSH writer was acknowledged as durable when they may not be."""
    started, release = threading.Semaphore(0), threading.Semaphore(0)
    durable_at_start: list[int] = []  # the durable end as each round begins

    def flush_log(target: int) -> int:
        durable_at_start.append(flusher.durable)
        started.release()
        release.acquire(timeout=10)  # the test decides when each round's msync returns
        return target

    flusher = _flusher(flush_log, lambda periodic: None, flush_consume_queue_interval_ms=60_000)
    served = threading.Event()
    try:
        flusher.request(1000, lambda ok: None, 10.0)
        assert started.acquire(timeout=10), "round 1 (to 1000) did not start"
        if how == "cut":
            flusher.cut(500)
        else:
            flusher.restart(500)
        flusher.request(800, lambda ok: ok and served.set(), 10.0)  # written at 500..800 since
        release.release()  # round 1 returns 1000
        assert started.acquire(timeout=10), "the writer was served by round 1's end"
        assert durable_at_start == [0, 0 if how == "cut" else 500]
        release.release()  # round 2 flushed the log as it is now
        assert served.wait(10)
        assert flusher.durable == 1000
    finally:
        for _ in range(3):
            release.release()
        flusher.close()


def test_waiters_time_out_while_the_log_flush_fails_and_succeed_once_it_works() -> None:
    failing = [True]

    def flush_log(target: int) -> int:
        if failing[0]:
            raise OSError(5, os.strerror(5))
        return target

    flusher = _flusher(flush_log, lambda: None)
    try:
        assert flusher.wait(1000, 0.05) is False
        failing[0] = False
        assert flusher.wait(1000, 5.0) is True
    finally:
        flusher.close()


def test_a_round_waits_for_as_many_writers_as_the_last_one_served() -> None:
    """Writers released together come back one by one: the next msync carries them all."""
    written = [0]
    rounds: list[int] = []  # requests parked so far, when each msync starts
    started = threading.Semaphore(0)
    finish = threading.Semaphore(0)
    done: list[bool] = []

    def flush_log(target: int) -> int:
        rounds.append(written[0])
        started.release()
        finish.acquire(timeout=10)  # the test decides when each msync returns
        return target

    config = StoreConfig(flush=FlushMode.SYNC_FLUSH, flush_consume_queue_interval_ms=60_000)
    flusher = Flusher(config, written=lambda: written[0], flush_log=flush_log,
                      flush_projections=lambda periodic: None, durable=0)

    def park(n: int) -> None:
        for _ in range(n):
            written[0] += 1
            flusher.request(written[0], done.append, 10.0)

    try:
        park(1)
        assert started.acquire(timeout=10)  # round 1: the first request alone
        park(3)
        finish.release()
        assert started.acquire(timeout=10)  # round 2: the three parked meanwhile
        # Round 2's msync takes 0.3 s, so round 3 may wait that long for three writers.
        threading.Timer(0.3, finish.release).start()
        while len(done) < 4:
            threading.Event().wait(0.001)
        park(1)
        threading.Event().wait(0.05)  # time enough to start a round on one request
        park(2)
        assert started.acquire(timeout=10)
        finish.release()
        while len(done) < 7:
            threading.Event().wait(0.001)
        assert rounds == [1, 4, 7] and all(done)
    finally:
        for _ in range(3):
            finish.release()
        flusher.close()
