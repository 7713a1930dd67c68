"""The store's compiled loops (evq/backends/mmapfile/store_kernels.pyx) against their pure
references (append_loop.append_records, index_file.put_entries, and the methods whose whole
common case they also run: MmapMessageLog.append, IndexService.put, AppendedBatch.single).

Two mmap stores, one running each, take the same random workload: batches of records in many
topics and queues, with and without index keys, prepared and committed transactions, IPv6
hosts, illegal sizes, with and without the transient store pool, on segments, ConsumeQueue
files and index files small enough that every batch meets a rare step (a roll, an
allocation, a new queue or queue file, a full index file).  They must return the same
results, announce the same dispatches and leave the same commitlog, consumequeue and index
files, byte for byte.  The module also checks that the compiled loops are the ones in use
wherever a C compiler exists, and runs the store tests once more on the pure path.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from evq.backends.config import StoreConfig
from evq.backends.mmapfile import appended, index_file, kernels
from evq.backends.mmapfile.kernels import COMPILED, PURE, StoreKernels
from evq.backends.mmapfile.store import MmapMessageLog
from evq.domain import record
from evq.domain import sysflag as sf
from evq.domain.clock import ManualClock, SystemClock
from evq.domain.log import Dispatched
from evq.domain.message import Host, Prop, new_message
from evq.domain.record import PutRecord, put_record, put_record_of
from tests.domain.test_record_kernels import PURE_RUN, c_compiler
from tests.processes import REPO_ROOT, python_env
from tests.strategies import hosts, keys, sysflags, tags, topics

needs_compiled = pytest.mark.skipif(COMPILED is None, reason="the store kernels are not built")
START_MS = 1_700_000_000_000


class PureLog(MmapMessageLog):
    kernels: ClassVar[StoreKernels] = PURE


class CompiledLog(MmapMessageLog):
    kernels: ClassVar[StoreKernels] = COMPILED or PURE


# --- the build ------------------------------------------------------------------------------


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler: the pure loops are expected")
def test_the_compiled_loops_are_built_and_used_where_a_compiler_is() -> None:
    import evq.backends.mmapfile.store_kernels  # noqa: F401  (fails when the build skipped it)

    assert kernels.KERNELS is (PURE if PURE_RUN else COMPILED)
    assert MmapMessageLog.kernels is kernels.KERNELS
    single = appended.AppendedBatch.single
    assert single is appended.AppendedBatch.pure_single if PURE_RUN else single.__module__ == (
        "evq.backends.mmapfile.store_kernels")


def test_the_variable_selects_the_pure_loops() -> None:
    program = ("from evq.backends.mmapfile import kernels; "
               "assert kernels.KERNELS is kernels.PURE and kernels.COMPILED is None")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**python_env(), record.PURE_PYTHON_VARIABLE: "1"},
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-3000:]


@needs_compiled
def test_the_store_tests_pass_on_the_pure_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "tests/backends/test_store.py", "tests/backends/test_mmap_files.py", "-k", "mmap"],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**python_env(), record.PURE_PYTHON_VARIABLE: "1"}, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-3000:]


# --- workloads ------------------------------------------------------------------------------


@attrs.frozen
class Workload:
    config: StoreConfig
    batches: list[list[PutRecord]]


def _illegal(size: int) -> PutRecord:
    """A record the log must refuse for its size (too short to be a record, or too long)."""
    return put_record_of(bytes(size), "T", 0, 0, 0, ())


@attrs.frozen
class Pools:
    """What a workload's records are made of, drawn once a workload: each record then picks
    from these (a few draws each), so a workload of hundreds of records stays small to
    generate and shrink."""

    topics: list[str]
    words: list[str]  # keys and unique keys
    tags: list[str]
    born_hosts: list[Host]
    store_hosts: list[Host]  # the store's family, or in some workloads either (see below)


@st.composite
def pools(draw: st.DrawFn, store_v6: bool) -> Pools:
    mixed = draw(st.integers(0, 9)) == 0  # the log refuses to widen a store host
    return Pools(
        draw(st.lists(topics, min_size=1, max_size=4, unique=True)),
        draw(st.lists(keys, min_size=1, max_size=6, unique=True)),
        draw(st.lists(tags, min_size=1, max_size=3)),
        draw(st.lists(hosts(ipv6=None), min_size=1, max_size=3)),
        draw(st.lists(hosts(ipv6=None if mixed else store_v6), min_size=1, max_size=3)),
    )


@st.composite
def put_records(draw: st.DrawFn, pool: Pools, max_body: int,
                place: tuple[str, int] | None = None) -> PutRecord:
    """A record of the workload's topics, four queues (or of ``place``: its topic and queue),
    with 0 to 4 keys and maybe a unique key, any transaction type, any host families.  Now and
    then its topic is a string equal to the pool's but another object: the compiled loop
    knows a run's queue by its topic's and queue id's identity, and must find an equal one's
    as the dictionary does."""
    props: dict[str, str] = {}
    if draw(st.booleans()):
        props[Prop.UNIQ_KEY] = draw(st.sampled_from(pool.words))
    body = bytes(draw(st.integers(0, max_body) | st.integers(max_body // 3, max_body)))
    words = draw(st.lists(st.sampled_from(pool.words), max_size=4))
    topic, queue_id = place or (draw(st.sampled_from(pool.topics)), draw(st.integers(0, 3)))
    m = new_message(
        topic, body,
        tags=draw(st.none() | st.sampled_from(pool.tags)), keys=" ".join(words) or None,
        properties=props, compress_over=None,
    )
    m = attrs.evolve(m, queue_id=queue_id, sysflag=m.sysflag | draw(sysflags()),
                     born_host=draw(st.sampled_from(pool.born_hosts)),
                     store_host=draw(st.sampled_from(pool.store_hosts)))
    r = put_record(m)
    if draw(st.integers(0, 7)) == 0:
        r = attrs.evolve(r, topic=r.topic.encode().decode())  # (one character: the same)
    return r


@st.composite
def record_batches(draw: st.DrawFn, pool: Pools) -> list[PutRecord]:
    """8 to 32 records, each to any queue, or in runs to one queue (as a producer's batch
    goes; the compiled loop keeps a queue's state over a run, and a run meets the rare steps
    midway: a segment roll, a queue's next file); a tenth of an illegal size."""
    runs = draw(st.booleans())
    illegal = st.integers(0, record.MIN_RECORD_SIZE - 1) | st.integers(1501, 2100)
    records: list[PutRecord] = []
    place = None
    for _ in range(draw(st.integers(8, 32))):
        if draw(st.integers(0, 9)) == 0:
            records.append(_illegal(draw(illegal)))
            continue
        if runs and (place is None or draw(st.integers(0, 5)) == 0):
            place = draw(st.sampled_from(pool.topics)), draw(st.integers(0, 3))
        records.append(draw(put_records(pool, 600, place)))
    return records


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    segment = draw(st.sampled_from([4096, 8192, 16384]))
    config = StoreConfig(
        commitlog_segment_size=segment,
        consume_queue_entries=draw(st.integers(1, 6)),
        index_slots=draw(st.sampled_from([1, 7, 97])),
        index_entries=draw(st.integers(2, 40)),
        max_message_size=draw(st.integers(900, 1500)),
        store_host=draw(hosts(ipv6=draw(st.booleans()))),
        warm_segments=False,
        # Appends into a pool buffer, committed to the file at close.
        transient_store_pool_enable=draw(st.booleans()), transient_store_pool_size=2,
    )
    pool = draw(pools(":" in config.store_host[0]))
    batches = draw(st.lists(record_batches(pool), min_size=3, max_size=10))
    return Workload(config, batches)


# --- the comparison -------------------------------------------------------------------------


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """What a call gives: its value, or the type of what it raised."""
    try:
        return "value", fn(*args)
    except Exception as exc:  # the comparison is the point: any type must match
        return "raised", type(exc)


def files_of(root: Path) -> dict[str, bytes]:
    """The bytes of every file the projections and the log are made of."""
    return {str(p.relative_to(root)): p.read_bytes()
            for part in ("commitlog", "consumequeue", "index") if (root / part).is_dir()
            for p in sorted((root / part).rglob("*")) if p.is_file()}


def _queue_files(files: dict[str, bytes]) -> dict[str, int]:
    count: dict[str, int] = {}
    for name in files:
        if name.startswith("consumequeue/"):
            queue = name.rsplit("/", 1)[0]
            count[queue] = count.get(queue, 0) + 1
    return count


def run(cls: type[MmapMessageLog], root: Path, work: Workload
        ) -> tuple[list[tuple[str, Any]], list[Dispatched], dict[str, bytes]]:
    clock = ManualClock(START_MS)
    log = cls.open(root, work.config, clock=clock, background=False)
    dispatched: list[Dispatched] = []
    log.subscribe_dispatch(dispatched.extend)
    results = []
    try:
        for batch in work.batches:
            kind, value = outcome(log.append, batch)
            results.append((kind, list(value) if kind == "value" else value))
            clock.advance(1500)
    finally:
        log.close()
    return results, dispatched, files_of(root)


def _longest_run(batches: list[list[PutRecord]]) -> int:
    """The most records in a row of one batch to one queue (8 and up: 8)."""
    longest = 0
    for batch in batches:
        count, last = 0, None
        for r in batch:
            place = (r.topic, r.queue_id)
            count = count + 1 if place == last else 1
            last, longest = place, max(longest, count)
    return longest


Query = tuple[int, int, int, int, int]
"""A pull: (queue index, offset past the queue's first, max count, max bytes, tag filter: 0
none, 1 even codes, 2 the first tag's code)."""

queries = st.tuples(st.integers(0, 15), st.integers(-2, 16),
                    st.integers(1, 40) | st.sampled_from([0, -1, 2**70]),
                    st.sampled_from([0, 150, 700, 2000, 256 * 1024, 2**70, -1, -2, -3]),
                    st.integers(0, 2))
"""A negative max bytes stands for the sizes of the pull's first two entries, and one byte
less or more: the limit's boundary."""


@needs_compiled
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(work=workloads(), pulls=st.lists(queries, min_size=20, max_size=60))
def test_compiled_and_pure_pulls_answer_the_same(
    tmp_path_factory: pytest.TempPathFactory, work: Workload, pulls: list[Query]
) -> None:
    """Every queue of a workload's store, read from anywhere (before its first entry, past
    its end, across its files and the log's segments, over blanks and prepared records),
    any count and byte limit, with and without tag filters, with a transient store pool's
    records not yet in the file: the compiled pull gives the reference's answer."""
    root = tmp_path_factory.mktemp("pulls")
    clock = ManualClock(START_MS)
    log = CompiledLog.open(root, work.config, clock=clock, background=False)
    try:
        for batch in work.batches:
            outcome(log.append, batch)
            clock.advance(1500)
        assert "_read_queue" in vars(log)  # the compiled twin is this store's own
        first_tags = tag_code_of(work)
        filters: list[Callable[[int], bool] | None] = [
            None, lambda code: code % 2 == 0, lambda code: code == first_tags]
        found = 0
        queues = [cq for _, cq in sorted(log._cqs.items())]
        for q, delta, max_count, max_bytes, f in pulls if queues else ():
            cq = queues[q % len(queues)]
            offset = cq.min_offset + delta
            if max_bytes < 0:
                sizes = [size for _, size, _ in cq.entries(max(offset, 0), 2)]
                max_bytes = sum(sizes) + max_bytes + 2  # -1: one byte more, -2: equal, -3: one less
            args = (cq, offset, max_count, max_bytes, filters[f])
            expected = outcome(MmapMessageLog._read_queue, log, *args)
            got = outcome(log._read_queue, *args)
            assert got == expected
            found += expected[0] == "value" and bool(expected[1].records)
            del got, expected  # the record views, before the log is closed
        event(f"pulls that found records: {min(found, 10) // 5 * 5}+")
        entries = sum(cq.next_offset - cq.min_offset for cq in queues)
        event(f"entries: {min(entries, 50) // 10 * 10}+")
    finally:
        log.close()


def tag_code_of(work: Workload) -> int:
    """The tags code of the workload's first record (a filter that matches some)."""
    return next((r.tags_code for batch in work.batches for r in batch if r.tags_code), 0)


@needs_compiled
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(work=workloads())
def test_compiled_and_pure_appends_leave_the_same_results_and_files(
    tmp_path_factory: pytest.TempPathFactory, work: Workload
) -> None:
    base = tmp_path_factory.mktemp("twins")
    pure = run(PureLog, base / "pure", work)
    compiled = run(CompiledLog, base / "compiled", work)
    results, _, files = pure
    statuses = [r.status.name for kind, rs in results if kind == "value" for r in rs]
    for name in ("commitlog/", "index/"):  # how far the workloads reach
        event(f"{name} files: {min(3, sum(f.startswith(name) for f in files))}")
    event(f"most consume queue files: {min(3, max(_queue_files(files).values(), default=0))}")
    event(f"illegal: {'MESSAGE_ILLEGAL' in statuses}")
    event(f"a batch raised: {any(kind == 'raised' for kind, _ in results)}")
    event(f"stored: {statuses.count('PUT_OK') // 50 * 50}+")
    event(f"longest run to one queue: {min(8, _longest_run(work.batches))}")
    assert compiled[0] == pure[0]
    assert compiled[1] == pure[1]
    assert compiled[2].keys() == pure[2].keys()
    for name, data in pure[2].items():
        assert compiled[2][name] == data, name


@needs_compiled
def test_a_workload_of_every_rare_step_leaves_the_same_files(tmp_path: Path) -> None:
    """A fixed workload of the strategy's shape that surely meets each rare step: segment
    rolls, ConsumeQueue and index file rolls, illegal sizes, a new queue, IPv6 and prepared
    records."""
    config = StoreConfig(commitlog_segment_size=4096, consume_queue_entries=2, index_slots=7,
                         index_entries=4, max_message_size=1000, warm_segments=False)
    m = new_message("T", b"x" * 300, keys="a b", compress_over=None)
    v6 = attrs.evolve(m, born_host=("::1", 1), queue_id=1)
    prepared = attrs.evolve(m, sysflag=sf.TRANSACTION_PREPARED_TYPE)
    batch = [put_record(m), _illegal(10), put_record(v6), put_record(prepared), _illegal(1200),
             *(put_record(attrs.evolve(m, queue_id=q)) for q in range(4))]
    work = Workload(config, [batch, batch, batch])
    pure = run(PureLog, tmp_path / "pure", work)
    compiled = run(CompiledLog, tmp_path / "compiled", work)
    assert compiled == pure
    results, _, files = pure
    places = [r.status.name for kind, batch_results in results for r in batch_results]
    assert places.count("MESSAGE_ILLEGAL") == 6 and places.count("PUT_OK") == 21
    assert sum(name.startswith("commitlog/") for name in files) > 2
    assert sum(name.startswith("consumequeue/T/0/") for name in files) > 2
    assert sum(name.startswith("index/") for name in files) > 2


@needs_compiled
def test_a_run_to_one_queue_across_its_files_and_rare_steps_leaves_the_same_files(
    tmp_path: Path,
) -> None:
    """Runs of records to one queue, as a producer's batches are: the compiled loop keeps
    the queue's state over a run and publishes it at its end.  These runs cross the queue's
    file ends and segment rolls, and hold an IPv6 record (its store fields stamped in
    Python) and a prepared one (no queue entry) midway; another queue comes between two."""
    config = StoreConfig(commitlog_segment_size=4096, consume_queue_entries=3, index_slots=7,
                         index_entries=40, max_message_size=1000, warm_segments=False)
    m = new_message("T", b"x" * 300, keys="a", compress_over=None)
    records = [put_record(m)] * 12
    records[4] = put_record(attrs.evolve(m, born_host=("::1", 1)))
    records[7] = put_record(attrs.evolve(m, sysflag=sf.TRANSACTION_PREPARED_TYPE))
    batch = [*records, put_record(attrs.evolve(m, queue_id=1)), *records[:5]]
    work = Workload(config, [batch, batch])
    pure = run(PureLog, tmp_path / "pure", work)
    assert run(CompiledLog, tmp_path / "compiled", work) == pure
    results, _, files = pure
    assert [r.queue_offset for kind, rs in results for r in rs if r.physical_offset >= 0][
        :13] == [*range(7), 0, *range(7, 11), 0]
    assert sum(name.startswith("commitlog/") for name in files) > 3
    assert sum(name.startswith("consumequeue/T/0/") for name in files) > 5


@needs_compiled
def test_a_queue_past_its_first_allocation_chunk_appends_on(tmp_path: Path) -> None:
    """ConsumeQueue files are allocated a megabyte at a time and one entry in 52,429 crosses
    a chunk's end: the loop stopped there for ever (its rare step found the entry's start
    allocated and did nothing) until the rare step and the loop agreed on the whole entry."""
    config = StoreConfig(commitlog_segment_size=16 * 1024 * 1024, warm_segments=False)
    record = put_record(new_message("T", b"", compress_over=None))
    count = 1024 * 1024 // 20 + 100
    work = Workload(config, [[record] * 1000 for _ in range(count // 1000 + 1)])
    pure = run(PureLog, tmp_path / "pure", work)
    assert pure[0][-1][0] == "value" and pure[0][-1][1][-1].queue_offset == len(
        work.batches) * 1000 - 1
    assert run(CompiledLog, tmp_path / "compiled", work) == pure


@attrs.define
class LookAlike:
    """Not a PutRecord, with its fields: the compiled loop reads PutRecord's slots directly
    and anything else through getattr, as the pure loop does."""

    data: bytes
    topic: str
    queue_id: int
    sysflag: int
    tags_code: int
    keys: tuple[str, ...]
    key_hashes: tuple[int, ...]


@needs_compiled
def test_records_of_another_class_append_as_put_records_do(tmp_path: Path) -> None:
    config = StoreConfig(commitlog_segment_size=4096, consume_queue_entries=2, index_slots=7,
                         index_entries=4, warm_segments=False)
    records = [put_record(new_message("T", b"x" * n, keys=f"k{n}", compress_over=None))
               for n in range(0, 2000, 150)]
    look_alikes = [LookAlike(*attrs.astuple(r, recurse=False)) for r in records]
    expected = run(PureLog, tmp_path / "pure", Workload(config, [records]))
    assert run(CompiledLog, tmp_path / "compiled", Workload(config, [look_alikes])) == expected


@needs_compiled
def test_a_tags_code_left_to_the_queue_midway_through_a_run(tmp_path: Path) -> None:
    """The compiled loop writes a queue entry itself only for an int tags code in the int64
    range, and leaves any other to ConsumeQueue.put, in the middle of a run: a bool (packed
    as 1) and an int past int64 (refused after its record is written: the batch raises, the
    record stays and its queue offset is used).  Both loops leave the same files and state,
    and the next batch goes on from it."""
    config = StoreConfig(commitlog_segment_size=8192, consume_queue_entries=4, index_slots=7,
                         index_entries=40, warm_segments=False)
    records = [LookAlike(*attrs.astuple(put_record(new_message(
        "T", b"x" * 100, keys=f"k{n}", compress_over=None)), recurse=False)) for n in range(10)]
    first = [*records]
    first[3] = attrs.evolve(records[3], tags_code=True)
    first[8] = attrs.evolve(records[8], tags_code=True)
    second = [*records]
    second[5] = attrs.evolve(records[5], tags_code=2**70)
    work = Workload(config, [first, second, records])  # type: ignore[list-item]
    pure = run(PureLog, tmp_path / "pure", work)
    assert [kind for kind, _ in pure[0]] == ["value", "raised", "value"]
    assert pure[0][2][1][0].queue_offset == 16
    assert run(CompiledLog, tmp_path / "compiled", work) == pure


# --- the index loop, alone ------------------------------------------------------------------


def _index_state(tmp: Path, name: str, slots: int, entries: int
                 ) -> Iterator[tuple[mmap.mmap, memoryview, bytearray]]:
    size = index_file.index_file_size(slots, entries)
    path = tmp / name
    path.write_bytes(bytes(size))
    head = bytearray(index_file.HEADER_SIZE + 4 * slots)
    dirty = bytearray(-(-len(head) // index_file.HEAD_CHUNK))
    with (path.open("r+b") as f, mmap.mmap(f.fileno(), size) as mm,
          memoryview(head)[index_file.HEADER_SIZE:].cast("i") as ints):
        yield mm, ints, dirty


item_lists = st.lists(
    st.tuples(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=3).map(tuple),
              st.integers(0, 2**40)),
    max_size=20)


@needs_compiled
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=item_lists, slots=st.sampled_from([1, 2, 7, 11, 1013, 1014, 3000]),
       limit=st.integers(1, 40), hash_over=st.integers(2**31, 2**40))
def test_put_entries_matches_on_any_hashes(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[tuple[int, ...], int]],
    slots: int, limit: int, hash_over: int,
) -> None:
    """Both loops leave the same entries, slots and dirty head chunks (slot tables of one to
    three chunks: 1,014 slots end the first 4 KiB chunk after the 40-byte header)."""
    tmp = tmp_path_factory.mktemp("index")
    entries = 40
    got = []
    for name, fn in (("pure", PURE.put_entries), ("compiled", COMPILED.put_entries)):
        for mm, slot, dirty in _index_state(tmp, name, slots, entries):
            first = outcome(fn, mm, slot, dirty, slots, index_file.HEADER_SIZE + 4 * slots,
                            items, 0, 1, 0, min(limit, entries), 7)
            written = bytes(mm), bytes(slot.cast("B")), bytes(dirty)
            # Hashes are 31-bit CRCs: one past int32 is refused alike (what struct leaves of
            # the entry it failed to pack is not part of the contract).
            bad = outcome(fn, mm, slot, dirty, slots, index_file.HEADER_SIZE + 4 * slots,
                          [((hash_over,), 1)], 0, 1, 0, entries, 7)
            got.append((first, written, bad))
    assert got[0] == got[1]


diffs = st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]) | st.integers(-(2**31), 2**31 - 1)
chain_hashes = st.sampled_from([7, 7, 0, 2**31 - 1, -(2**31)])


@attrs.frozen
class Chains:
    """An index file's entries past a head of ``base`` bytes, as puts leave them (each links
    to an earlier one) or damaged (a link forwards, to itself, or past the file), and a query
    of them: the slot's value, the count, the times."""

    image: bytes
    base: int
    count: int
    slot_value: int
    begin_ts: int
    diffs: list[int]  # the entries' times: a few, so that queries can meet them


@st.composite
def index_chains(draw: st.DrawFn) -> Chains:
    base = draw(st.integers(0, 64))
    n = draw(st.integers(1, 24))
    damaged = draw(st.booleans())
    times = draw(st.lists(diffs, min_size=1, max_size=3))
    entries = b"".join(index_file.ENTRY.pack(
        draw(chain_hashes), draw(st.integers(-(2**63), 2**63 - 1)), draw(st.sampled_from(times)),
        draw(st.integers(0, i - 1) if i and not (damaged and draw(st.booleans()))
             else st.integers(-(2**31), 2**31 - 1) | st.integers(-2, n + 2)))
        for i in range(n))
    count = draw(st.integers(1, n) | st.integers(1, n + 3))
    slot_value = draw(st.integers(0, n - 1) | st.integers(-(2**31), 2**31 - 1)
                      | st.integers(-2, n + 2))
    begin_ts = draw(st.just(1_700_000_000_000) | st.integers(-(2**63), 2**63 - 1))
    return Chains(bytes(base) + entries, base, count, slot_value, begin_ts, times)


@st.composite
def query_times(draw: st.DrawFn, chains: Chains) -> int:
    """A query's bound: anywhere, past 64 bits, or at an entry's coarse time (``begin_ts``
    and whole seconds) give or take a millisecond, where the range's ends must hold."""
    return draw(st.one_of(
        st.builds(lambda d, k, e: chains.begin_ts + d * 1000 + k * 1000 + e,
                  st.sampled_from(chains.diffs),
                  st.sampled_from([0, 1]), st.integers(-1, 1)),
        st.integers(-(2**63), 2**63 - 1), st.integers(-(2**80), 2**80)))


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(chains=index_chains(), max_entries=st.integers(0, 4) | st.integers(0, 30), h=chain_hashes,
       limit=st.integers(-2, 30) | st.integers(-(2**80), 2**80), data=st.data())
def test_chain_offsets_matches_on_any_chain(
    chains: Chains, max_entries: int, h: int, limit: int, data: st.DataObject,
) -> None:
    """Both walks of an index chain find the same offsets, or raise alike, on any entries and
    any query: whole chains, ones that end in damage, heads past the count, times at an
    entry's bounds and past 64 bits, limits past 64 bits."""
    begin_ms, end_ms = (data.draw(query_times(chains)) for _ in range(2))
    args = (chains.image, chains.base, chains.count, max_entries, chains.slot_value, h,
            chains.begin_ts, begin_ms, end_ms, limit)
    found = outcome(PURE.chain_offsets, *args)
    event("raised" if found[0] == "raised" else f"{min(len(found[1]), 2)} offsets")
    assert found == outcome(COMPILED.chain_offsets, *args)


def test_a_chain_walk_keeps_to_its_range_its_limit_and_the_file_size() -> None:
    """An entry stored at the range's either end is found, one a millisecond outside is not
    (its coarse time: the file's start and whole seconds; ``begin_ms`` is a second early, as
    the index keeps seconds), and a walk stops after ``max_entries`` entries or ``limit``
    found."""
    begin_ts = 1_700_000_000_123
    # entry i: hash 7, offset 100 i, i seconds after the file's start, linked to i - 1
    image = bytes(40) + b"".join(
        index_file.ENTRY.pack(7, 100 * i, i, i - 1) for i in range(6))
    at_2 = begin_ts + 2_000
    for twins in (PURE, COMPILED or PURE):
        def walk(begin_ms: int, end_ms: int, limit: int = 10, most: int = 10,
                 twins: StoreKernels = twins) -> list[int]:
            return twins.chain_offsets(image, 40, 6, most, 5, 7, begin_ts, begin_ms,
                                         end_ms, limit)
        assert walk(at_2 + 1000, at_2) == [200]
        assert walk(at_2 + 1001, at_2) == [] and walk(at_2 + 1000, at_2 - 1) == []
        assert walk(0, 2**62) == [500, 400, 300, 200, 100]
        assert walk(0, 2**62, limit=2) == [500, 400]
        assert walk(0, 2**62, most=2) == [500, 400]
        with pytest.raises(struct.error):
            twins.chain_offsets(image[:-1], 40, 6, 10, 5, 7, begin_ts, 0, 2**62, 10)


def test_a_lookup_ends_on_a_slot_whose_uncounted_chain_loops() -> None:
    """A power cut can keep a slot page newer than the header, naming entries past the count;
    damage there that links an entry to itself once made a lookup loop forever."""
    for twins in (PURE, COMPILED or PURE):
        image = bytes(40) + b"".join(
            index_file.ENTRY.pack(7, 100 * i, 0, prev) for i, prev in enumerate([0, 0, 2, 2]))
        assert twins.chain_offsets(image, 40, 2, 10, 3, 7, 0, 0, 10**13, 5) == []
        assert twins.chain_offsets(image, 40, 2, 10, 1, 7, 0, 0, 10**13, 5) == [100]
        assert index_file.counted_head(image, 40, 3, 2) == 0  # type: ignore[arg-type]


# No zero bytes: a copy's fresh memory may hold zeros, and a byte it failed to copy must show.
head_images = st.builds(lambda n, seed: bytes((k * 7 + seed) % 255 + 1 for k in range(n)),
                        st.integers(0, 3 * index_file.HEAD_CHUNK + 100), st.integers(0, 254))


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(image=head_images, data=st.data())
def test_copy_runs_matches_on_any_ranges(image: bytes, data: st.DataObject) -> None:
    """Both copies of a head's ranges give the same ``(start, bytes)``: ranges within the
    image, at its end, past it and empty (the last run of a head whose size is no whole
    number of chunks ends past it)."""
    assert COMPILED is not None
    bound = len(image) + index_file.HEAD_CHUNK
    runs = data.draw(st.lists(st.tuples(st.integers(0, bound), st.integers(0, bound)),
                              max_size=8))
    with mmap.mmap(-1, max(1, len(image))) as mm:
        mm[: len(image)] = image
        assert outcome(COMPILED.copy_runs, mm, runs) == outcome(PURE.copy_runs, mm, runs)


@needs_compiled
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(st.integers(0, 3 * index_file.HEAD_CHUNK),
                               st.binary(max_size=2 * index_file.HEAD_CHUNK)), max_size=6),
       skip=st.integers(0, index_file.HEADER_SIZE + 10))
def test_write_runs_matches_on_any_runs(
    tmp_path_factory: pytest.TempPathFactory, runs: list[tuple[int, bytes]], skip: int,
) -> None:
    """Both writes of a head's runs leave the same file: overlapping runs (the later one
    wins), runs past the file's end, empty ones, and the bytes below ``skip_below`` left
    alone."""
    assert COMPILED is not None
    tmp = tmp_path_factory.mktemp("write_runs")
    files = []
    for name, twins in (("pure", PURE), ("compiled", COMPILED)):
        path = tmp / name
        path.write_bytes(b"\xaa" * 100)
        fd = os.open(path, os.O_RDWR)
        try:
            twins.write_runs(fd, runs, skip)
        finally:
            os.close(fd)
        files.append(path.read_bytes())
    assert files[0] == files[1]


def test_a_failed_head_write_raises_the_os_error() -> None:
    """A write the kernel refuses raises its ``OSError`` (here: a descriptor open only for
    reading), from either write."""
    for twins in (PURE, COMPILED or PURE):
        fd = os.open(os.devnull, os.O_RDONLY)
        try:
            with pytest.raises(OSError) as raised:
                twins.write_runs(fd, [(0, b"x")], 0)
            assert raised.value.errno == errno.EBADF
        finally:
            os.close(fd)


def test_the_compiled_write_back_leaves_the_head_the_pure_one_does(tmp_path: Path) -> None:
    """An index file flushed through the compiled copy and write holds the head, slot for
    slot, that one flushed through the pure ones holds, after puts between flushes that
    touch chunks already taken and chunks not yet."""
    heads = []
    for name, twins in (("pure", PURE), ("compiled", COMPILED or PURE)):
        service = index_file.IndexService(tmp_path / name, 3000, 400,
                                          copy_runs=twins.copy_runs,
                                          write_runs=twins.write_runs)
        for round_ in range(3):
            hashes = range(round_ * 7, 3000, 41)  # over every chunk of the 3000 slots
            service.put([((h,), 100_000 * round_ + i) for i, h in enumerate(hashes)],
                        START_MS + round_)
            service.flush()
        f = service.files[-1]
        heads.append(bytes(f.file.mm[: f.base]))
        service.close()
    assert heads[0] == heads[1]
    assert heads[0][index_file.HEADER_SIZE:] != bytes(len(heads[0]) - index_file.HEADER_SIZE)


# --- the append's ends: the index put, the result, a failing subscriber ----------------------


def _index_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


index_batches = st.lists(
    st.lists(st.tuples(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=5)
                       .map(tuple), st.integers(0, 2**40)), min_size=1, max_size=12),
    min_size=1, max_size=12)


@needs_compiled
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=index_batches, slots=st.sampled_from([1, 2, 7, 1014, 1015]),
       entries=st.integers(2, 30), steps=st.lists(st.integers(-5000, 40_000), min_size=12,
                                                  max_size=12))
def test_the_compiled_index_put_writes_what_the_service_writes(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[tuple[int, ...], int]]],
    slots: int, entries: int, steps: list[int],
) -> None:
    """The compiled ``index_put`` (the common case in one file, the rest handed to
    ``IndexService.put_rest``) and ``IndexService.put`` leave the same index files and state
    for any keys, slot counts (bucket collisions from every key in one slot up, heads in one
    or two chunks), file sizes (items that fill a file, or more keys than a file holds) and
    store times (also going back, or past the largest difference an entry holds)."""
    assert COMPILED is not None
    from evq.backends.mmapfile import store_kernels

    tmp = tmp_path_factory.mktemp("index_put")
    got = []
    for name, put in (("pure", index_file.IndexService.put), ("compiled", store_kernels.index_put)):
        service = index_file.IndexService(tmp / name, slots, entries)
        ts = START_MS
        outcomes = []
        for batch, step in zip(batches, steps, strict=False):
            ts += step * 1000 if step > 39_000 else step  # now and then past MAX_TIME_DIFF
            outcomes.append(outcome(put, service, list(batch), ts))
            outcomes.append([(f.count, f.slots_used, f.begin_ts, f.end_ts, f.begin_phys,
                              f.end_phys) for f in service.files])
        service.flush()
        service.close()
        got.append((outcomes, _index_files(tmp / name)))
    assert got[0] == got[1]
    event(f"index files: {min(3, len(got[0][1]))}")


@needs_compiled
@given(places=st.lists(st.sampled_from([(0, 300, 0), (4096, 1, 7), appended.ILLEGAL,
                                        appended.REFUSED]), max_size=3),
       host=st.sampled_from([b"\x7f\x00\x00\x01\x00\x00\x27\x1b", bytes(20)]))
def test_the_compiled_single_answers_as_the_method(
    places: list[tuple[int, int, int]], host: bytes
) -> None:
    batch = appended.AppendedBatch(places, START_MS, host)
    assert batch.single() == batch.pure_single()


@needs_compiled
@pytest.mark.parametrize("cls", [PureLog, CompiledLog])
def test_a_failing_subscriber_is_logged_and_the_next_still_hears(
    tmp_path: Path, cls: type[MmapMessageLog]
) -> None:
    log = cls.open(tmp_path, StoreConfig(warm_segments=False), clock=ManualClock(START_MS),
                   background=False)
    heard: list[list[Dispatched]] = []

    def bad(batch: list[Dispatched]) -> None:
        raise RuntimeError("subscriber bug")

    log.subscribe_dispatch(bad)
    log.subscribe_dispatch(heard.append)
    try:
        with capture_logs() as logs:
            log.append([put_record(new_message("T", b"x", compress_over=None))])
    finally:
        log.close()
    assert [e["event"] for e in logs] == ["dispatch_subscriber_failed"]
    assert logs[0]["exc_info"] is True
    assert [d.queue_offset for batch in heard for d in batch] == [0]


@needs_compiled
@pytest.mark.parametrize("cls", [PureLog, CompiledLog])
def test_a_listener_hears_only_while_it_wants(tmp_path: Path, cls: type[MmapMessageLog]
                                              ) -> None:
    """A listener subscribed with what it waits for is called while that holds something and
    skipped while it is empty; one without is called for every batch."""
    log = cls.open(tmp_path, StoreConfig(warm_segments=False), clock=ManualClock(START_MS),
                   background=False)
    wanted: set[str] = set()
    gated: list[int] = []
    every: list[int] = []
    log.subscribe_dispatch(lambda batch: gated.extend(d.queue_offset for d in batch), wanted)
    log.subscribe_dispatch(lambda batch: every.extend(d.queue_offset for d in batch))

    def put() -> None:
        log.append([put_record(new_message("T", b"x", compress_over=None))])

    try:
        put()
        wanted.add("a pull")
        put()
        wanted.clear()
        put()
    finally:
        log.close()
    assert gated == [1]
    assert every == [0, 1, 2]


class _TickingClock:
    """A system clock of another class: its own now_ms, as an injected clock has."""

    def __init__(self) -> None:
        self.reads = 0

    def now_ms(self) -> int:
        self.reads += 1
        return START_MS + self.reads

    monotonic = staticmethod(time.monotonic)


@needs_compiled
def test_the_compiled_append_reads_the_system_clock_as_its_now_ms_does(tmp_path: Path) -> None:
    """The compiled append reads the system clock itself (no Python frame a send): the time
    it stamps is the clock's own reading between two of its calls; any other clock, a
    subclass of the system clock's included, is asked."""
    from evq.backends.mmapfile import store_kernels

    clock = SystemClock()
    for _ in range(1000):
        before = clock.now_ms()
        read = store_kernels.wall_ms()
        assert before <= read <= clock.now_ms()
    log = CompiledLog.open(tmp_path / "system", StoreConfig(warm_segments=False),
                           background=False)
    try:
        before = clock.now_ms()
        stamped = log.append([put_record(new_message("T", b"x", compress_over=None))])
        assert before <= stamped[0].store_timestamp <= clock.now_ms()
    finally:
        log.close()

    class Later(SystemClock):
        def now_ms(self) -> int:
            return super().now_ms() + 3_600_000

    for other in (Later(), _TickingClock()):
        log = CompiledLog.open(tmp_path / type(other).__name__, StoreConfig(warm_segments=False),
                               clock=other, background=False)  # type: ignore[arg-type]
        try:
            floor = clock.now_ms() + 3_600_000
            got = log.append([put_record(new_message("T", b"x", compress_over=None))])
            if isinstance(other, Later):
                assert floor <= got[0].store_timestamp <= clock.now_ms() + 3_600_000
            else:
                assert got[0].store_timestamp == START_MS + other.reads
        finally:
            log.close()
