"""Store behaviour through the MessageLog port.

Every test here opens its logs with the ``open_log`` fixture and talks to them only through
:class:`evq.domain.log.MessageLog`, so the same tests prove every backend.  Physical offsets,
segment roll-over and BLANK padding are part of the port's contract (the same bytes land at the
same offsets on every backend), so they are tested here too, through ``read_log`` and
``lookup``.  Facts about the mmap backend's files live in the last section, which skips on
other backends.

The fixture's config is ``SMALL`` from conftest: 64 KiB log segments, 64-entry ConsumeQueue
files and 200-entry (199 usable) index files, so a few hundred messages cross every boundary.
"""

from __future__ import annotations

import itertools
import random
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from evq.backends.mmapfile.index_file import index_file_size
from evq.backends.mmapfile.mapped_file import BUILDING_SUFFIX
from evq.backends.registry import BACKENDS
from evq.backends.registry import open_log as open_backend
from evq.domain import sysflag as sf
from evq.domain.clock import ManualClock
from evq.domain.hashing import tags_code
from evq.domain.log import (
    AppendResult,
    Dispatched,
    FlushMode,
    GetStatus,
    LogClosed,
    MessageLog,
    PutStatus,
    ReplicationError,
)
from evq.domain.message import Message, Prop, new_message
from evq.domain.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    decode,
    encode,
    offset_msg_id,
    put_record,
)
from tests.conftest import SMALL

pytestmark = pytest.mark.transient_pool_too

OpenLog = Callable[..., MessageLog]

SEG = 64 * 1024  # SMALL.commitlog_segment_size
DEFAULT_HOST = ("127.0.0.1", 10911)  # StoreConfig.store_host
HEAD = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
FOREVER = (0, 2**62)


# --- helpers ---------------------------------------------------------------------------------


def message(
    topic: str = "T",
    body: bytes = b"",
    *,
    queue_id: int = 0,
    tags: str | None = None,
    keys: str | None = None,
    props: dict[str, str] | None = None,
    sysflag: int = 0,
    **fields: Any,
) -> Message:
    m = new_message(topic, body, tags=tags, keys=keys, properties=props, compress_over=None)
    return attrs.evolve(m, queue_id=queue_id, sysflag=m.sysflag | sysflag, **fields)


def sized(size: int, topic: str = "T", **kw: Any) -> Message:
    """A message whose stored record is exactly ``size`` bytes."""
    base = len(encode(message(topic, **kw)))
    assert size >= base, f"{size} < smallest record {base}"
    return message(topic, b"s" * (size - base), **kw)


def append(log: MessageLog, *messages: Message) -> list[AppendResult]:
    results = log.append([put_record(m) for m in messages])
    assert [r.status for r in results] == [PutStatus.PUT_OK] * len(messages)
    return results


def at(log: MessageLog, phys: int) -> memoryview:
    view = log.lookup(phys)
    assert view is not None, f"no record at {phys}"
    return view


def stored(m: Message, r: AppendResult, host: tuple[str, int] = DEFAULT_HOST) -> Message:
    """``m`` as the log holds it after the append that gave ``r``."""
    return attrs.evolve(
        m, queue_offset=r.queue_offset, commit_log_offset=r.physical_offset,
        store_timestamp=r.store_timestamp, store_host=host,
    )


def read_all(log: MessageLog, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    """(queue offset, record bytes) of every readable message of a queue, in order."""
    lo, hi = log.bounds(topic, queue_id)
    out: list[tuple[int, bytes]] = []
    offset = lo
    while offset < hi:
        res = log.read(topic, queue_id, offset, max_count=64)
        assert res.status is GetStatus.FOUND, (topic, queue_id, offset, res.status)
        out += zip(res.queue_offsets, (bytes(v) for v in res.records), strict=True)
        assert res.next_offset > offset
        offset = res.next_offset
    return out


def walk(log: MessageLog, seg: int = SEG) -> list[tuple[int, int]]:
    """(phys, size) of every record from the log's min to max offset, parsed from ``read_log``.

    Checks on the way that no chunk crosses a segment end and that BLANK padding runs exactly
    to its segment's end.
    """
    out: list[tuple[int, int]] = []
    pos, end = log.min_physical_offset, log.max_physical_offset
    while pos < end:
        chunk = log.read_log(pos, 1 << 30)
        assert chunk, f"read_log({pos}) is empty below the log end {end}"
        seg_end = (pos // seg + 1) * seg
        assert pos + len(chunk) <= seg_end, "read_log crossed a segment end"
        i = 0
        while i < len(chunk):
            size, magic = HEAD.unpack_from(chunk, i)
            if magic == BLANK_MAGIC:
                assert pos + i + size == seg_end
                assert pos + len(chunk) == seg_end
                break
            assert magic == MAGIC_V1 and size > 0, (pos + i, size, magic)
            out.append((pos + i, size))
            i += size
        pos += len(chunk)
    assert pos == end
    return out


def raw_log(log: MessageLog) -> bytes:
    out = bytearray()
    pos = log.min_physical_offset
    while pos < log.max_physical_offset:
        chunk = log.read_log(pos, 1 << 30)
        assert chunk
        out += chunk
        pos += len(chunk)
    return bytes(out)


def replicate(src: MessageLog, dst: MessageLog, chunk_sizes: Iterator[int] | None = None) -> int:
    """Feed ``dst`` from ``src`` as a slave would; returns how many transfers it took."""
    n = 0
    while True:
        size = next(chunk_sizes) if chunk_sizes is not None else 1000
        data = src.read_log(dst.max_physical_offset, size)
        if not data:
            return n
        end = dst.append_replicated(dst.max_physical_offset, data)
        assert end == dst.max_physical_offset
        n += 1


def awkward_chunks() -> Iterator[int]:
    sizes = [1000, 1, 7, 8, 9, 91, 1000, 4093, 65536, 333]
    while True:
        yield from sizes


def keys_of(log: MessageLog, topic: str, key: str, max_count: int = 1000,
            span: tuple[int, int] = FOREVER) -> list[int]:
    res = log.query_keys(topic, key, max_count, *span)
    assert len(res.records) == len(res.physical_offsets)
    for view, phys in zip(res.records, res.physical_offsets, strict=True):
        m = decode(view)
        assert m.commit_log_offset == phys
        assert m.topic == topic
        assert key in m.index_keys()
    return res.physical_offsets


def snapshot(
    log: MessageLog, topics_keys: dict[str, list[str]] | None = None, seg: int = SEG
) -> dict[str, Any]:
    """Everything observable about a log, for before/after comparisons."""
    queues = {k: v for k, v in log.queues().items() if v}
    snap: dict[str, Any] = {
        "min_phys": log.min_physical_offset,
        "max_phys": log.max_physical_offset,
        "queues": queues,
        "bounds": {k: log.bounds(*k) for k in queues},
        "reads": {k: read_all(log, *k) for k in queues},
        "raw": raw_log(log),
        "records": walk(log, seg),
        "times": {k: [log.store_time_at(*k, o) for o in range(*log.bounds(*k))] for k in queues},
    }
    snap["lookups"] = {p: bytes(log.lookup(p) or b"") for p, _ in snap["records"]}
    if topics_keys:
        snap["keys"] = {(t, k): keys_of(log, t, k) for t, ks in topics_keys.items() for k in ks}
    return snap


def fill_mixed(log: MessageLog, clock: ManualClock, n: int, seed: int = 7) -> dict[str, list[str]]:
    """Append ``n`` varied messages over three topics and queues 0..2, bodies big enough to
    roll segments; returns the keys used per topic."""
    rnd = random.Random(seed)
    used: dict[str, list[str]] = {}
    batch: list[Message] = []
    for i in range(n):
        topic = rnd.choice(["alpha", "beta", "gamma"])
        key = f"k{rnd.randrange(20)}"
        used.setdefault(topic, [])
        if key not in used[topic]:
            used[topic].append(key)
        props = {Prop.UNIQ_KEY: f"U{i:06d}"}
        batch.append(message(topic, rnd.randbytes(rnd.randrange(0, 3000)),
                             queue_id=rnd.randrange(3), tags=rnd.choice(["a", "b", None]),
                             keys=f"{key} all", props=props))
        if len(batch) == 10 or i == n - 1:
            append(log, *batch)
            batch = []
            clock.advance(rnd.choice([0, 0.001, 0.5, 3]))
    for ks in used.values():
        ks.append("all")
    return used


# --- append ------------------------------------------------------------------------------------


def test_queue_offsets_are_dense_per_topic_and_queue(open_log: OpenLog) -> None:
    log = open_log()
    expected: dict[tuple[str, int], int] = {}
    rnd = random.Random(1)
    for _ in range(6):
        batch = [message(rnd.choice(["A", "B"]), b"x", queue_id=rnd.randrange(3))
                 for _ in range(rnd.randrange(1, 30))]
        for m, r in zip(batch, append(log, *batch), strict=True):
            key = (m.topic, m.queue_id)
            assert r.queue_offset == expected.get(key, 0)
            expected[key] = r.queue_offset + 1
    assert log.queues() == expected
    for (topic, q), n in expected.items():
        assert log.bounds(topic, q) == (0, n)
        assert [qo for qo, _ in read_all(log, topic, q)] == list(range(n))
    assert log.bounds("A", 7) == (0, 0)
    assert log.bounds("nope", 0) == (0, 0)


def test_physical_offsets_are_byte_positions(open_log: OpenLog) -> None:
    log = open_log()
    rnd = random.Random(2)
    msgs = [message("T", rnd.randbytes(rnd.randrange(0, 5000)), queue_id=i % 2)
            for i in range(160)]
    results = append(log, *msgs)
    assert results[0].physical_offset == 0
    rolls = 0
    for m, (prev, cur) in zip(msgs[1:], itertools.pairwise(results), strict=True):
        assert cur.size == len(encode(m))
        if prev.end_offset % SEG + cur.size + 8 <= SEG:
            assert cur.physical_offset == prev.end_offset
        else:
            rolls += 1
            assert cur.physical_offset == (prev.end_offset // SEG + 1) * SEG
    assert rolls >= 5
    assert log.max_physical_offset == results[-1].end_offset
    assert walk(log) == [(r.physical_offset, r.size) for r in results]
    for r in results:
        view = log.lookup(r.physical_offset)
        assert view is not None and len(view) == r.size
        assert log.read_log(r.physical_offset, r.size) == bytes(view)


def test_msg_id_is_the_offset_msg_id_of_the_store_host(open_log: OpenLog) -> None:
    host = ("10.1.2.3", 10912)
    log = open_log(store_host=host)
    results = append(log, *(message("T", b"x" * i) for i in range(50)))
    for r in results:
        assert r.msg_id == offset_msg_id(host, r.physical_offset)
        assert len(r.msg_id) == 32
        assert decode(at(log, r.physical_offset)).store_host == host


def test_records_read_back_as_the_message_with_broker_fields_patched(
    open_log: OpenLog, clock: ManualClock
) -> None:
    host = ("192.168.7.9", 30911)
    log = open_log(store_host=host)
    msgs = [
        message("T", b"hello", tags="TagA", keys="k1 k2", flag=5,
                props={Prop.UNIQ_KEY: "AC1100010000", "custom": "v"},
                born_timestamp=1_600_000_000_123, born_host=("10.0.0.1", 5555),
                reconsume_times=3, prepared_transaction_offset=77),
        message("T", b"", queue_id=2),  # smallest record
        new_message("T", bytes(range(256)) * 40, tags="big"),  # compressed by the producer
        message("T", b"v6", born_host=("2001:db8::1", 9876)),  # 20-byte born host
    ]
    assert msgs[2].sysflag & sf.COMPRESSED
    results = append(log, *msgs)
    for m, r in zip(msgs, results, strict=True):
        got = decode(at(log, r.physical_offset))
        assert got == stored(m, r, host)
        assert got.store_timestamp == clock.now_ms()
        res = log.read(m.topic, m.queue_id, r.queue_offset, max_count=1)
        assert res.status is GetStatus.FOUND
        assert decode(res.records[0]) == got
    assert decode(at(log, results[2].physical_offset)).payload() == bytes(range(256)) * 40
    # The caller's encoded bytes are copied, not patched in place.
    rec = put_record(msgs[0])
    before = bytes(rec.data)
    log.append([rec, rec])
    assert bytes(rec.data) == before


def test_store_times_follow_the_clock_and_never_go_backwards(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()
    t0 = clock.now_ms()
    assert append(log, message())[0].store_timestamp == t0
    clock.advance(2.5)
    assert append(log, message())[0].store_timestamp == t0 + 2500
    clock.advance(-10)  # the wall clock stepped back
    r = append(log, message(), message())
    assert [x.store_timestamp for x in r] == [t0 + 2500] * 2
    clock.advance(20)
    assert append(log, message())[0].store_timestamp == t0 + 12_500
    times = [log.store_time_at("T", 0, o) for o in range(5)]
    assert times == sorted(times)
    assert [decode(v).store_timestamp for _, v in read_all(log, "T", 0)] == times


def test_store_times_never_go_backwards_across_a_restart(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()
    last = append(log, message(), message())[-1].store_timestamp
    log.close()
    clock.advance(-3600)
    log = open_log()
    r = append(log, message())[0]
    assert r.store_timestamp == last  # not the clock's: offset_for_time needs sorted times
    assert [log.store_time_at("T", 0, o) for o in range(3)] == [last] * 3
    assert log.offset_for_time("T", 0, last + 1) == 3
    clock.advance(7200)
    assert append(log, message())[0].store_timestamp == clock.now_ms()


@pytest.mark.parametrize("kind", [sf.TRANSACTION_PREPARED_TYPE, sf.TRANSACTION_ROLLBACK_TYPE])
def test_prepared_and_rollback_records_have_no_queue_entry(open_log: OpenLog, kind: int) -> None:
    log = open_log()
    only = append(log, message("H", b"half", sysflag=kind, keys="hk"))[0]
    assert only.queue_offset == 0
    assert log.bounds("H", 0) == (0, 0)
    assert log.read("H", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert ("H", 0) not in log.queues() or log.queues()[("H", 0)] == 0
    msgs = [
        message("T", b"a", keys="k"),
        message("T", b"b", sysflag=kind, keys="k"),
        message("T", b"c", sysflag=sf.TRANSACTION_COMMIT_TYPE, keys="k"),
        message("T", b"d", sysflag=kind, keys="k"),
        message("T", b"e", keys="k"),
    ]
    results = append(log, *msgs)
    assert [r.queue_offset for r in results] == [0, 0, 1, 0, 2]
    assert log.bounds("T", 0) == (0, 3)
    assert [decode(v).body for _, v in read_all(log, "T", 0)] == [b"a", b"c", b"e"]
    for m, r in zip(msgs, results, strict=True):
        view = log.lookup(r.physical_offset)
        assert view is not None
        assert decode(view) == stored(m, r)
    # Prepared records are indexed (RocketMQ indexes every type but rollback).
    indexed = [r.physical_offset for m, r in zip(msgs, results, strict=True)
               if kind != sf.TRANSACTION_ROLLBACK_TYPE or m.sysflag & sf.TRANSACTION_MASK != kind]
    assert keys_of(log, "T", "k") == indexed[::-1]
    assert keys_of(log, "H", "hk") == ([] if kind == sf.TRANSACTION_ROLLBACK_TYPE
                                       else [only.physical_offset])


def test_oversize_records_are_illegal_and_write_nothing(open_log: OpenLog) -> None:
    log = open_log(max_message_size=1024)
    append(log, message("T", b"first"))
    end = log.max_physical_offset
    bad = log.append([put_record(sized(1025))])
    assert [r.status for r in bad] == [PutStatus.MESSAGE_ILLEGAL]
    assert log.max_physical_offset == end
    assert log.bounds("T", 0) == (0, 1)
    assert walk(log) == [(0, end)]
    mixed = log.append([put_record(m) for m in (sized(1024), sized(4000), sized(200))])
    assert [r.status for r in mixed] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL,
                                         PutStatus.PUT_OK]
    assert [mixed[0].queue_offset, mixed[2].queue_offset] == [1, 2]
    assert mixed[2].physical_offset == mixed[0].end_offset
    assert log.bounds("T", 0) == (0, 3)


def test_records_bigger_than_a_segment_allows_are_illegal(open_log: OpenLog) -> None:
    log = open_log()  # max_message_size is 4 MiB, but a record never spans segments
    append(log, message())
    r = log.append([put_record(sized(SEG - 7)), put_record(sized(SEG - 8))])
    assert [x.status for x in r] == [PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
    assert r[1].physical_offset == SEG  # a whole segment but its last 8 bytes
    assert log.max_physical_offset == 2 * SEG - 8
    assert walk(log) == [(0, len(encode(message()))), (SEG, SEG - 8)]


# --- segment roll-over -------------------------------------------------------------------------


def fill_to(log: MessageLog, pos: int) -> None:
    """Append records until the log end is exactly ``pos`` (same segment)."""
    while log.max_physical_offset < pos:
        gap = pos - log.max_physical_offset
        append(log, sized(gap if gap < 5000 else min(4000, gap - 1000), "F"))
    assert log.max_physical_offset == pos


@pytest.mark.parametrize("left", [8, 9, 100])
def test_record_leaving_at_least_8_bytes_fits(open_log: OpenLog, left: int) -> None:
    log = open_log()
    fill_to(log, 1000)
    r = append(log, sized(SEG - 1000 - left))[0]
    assert (r.physical_offset, r.end_offset) == (1000, SEG - left)
    nxt = append(log, message("T", b"next"))[0]
    assert nxt.physical_offset == SEG
    pad = log.read_log(SEG - left, 1000)  # never crosses into the next segment
    assert HEAD.unpack_from(pad) == (left, BLANK_MAGIC)
    assert len(pad) == left
    assert log.lookup(SEG - left) is None
    assert decode(at(log, SEG)).body == b"next"
    assert walk(log)[-2:] == [(1000, SEG - 1000 - left), (SEG, nxt.size)]


@pytest.mark.parametrize("left", [0, 1, 7])
def test_record_leaving_fewer_than_8_bytes_rolls(open_log: OpenLog, left: int) -> None:
    log = open_log()
    fill_to(log, 2000)
    r = append(log, sized(SEG - 2000 - left, queue_id=1))[0]
    assert r.physical_offset == SEG
    assert log.max_physical_offset == 2 * SEG - 2000 - left
    blank = log.read_log(2000, 1 << 20)
    assert len(blank) == SEG - 2000
    assert HEAD.unpack_from(blank) == (SEG - 2000, BLANK_MAGIC)
    assert log.lookup(2000) is None
    assert log.read("T", 1, 0).records[0].tobytes() == log.read_log(SEG, r.size)
    assert walk(log)[-1] == (SEG, r.size)


def test_reads_across_segments_return_everything_in_order(open_log: OpenLog) -> None:
    log = open_log()
    rnd = random.Random(3)
    msgs = [message("T", rnd.randbytes(rnd.randrange(500, 3000)), keys=f"key{i}")
            for i in range(150)]
    results = append(log, *msgs)
    assert results[-1].physical_offset >= 3 * SEG
    got = [decode(v) for _, v in read_all(log, "T", 0)]
    assert got == [stored(m, r) for m, r in zip(msgs, results, strict=True)]
    one = log.read("T", 0, 0, max_count=150, max_bytes=1 << 30)
    assert one.status is GetStatus.FOUND
    assert one.queue_offsets == list(range(150))
    assert one.next_offset == 150
    assert [bytes(v) for v in one.records] == [bytes(at(log, r.physical_offset))
                                               for r in results]
    for i, (prev, cur) in enumerate(itertools.pairwise(results)):
        if cur.physical_offset // SEG != prev.physical_offset // SEG:  # either side of a roll
            for j in (i, i + 1):
                assert decode(at(log, results[j].physical_offset)) == stored(
                    msgs[j], results[j])
            assert keys_of(log, "T", f"key{i}") == [prev.physical_offset]
            assert keys_of(log, "T", f"key{i + 1}") == [cur.physical_offset]
    assert walk(log) == [(r.physical_offset, r.size) for r in results]


def test_read_log_stops_at_the_log_end_and_segment_ends(open_log: OpenLog) -> None:
    log = open_log()
    assert log.read_log(0, 100) == b""
    r = append(log, *(sized(3000) for _ in range(30)))
    end = log.max_physical_offset
    assert log.read_log(end, 100) == b""
    assert log.read_log(end - 10, 100) == log.read_log(r[-1].physical_offset, 1 << 20)[-10:]
    assert len(log.read_log(0, 1 << 30)) == SEG
    assert log.read_log(SEG - 100, 1 << 30) == log.read_log(0, 1 << 30)[-100:]
    assert log.read_log(r[5].physical_offset, 10) == bytes(at(log, r[5].physical_offset))[:10]


# --- read statuses -----------------------------------------------------------------------------


def test_read_unknown_queue_is_no_message_in_queue(open_log: OpenLog) -> None:
    log = open_log()
    for offset in (0, 5):
        res = log.read("T", 0, offset)
        assert (res.status, res.next_offset, res.min_offset, res.max_offset) == (
            GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        assert res.records == []
    append(log, message("T", queue_id=1))
    assert log.read("T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert log.read("U", 1, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE


def test_read_status_at_and_past_the_end(open_log: OpenLog) -> None:
    log = open_log()
    append(log, *(message("T", b"m") for _ in range(5)))
    res = log.read("T", 0, 5)
    assert (res.status, res.next_offset, res.min_offset, res.max_offset) == (
        GetStatus.OFFSET_OVERFLOW_ONE, 5, 0, 5)
    assert res.records == []
    assert GetStatus.NO_NEW_MESSAGE is GetStatus.OFFSET_OVERFLOW_ONE
    for offset in (6, 1000):  # min is 0: start over from 0
        res = log.read("T", 0, offset)
        assert (res.status, res.next_offset, res.min_offset, res.max_offset) == (
            GetStatus.OFFSET_OVERFLOW_BADLY, 0, 0, 5)
    res = log.read("T", 0, 4)
    assert (res.status, res.next_offset, res.queue_offsets) == (GetStatus.FOUND, 5, [4])


def test_read_status_below_the_minimum_after_expiry(open_log: OpenLog) -> None:
    log = open_log()
    results = append(log, *(sized(2000) for _ in range(100)))
    log.expire(force=True)
    log.expire(force=True)
    assert log.min_physical_offset == 2 * SEG
    lo = next(r.queue_offset for r in results if r.physical_offset >= 2 * SEG)
    assert log.bounds("T", 0) == (lo, 100)
    for offset in (0, lo - 1):
        res = log.read("T", 0, offset)
        assert (res.status, res.next_offset, res.min_offset, res.max_offset) == (
            GetStatus.OFFSET_TOO_SMALL, lo, lo, 100)
        assert res.records == []
    for offset in (101, 5000):  # min is not 0: go to the max
        res = log.read("T", 0, offset)
        assert (res.status, res.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 100)
    assert log.read("T", 0, 100).status is GetStatus.OFFSET_OVERFLOW_ONE
    res = log.read("T", 0, lo, max_count=1)
    assert res.status is GetStatus.FOUND
    assert decode(res.records[0]).commit_log_offset == results[lo].physical_offset


def test_read_honours_max_count_and_max_bytes(open_log: OpenLog) -> None:
    log = open_log()
    results = append(log, *(sized(200, queue_id=3) for _ in range(40)))
    res = log.read("T", 3, 5, max_count=7)
    assert (res.status, res.next_offset, res.queue_offsets) == (
        GetStatus.FOUND, 12, list(range(5, 12)))
    assert res.min_offset == 0 and res.max_offset == 40
    assert res.last_physical_offset == results[11].physical_offset
    assert res.total_bytes == 7 * 200
    res = log.read("T", 3, 5, max_count=32, max_bytes=450)
    assert (res.next_offset, res.queue_offsets) == (7, [5, 6])
    res = log.read("T", 3, 5, max_count=32, max_bytes=600)
    assert (res.next_offset, len(res.records)) == (8, 3)
    res = log.read("T", 3, 5, max_count=32, max_bytes=100)  # one record even if too big
    assert (res.status, res.next_offset, res.queue_offsets) == (GetStatus.FOUND, 6, [5])
    res = log.read("T", 3, 38, max_count=32)
    assert (res.next_offset, res.queue_offsets) == (40, [38, 39])
    res = log.read("T", 3, 0, max_count=100, max_bytes=1 << 30)
    assert res.next_offset == 40
    assert [bytes(v) for v in res.records] == [bytes(at(log, r.physical_offset))
                                               for r in results]


def tag_is(*tags: str) -> Callable[[int], bool]:
    codes = {tags_code(t) for t in tags}
    return lambda code: code in codes


def test_tag_filter_skips_by_tags_code(open_log: OpenLog) -> None:
    log = open_log()
    tags = ["a", "b", "b", "a", "c", "b", "a", None, "a", "b"]
    results = append(log, *(message("T", bytes([i]), tags=t) for i, t in enumerate(tags)))
    a = [i for i, t in enumerate(tags) if t == "a"]
    res = log.read("T", 0, 0, tag_filter=tag_is("a"))
    assert (res.status, res.queue_offsets, res.next_offset) == (GetStatus.FOUND, a, 10)
    assert [decode(v).tags for v in res.records] == ["a"] * 4
    # A full batch stops before the next entry; skipped entries count towards next_offset.
    res = log.read("T", 0, 1, max_count=2, tag_filter=tag_is("a"))
    assert (res.queue_offsets, res.next_offset) == ([3, 6], 7)
    res = log.read("T", 0, 0, max_count=2, tag_filter=tag_is("a", "c"))
    assert (res.queue_offsets, res.next_offset) == ([0, 3], 4)
    res = log.read("T", 0, 0, tag_filter=tag_is("b", "c"), max_count=32)
    assert res.queue_offsets == [1, 2, 4, 5, 9]
    untagged = log.read("T", 0, 0, tag_filter=lambda code: code == 0)
    assert untagged.queue_offsets == [7]
    # Nothing matches: NO_MATCHED_MESSAGE, and the scan moves the consumer on.
    res = log.read("T", 0, 2, tag_filter=tag_is("zzz"))
    assert (res.status, res.next_offset, res.records) == (GetStatus.NO_MATCHED_MESSAGE, 10, [])
    assert (res.min_offset, res.max_offset) == (0, 10)
    assert res.last_physical_offset == results[9].physical_offset


def test_no_matched_message_scans_a_bounded_stretch(open_log: OpenLog) -> None:
    log = open_log()
    append(log, *(message("T", tags="a") for _ in range(1000)))
    append(log, message("T", b"wanted", tags="b"))
    offset = 10
    steps = 0
    while True:
        res = log.read("T", 0, offset, tag_filter=tag_is("b"))
        steps += 1
        if res.status is GetStatus.FOUND:
            assert res.queue_offsets == [1000]
            assert decode(res.records[0]).body == b"wanted"
            break
        assert res.status is GetStatus.NO_MATCHED_MESSAGE
        assert offset < res.next_offset <= min(offset + 800, 1000)  # RocketMQ: 16000 CQ bytes
        offset = res.next_offset
    assert steps >= 2


# --- key queries -------------------------------------------------------------------------------


def test_query_by_keys_and_uniq_key(open_log: OpenLog) -> None:
    log = open_log()
    msgs = [
        message("T", b"0", keys="order-1 cust-9", props={Prop.UNIQ_KEY: "U0"}),
        message("T", b"1", keys="order-2", props={Prop.UNIQ_KEY: "U1"}, queue_id=2),
        message("T", b"2", keys="cust-9", props={Prop.UNIQ_KEY: "U2"}),
        message("Other", b"3", keys="order-1 cust-9", props={Prop.UNIQ_KEY: "U0"}),
        message("T", b"4", keys="order-1  ", props={Prop.UNIQ_KEY: "U4"}),
        message("T", b"5", keys="dup dup U5", props={Prop.UNIQ_KEY: "U5"}),
    ]
    r = [x.physical_offset for x in append(log, *msgs)]
    assert keys_of(log, "T", "dup") == [r[5]]  # each record once, however often it is indexed
    assert keys_of(log, "T", "U5") == [r[5]]
    assert keys_of(log, "T", "order-1") == [r[4], r[0]]  # newest first
    assert keys_of(log, "T", "cust-9") == [r[2], r[0]]
    assert keys_of(log, "T", "order-2") == [r[1]]
    assert keys_of(log, "T", "U1") == [r[1]]
    assert keys_of(log, "T", "U0") == [r[0]]  # same UNIQ_KEY in another topic stays there
    assert keys_of(log, "Other", "U0") == [r[3]]
    assert keys_of(log, "Other", "order-1") == [r[3]]
    assert keys_of(log, "T", "order") == []
    assert keys_of(log, "T", "") == []
    assert keys_of(log, "Nope", "order-1") == []
    res = log.query_keys("T", "cust-9", 10, *FOREVER)
    assert [decode(v) for v in res.records] == [decode(at(log, p)) for p in (r[2], r[0])]
    assert res.index_last_update_physical_offset == r[5]
    assert res.index_last_update_timestamp == decode(at(log, r[5])).store_timestamp


def test_query_keys_honours_max_count(open_log: OpenLog) -> None:
    log = open_log()
    r = [x.physical_offset for x in append(log, *(message("T", keys="hot") for _ in range(30)))]
    for n in (1, 3, 30, 100):
        assert keys_of(log, "T", "hot", max_count=n) == r[::-1][:n]


def test_query_keys_honours_store_time_bounds_exactly(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()
    t0 = clock.now_ms()
    times = [0, 1, 999, 1000, 1001, 1999, 2000, 2500, 5000, 5001, 65_000]
    recs: list[tuple[int, int]] = []
    for dt in times:
        clock.ms = t0 + dt
        recs.append((t0 + dt, append(log, message("T", keys="k"))[0].physical_offset))
    edges = sorted({t0 + dt + d for dt in times for d in (-1, 0, 1)})
    for begin in edges:
        for end in edges:
            want = [p for t, p in reversed(recs) if begin <= t <= end]
            assert keys_of(log, "T", "k", span=(begin, end)) == want, (begin - t0, end - t0)


def test_query_keys_finds_old_records_behind_many_newer_candidates(
    open_log: OpenLog, clock: ManualClock
) -> None:
    """Newer records of the same key whose store time is past the range (but in the same
    second) must not crowd the in-range ones out of the answer."""
    log = open_log()
    t0 = clock.now_ms()
    old = append(log, message("T", keys="k"))[0].physical_offset
    clock.advance(1.5)
    append(log, *(message("T", keys="k") for _ in range(60)))
    assert keys_of(log, "T", "k", max_count=1, span=(t0, t0 + 1000)) == [old]
    assert keys_of(log, "T", "k", max_count=5, span=(t0 - 5000, t0 + 1499)) == [old]


def test_index_files_roll_over_and_old_keys_stay_findable(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()  # 199 index entries a file; each message has three keys
    r: list[AppendResult] = []
    for i in range(0, 400, 20):
        r += append(log, *(message("T", keys=f"key{j} even{j % 2}",
                                   props={Prop.UNIQ_KEY: f"U{j}"}) for j in range(i, i + 20)))
        clock.advance(0.7)
    for j in (0, 1, 66, 67, 133, 250, 399):
        assert keys_of(log, "T", f"key{j}") == [r[j].physical_offset]
        assert keys_of(log, "T", f"U{j}") == [r[j].physical_offset]
    evens = keys_of(log, "T", "even0", max_count=1000)
    assert evens == [x.physical_offset for x in r[::2]][::-1]
    t_mid = r[200].store_timestamp
    assert keys_of(log, "T", "even1", span=(0, t_mid)) == [
        x.physical_offset for j, x in enumerate(r) if j % 2 and x.store_timestamp <= t_mid][::-1]


def test_messages_with_many_keys_stay_findable(open_log: OpenLog) -> None:
    log = open_log()  # 199 index entries a file: three such messages need several files
    words = [[f"m{i}w{j}" for j in range(120)] for i in range(3)]
    r = append(log, *(message("T", keys=" ".join(ws)) for ws in words))
    for ws, x in zip(words, r, strict=True):
        for w in (ws[0], ws[59], ws[-1]):
            assert keys_of(log, "T", w) == [x.physical_offset]
    # More keys than a whole index file holds (this once looped forever making files).
    huge = [f"h{j}" for j in range(450)]
    x = append(log, message("T", keys=" ".join(huge)))[0]
    for w in (huge[0], huge[198], huge[199], huge[449]):
        assert keys_of(log, "T", w) == [x.physical_offset]


# --- offset for time ---------------------------------------------------------------------------


def test_offset_for_time_and_store_time_at(open_log: OpenLog, clock: ManualClock) -> None:
    log = open_log()
    t0 = clock.now_ms()
    stamps: list[int] = []
    for step in range(12):
        clock.ms = t0 + step * 10_000
        for r in append(log, *(message("T", b"x", queue_id=1) for _ in range(step % 3 + 1))):
            stamps.append(r.store_timestamp)
    n = len(stamps)
    assert [log.store_time_at("T", 1, o) for o in range(n)] == stamps
    for o in (-1, n, n + 5):
        assert log.store_time_at("T", 1, o) == -1
    assert log.store_time_at("T", 0, 0) == -1
    assert log.store_time_at("U", 1, 0) == -1
    assert log.offset_for_time("T", 1, 0) == 0
    assert log.offset_for_time("T", 1, t0 - 1) == 0
    assert log.offset_for_time("T", 1, stamps[-1] + 1) == n
    assert log.offset_for_time("T", 1, 2**62) == n
    for ts in sorted({s + d for s in stamps for d in (-1, 0, 1)}):
        assert log.offset_for_time("T", 1, ts) == next(
            (i for i, s in enumerate(stamps) if s >= ts), n), ts - t0


def test_offset_for_time_after_expiry_starts_at_the_minimum(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()
    results: list[AppendResult] = []
    for _ in range(10):
        results += append(log, *(sized(1500) for _ in range(10)))
        clock.advance(1)
    log.expire(force=True)
    lo, hi = log.bounds("T", 0)
    assert lo > 0
    assert log.offset_for_time("T", 0, 0) == lo
    assert log.offset_for_time("T", 0, results[lo].store_timestamp) == lo
    assert log.offset_for_time("T", 0, 2**62) == hi
    assert log.store_time_at("T", 0, lo - 1) == -1
    assert log.store_time_at("T", 0, lo) == results[lo].store_timestamp


def test_offset_for_time_after_a_cut_answers_for_the_records_written_again(
    open_log: OpenLog, clock: ManualClock
) -> None:
    """Backends keep sampled store times of long queues in memory; a cut must drop them,
    or a lookup would be steered by times of records that are gone."""
    log = open_log()
    old: list[AppendResult] = []
    for _ in range(700):
        old += append(log, message("T", b"x"))
        clock.advance(10)
    assert log.offset_for_time("T", 0, old[650].store_timestamp) == 650
    log.truncate(old[300].physical_offset)
    clock.advance(60_000)
    new: list[AppendResult] = []
    for _ in range(400):
        new += append(log, message("T", b"y"))
        clock.advance(10)
    assert [r.queue_offset for r in new] == list(range(300, 700))
    for r in (new[0], new[212], new[399]):
        assert log.offset_for_time("T", 0, r.store_timestamp) == r.queue_offset
    assert log.offset_for_time("T", 0, old[299].store_timestamp) == 299
    assert log.offset_for_time("T", 0, old[299].store_timestamp + 1) == 300


# --- durability --------------------------------------------------------------------------------


def test_sync_flush_wait_durable(open_log: OpenLog) -> None:
    log = open_log(flush=FlushMode.SYNC_FLUSH)
    r = append(log, *(sized(3000) for _ in range(30)))[-1]
    assert log.wait_durable(r.end_offset, 5.0) is True
    assert log.durable_offset >= r.end_offset
    assert log.wait_durable(0, 5.0) is True
    done = threading.Event()
    got: list[bool] = []

    def cb(ok: bool) -> None:
        got.append(ok)
        done.set()

    r = append(log, message())[0]
    log.on_durable(r.end_offset, cb, 5.0)
    assert done.wait(5.0)
    assert got == [True]
    assert log.durable_offset >= r.end_offset


def test_sync_flush_serves_many_concurrent_writers(open_log: OpenLog) -> None:
    log = open_log(flush=FlushMode.SYNC_FLUSH)
    outcomes: list[tuple[int, bool]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for j in range(10):
                r = append(log, message("T", b"x" * (i * 37 + j), queue_id=i % 3))[0]
                ok = log.wait_durable(r.end_offset, 10.0)
                with lock:
                    outcomes.append((r.end_offset, ok))
                assert log.durable_offset >= r.end_offset
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(outcomes) == 160 and all(ok for _, ok in outcomes)
    assert sum(log.bounds("T", q)[1] for q in range(3)) == 160
    assert log.durable_offset >= max(end for end, _ in outcomes)


def test_async_flush_does_not_block_waiters(open_log: OpenLog) -> None:
    """Under ASYNC_FLUSH a writer is acknowledged as soon as its record is appended: no wait
    for a flush round, here an hour away, and the callback runs before ``on_durable`` returns."""
    log = open_log(flush_interval_ms=3_600_000, flush_thorough_interval_ms=3_600_000)
    r = append(log, *(sized(3000) for _ in range(30)))[-1]
    assert log.wait_durable(r.end_offset, 0.0) is True
    got: list[bool] = []
    log.on_durable(r.end_offset, got.append, 0.0)
    assert got == [True]
    log.flush()
    assert log.durable_offset >= log.max_physical_offset


# --- dispatch ----------------------------------------------------------------------------------


def test_dispatch_subscribers_see_records_already_readable(open_log: OpenLog) -> None:
    log = open_log()
    seen: list[Dispatched] = []
    problems: list[str] = []

    def on_dispatch(batch: Any) -> None:
        for d in batch:
            res = log.read(d.topic, d.queue_id, d.queue_offset, max_count=1)
            if res.status is not GetStatus.FOUND or res.queue_offsets != [d.queue_offset]:
                problems.append(f"{d}: {res.status}")
            elif bytes(res.records[0]) != bytes(log.lookup(d.physical_offset) or b""):
                problems.append(f"{d}: other bytes")
            seen.append(d)

    unsubscribe = log.subscribe_dispatch(on_dispatch)
    msgs = [
        message("T", b"1", tags="a", queue_id=1),
        message("T", b"2", sysflag=sf.TRANSACTION_PREPARED_TYPE),
        message("U", b"3", tags="b", sysflag=sf.TRANSACTION_COMMIT_TYPE),
        sized(SEG - 2000),  # rolls
    ]
    results = append(log, *msgs)
    assert not problems
    want = [
        Dispatched(m.topic, m.queue_id, r.queue_offset, r.physical_offset, r.size,
                   tags_code(m.tags), r.store_timestamp, m.sysflag)
        for m, r in zip(msgs, results, strict=True)
        if sf.has_consume_queue_entry(m.sysflag)
    ]
    assert seen == want
    unsubscribe()
    unsubscribe()  # idempotent
    append(log, message("T"))
    assert seen == want


def test_a_subscriber_comes_in_after_the_append_under_way(open_log: OpenLog) -> None:
    """An append decides as it starts whether to report its batch: one under way (here: the
    put lock held, as an append holds it) when a listener subscribes must finish first, or a
    listener that reads and then waits for reports (the embedded ``subscribe``) would not see
    its records until some later append woke it."""
    log = open_log()
    subscribed = threading.Event()

    def subscribe() -> None:
        log.subscribe_dispatch(lambda batch: None)
        subscribed.set()

    with log._put_lock:  # type: ignore[attr-defined]
        t = threading.Thread(target=subscribe)
        t.start()
        assert not subscribed.wait(0.3), "subscribed while an append was under way"
    assert subscribed.wait(10), "the subscription never came in after the append"
    t.join(10)


def test_a_failing_subscriber_does_not_break_appends(open_log: OpenLog) -> None:
    log = open_log()
    calls: list[int] = []

    def bad(batch: Any) -> None:
        calls.append(len(batch))
        raise RuntimeError("subscriber bug")

    log.subscribe_dispatch(bad)
    r = append(log, message(), message())
    assert calls == [2]
    assert log.read("T", 0, 0).queue_offsets == [0, 1]
    assert r[1].queue_offset == 1


def test_a_listener_hears_while_what_it_wants_holds_something(open_log: OpenLog) -> None:
    """A listener with what it waits for (parked pulls, slaves) hears the batches appended
    while that holds something, readable as ever, and no others; the same callback subscribed
    twice is two listeners, each unsubscribed on its own."""
    log = open_log()
    wanted: list[str] = []
    heard: list[tuple[str, int]] = []
    problems: list[str] = []

    def on_dispatch(batch: Any) -> None:
        for d in batch:
            if log.read(d.topic, d.queue_id, d.queue_offset).status is not GetStatus.FOUND:
                problems.append(f"{d} unreadable")
            heard.append((d.topic, d.queue_offset))

    gated = log.subscribe_dispatch(on_dispatch, wanted=wanted)
    append(log, message("T"))
    wanted.append("a parked pull")
    append(log, message("T"), message("U"))
    wanted.clear()
    append(log, message("T"))
    assert heard == [("T", 1), ("U", 0)]
    assert not problems
    plain = log.subscribe_dispatch(on_dispatch)
    wanted.append("a slave")
    append(log, message("U"))
    assert heard[2:] == [("U", 1), ("U", 1)]
    gated()
    append(log, message("U"))
    assert heard[4:] == [("U", 2)]
    plain()
    append(log, message("U"))
    assert heard[5:] == []


# --- replication -------------------------------------------------------------------------------


def test_replica_fed_read_log_in_awkward_chunks_converges(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path
) -> None:
    a = open_log(tmp_path / "a")
    b = open_log(tmp_path / "b")
    a_seen: list[Dispatched] = []
    b_seen: list[Dispatched] = []
    a.subscribe_dispatch(a_seen.extend)
    b.subscribe_dispatch(b_seen.extend)
    chunks = awkward_chunks()
    keys: dict[str, list[str]] = {}
    for rnd in range(3):
        for t, ks in fill_mixed(a, clock, 120, seed=rnd).items():
            keys.setdefault(t, [])
            keys[t] += [k for k in ks if k not in keys[t]]
        append(a, message("tx", b"half", sysflag=sf.TRANSACTION_PREPARED_TYPE, keys="hk"),
               message("tx", b"gone", sysflag=sf.TRANSACTION_ROLLBACK_TYPE, keys="hk"))
        assert replicate(a, b, chunks) > 10
        assert b.max_physical_offset == a.max_physical_offset
    keys["tx"] = ["hk"]
    assert a.max_physical_offset > 5 * SEG
    assert raw_log(b) == raw_log(a)
    assert snapshot(b, keys) == snapshot(a, keys)
    assert b_seen == a_seen
    # The replica carries on as a master would.
    ra, rb = append(a, message("alpha", b"z")), append(b, message("alpha", b"z"))
    assert (ra[0].physical_offset, ra[0].queue_offset) == (rb[0].physical_offset,
                                                          rb[0].queue_offset)


@pytest.mark.parametrize("replica_backend", sorted(BACKENDS))
def test_a_replica_on_another_backend_holds_the_same_log(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path, replica_backend: str
) -> None:
    """Offsets are byte positions on every backend, BLANK padding included: a slave running
    another backend than its master gets the same bytes at the same offsets, answers every
    query the same, and carries on as the master would."""
    master = open_log(tmp_path / "master")
    keys = fill_mixed(master, clock, 150)
    append(master, message("tx", b"half", sysflag=sf.TRANSACTION_PREPARED_TYPE, keys="hk"))
    keys["tx"] = ["hk"]
    with open_backend(replica_backend, tmp_path / "replica", SMALL, clock=clock,
                      background=False) as replica:
        replicate(master, replica, awkward_chunks())
        assert master.max_physical_offset > 3 * SEG
        assert snapshot(replica, keys) == snapshot(master, keys)
        for m in (message("beta", b"next", queue_id=2, keys="k1"), sized(SEG - 100)):
            [a], [b] = append(master, m), append(replica, m)
            assert (a.physical_offset, a.queue_offset, a.msg_id) == (
                b.physical_offset, b.queue_offset, b.msg_id)


def test_replication_rejects_bytes_that_do_not_continue_the_log(
    open_log: OpenLog, tmp_path: Path
) -> None:
    a = open_log(tmp_path / "a")
    b = open_log(tmp_path / "b")
    append(a, *(sized(700) for _ in range(10)))
    data = a.read_log(0, 1400)
    for wrong in (1, 700, 10**6):
        with pytest.raises(ReplicationError):
            b.append_replicated(wrong, data)
    assert b.max_physical_offset == 0
    b.append_replicated(0, data)
    for wrong in (0, 1399, 1401):
        with pytest.raises(ReplicationError):
            b.append_replicated(wrong, a.read_log(1400, 700))
    assert b.max_physical_offset == 1400
    # A damaged record (body CRC) is refused; the replica keeps what came before it.
    bad = bytearray(a.read_log(1400, 1400))
    bad[700 + 200] ^= 0xFF
    with pytest.raises(ReplicationError):
        b.append_replicated(1400, bytes(bad))
    assert b.max_physical_offset in (1400, 2100)
    assert b.bounds("T", 0)[1] == b.max_physical_offset // 700
    replicate(a, b)
    assert raw_log(b) == raw_log(a)
    assert snapshot(b) == snapshot(a)


def record_boundaries(log: MessageLog) -> list[int]:
    return [p for p, _ in walk(log)]


@pytest.mark.parametrize("where", ["mid-segment", "segment-start", "blank", "zero"])
def test_truncate_drops_the_tail_and_replication_resumes(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path, where: str
) -> None:
    a = open_log(tmp_path / "a")
    b = open_log(tmp_path / "b")
    keys = fill_mixed(a, clock, 200)
    replicate(a, b)
    recs = walk(a)
    if where == "mid-segment":
        cut = recs[len(recs) // 2][0]
    elif where == "segment-start":
        cut = next(p for p, _ in recs if p > 0 and p % SEG == 0)
    elif where == "blank":
        cut = _blank_at(recs)
    else:
        cut = 0
    full = snapshot(a, keys)
    b.truncate(cut)
    assert b.max_physical_offset == cut
    kept = [(p, s) for p, s in recs if p < cut]
    assert walk(b) == kept
    for p, _ in recs:
        assert (b.lookup(p) is not None) == (p < cut)
    for (topic, q), _ in full["queues"].items():
        want = [(qo, v) for qo, v in full["reads"][(topic, q)]
                if decode(v).commit_log_offset < cut]
        assert read_all(b, topic, q) == want
        assert b.bounds(topic, q) == (0, len(want))
        res = b.read(topic, q, len(want))
        assert res.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
    for (topic, key), phys in full["keys"].items():
        assert keys_of(b, topic, key) == [p for p in phys if p < cut]
    replicate(a, b)
    assert snapshot(b, keys) == full


def _blank_at(recs: list[tuple[int, int]]) -> int:
    """The end of the last record of a segment that has BLANK padding after it."""
    for (p, s), (q, _) in itertools.pairwise(recs):
        if q // SEG != p // SEG and p + s < q:
            return p + s
    raise AssertionError("no padded segment")


def test_replica_follows_a_new_master_after_dropping_its_divergent_tail(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path
) -> None:
    """A slave of A truncates to the common prefix and follows C (A's successor): its log, key
    index and queues must then be C's, including records at offsets A's tail used."""
    a = open_log(tmp_path / "a")
    c = open_log(tmp_path / "c")
    b = open_log(tmp_path / "b")
    prefix = [message("T", b"p" * 400, keys=f"p{i}", queue_id=i % 2) for i in range(100)]
    append(a, *prefix)
    append(c, *prefix)
    common = a.max_physical_offset
    assert raw_log(a) == raw_log(c)
    append(a, *(message("T", b"a" * 300, keys=f"a{i} shared", queue_id=i % 2) for i in range(80)))
    append(c, *(message("T", b"c" * 500, keys=f"c{i} shared", queue_id=i % 3)
                for i in range(80)))
    replicate(a, b)
    b.truncate(common)
    assert keys_of(b, "T", "a3") == []
    assert keys_of(b, "T", "shared") == []
    replicate(c, b)
    keys = {"T": [f"c{i}" for i in range(80)] + [f"a{i}" for i in range(80)] + ["shared", "p3"]}
    assert snapshot(b, keys) == snapshot(c, keys)


def test_an_empty_replica_begins_where_its_master_log_begins(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path
) -> None:
    """A master whose first segments expired is followed by an empty replica from its min
    offset on; the replica answers as the master does, also after a reopen."""
    a = open_log(tmp_path / "a")
    keys = fill_mixed(a, clock, 200)
    a.expire(force=True)
    a.expire(force=True)
    begin = a.min_physical_offset
    assert begin > 0
    b = open_log(tmp_path / "b")
    with pytest.raises(ReplicationError):
        b.append_replicated(begin, a.read_log(begin, 1000))
    b.begin_at(begin)
    assert (b.min_physical_offset, b.max_physical_offset) == (begin, begin)
    replicate(a, b, awkward_chunks())
    assert raw_log(b) == raw_log(a)
    assert walk(b) == walk(a)
    for topic, q in a.queues():
        assert b.bounds(topic, q) == a.bounds(topic, q)
        assert read_all(b, topic, q) == read_all(a, topic, q)
    for topic, ks in keys.items():
        for k in ks:
            assert keys_of(b, topic, k) == keys_of(a, topic, k)
    b.close()
    b = open_log(tmp_path / "b")
    assert (b.min_physical_offset, b.max_physical_offset) == (begin, a.max_physical_offset)
    with pytest.raises(ReplicationError):
        b.begin_at(a.max_physical_offset)


def test_local_appends_after_truncate_reuse_the_offsets(open_log: OpenLog) -> None:
    log = open_log()
    r = append(log, *(message("T", b"x" * 100, keys=f"k{i}") for i in range(10)))
    log.truncate(r[6].physical_offset)
    assert log.bounds("T", 0) == (0, 6)
    assert keys_of(log, "T", "k6") == keys_of(log, "T", "k7") == []
    again = append(log, message("T", b"new", keys="k7"))[0]
    assert (again.physical_offset, again.queue_offset) == (r[6].physical_offset, 6)
    assert keys_of(log, "T", "k6") == []  # the old record at this offset is gone
    assert keys_of(log, "T", "k7") == [again.physical_offset]
    assert keys_of(log, "T", "k5") == [r[5].physical_offset]


# --- reopen and expiry -------------------------------------------------------------------------


def test_close_and_reopen_restore_everything(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log()
    keys = fill_mixed(log, clock, 250)
    append(log, message("tx", b"half", sysflag=sf.TRANSACTION_PREPARED_TYPE, keys="hk"))
    keys["tx"] = ["hk"]
    before = snapshot(log, keys)
    nexts = {k: v for k, v in log.queues().items()}
    log.close()
    log = open_log()
    assert snapshot(log, keys) == before
    for (topic, q), n in nexts.items():
        r = append(log, message(topic, b"after", queue_id=q))[0]
        assert r.queue_offset == n
        assert r.physical_offset == before["max_phys"]
        before["max_phys"] = r.end_offset
    log.close()
    log = open_log()
    assert log.max_physical_offset == before["max_phys"]


def test_a_store_directory_removed_and_opened_again_starts_empty(
    open_log: OpenLog, tmp_path: Path
) -> None:
    """What a store holds belongs to its directory, on every backend: the in-memory one too,
    though it keeps its tables in the process, starts afresh where the directory was
    removed, as a new directory would."""
    log = open_log()
    append(log, message("T", b"gone with the directory", keys="k"))
    log.close()
    shutil.rmtree(tmp_path / "store")
    log = open_log()
    assert log.max_physical_offset == 0
    assert log.queues() == {}
    assert not log.query_keys("T", "k", 32, 0, 2**62).records
    assert append(log, message("T", b"new"))[0].queue_offset == 0


def test_expiry_deletes_old_segments_only(open_log: OpenLog, clock: ManualClock) -> None:
    seg = 4096  # four 1000-byte records a segment
    log = open_log(commitlog_segment_size=seg, file_reserved_hours=1)
    t0 = clock.now_ms()
    old = append(log, *(sized(1000, keys=f"old{i}", queue_id=i % 2) for i in range(21)))
    clock.advance(1800)
    new = append(log, *(sized(1000, keys=f"new{i}", queue_id=i % 2) for i in range(20)))
    everything = old + new
    shared = old[-1].physical_offset // seg * seg  # holds old[20] and the first new records
    assert new[0].physical_offset // seg * seg == shared
    clock.ms = t0 + 3600_000 - 1
    assert log.expire().deleted_segments == 0  # nothing is an hour old yet
    assert log.min_physical_offset == 0
    clock.ms = t0 + 3600_000  # the first batch is exactly an hour old now
    report = log.expire()
    # A segment goes once everything in it is expired: the segment after it starts with an
    # expired record.  The segment shared with the young batch stays.
    assert report.min_physical_offset == log.min_physical_offset == shared
    assert report.deleted_segments == shared // seg
    assert report.deleted_bytes == shared
    gone = [r for r in everything if r.physical_offset < shared]
    kept = [r for r in everything if r.physical_offset >= shared]
    assert gone == old[:20]
    for r in gone:
        assert log.lookup(r.physical_offset) is None
    for r in kept:
        assert log.lookup(r.physical_offset) is not None
    for q in (0, 1):
        lo, hi = log.bounds("T", q)
        assert lo == 10  # queue 0: old[20], its 11th message; queue 1: new[1], its 11th
        assert hi == (21 if q == 0 else 20)
        res = log.read("T", q, 0)
        assert (res.status, res.next_offset, res.records) == (GetStatus.OFFSET_TOO_SMALL, lo, [])
        res = log.read("T", q, lo - 1)
        assert (res.status, res.next_offset) == (GetStatus.OFFSET_TOO_SMALL, lo)
        res = log.read("T", q, lo, max_count=1)
        assert res.status is GetStatus.FOUND
        assert decode(res.records[0]).commit_log_offset >= shared
        assert log.offset_for_time("T", q, 0) == lo
        assert log.store_time_at("T", q, lo - 1) == -1
    for i, r in enumerate(old):
        assert keys_of(log, "T", f"old{i}") == ([r.physical_offset] if r in kept else [])
    before = snapshot(log, seg=seg)
    log.close()
    log = open_log(commitlog_segment_size=seg, file_reserved_hours=1)
    assert snapshot(log, seg=seg) == before
    # Far in the future every segment is expired, but the last one always stays.
    clock.advance(100 * 3600)
    log.expire()
    last = new[-1].physical_offset // seg * seg
    assert log.min_physical_offset == last
    assert log.max_physical_offset == new[-1].end_offset
    assert log.expire(force=True).deleted_segments == 0
    assert log.lookup(new[-1].physical_offset) is not None
    assert log.read("T", 1, 19, max_count=1).queue_offsets == [19]
    r = append(log, sized(1000, queue_id=1))[0]
    assert r.queue_offset == 20
    assert log.read("T", 1, 20).queue_offsets == [20]


def test_forced_expiry_deletes_the_oldest_segment_even_if_young(open_log: OpenLog) -> None:
    log = open_log(commitlog_segment_size=4096)
    r = append(log, *(sized(1000, keys=f"k{i}") for i in range(15)))
    assert log.expire().deleted_segments == 0
    assert log.min_physical_offset == 0
    report = log.expire(force=True)
    assert (report.deleted_segments, report.min_physical_offset) == (1, 4096)
    assert report.deleted_bytes == 4096
    assert log.min_physical_offset == 4096
    assert [x.physical_offset for x in r[:5]] == [0, 1000, 2000, 3000, 4096]
    for x in r[:4]:
        assert log.lookup(x.physical_offset) is None
    assert keys_of(log, "T", "k0") == keys_of(log, "T", "k3") == []
    assert log.bounds("T", 0) == (4, 15)
    assert keys_of(log, "T", "k4") == [4096]
    assert walk(log, 4096)[0] == (4096, 1000)


def test_a_queue_whose_records_all_expired(open_log: OpenLog) -> None:
    log = open_log(commitlog_segment_size=4096)
    append(log, *(sized(1000, "Gone") for _ in range(3)), *(sized(1000) for _ in range(10)))
    log.expire(force=True)
    assert log.bounds("Gone", 0) == (3, 3)
    res = log.read("Gone", 0, 0)
    assert (res.status, res.next_offset) == (GetStatus.OFFSET_TOO_SMALL, 3)
    assert log.read("Gone", 0, 3).status is GetStatus.OFFSET_OVERFLOW_ONE
    res = log.read("Gone", 0, 4)
    assert (res.status, res.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 3)
    r = append(log, sized(1000, "Gone"))[0]
    assert r.queue_offset == 3
    assert log.read("Gone", 0, 3).queue_offsets == [3]


def test_a_closed_log_refuses_use(open_log: OpenLog) -> None:
    log = open_log()
    r = append(log, message("T", b"x", keys="k"))[0]
    data = log.read_log(0, 1 << 20)
    log.close()
    log.close()  # idempotent
    uses: list[Callable[[], object]] = [
        lambda: log.append([put_record(message())]),
        lambda: log.read("T", 0, 0),
        lambda: log.lookup(r.physical_offset),
        lambda: log.query_keys("T", "k", 10, *FOREVER),
        lambda: log.read_log(0, 100),
        lambda: log.append_replicated(r.end_offset, data),
        lambda: log.truncate(0),
        lambda: log.wait_durable(r.end_offset, 1.0),
        lambda: log.flush(),
    ]
    for use in uses:
        with pytest.raises(LogClosed):
            use()
    reopened = open_log()
    assert reopened.read("T", 0, 0).queue_offsets == [0]


# --- mmap backend: file layout -----------------------------------------------------------------


@pytest.fixture
def mmap_only(backend: str) -> None:
    if backend != "mmap":
        pytest.skip(f"checks the mmap backend's own files; {backend} keeps none of that layout")


@pytest.mark.usefixtures("mmap_only")
def test_mmap_segments_are_files_named_by_offset(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(tmp_path / "m")
    fill_to(log, 1000)
    first = append(log, sized(SEG - 1000 - 5))[0]  # leaves 5 bytes: rolls
    append(log, *(sized(3000, queue_id=1) for _ in range(30)))
    # The segment after the write segment may still be in the making, under another name.
    files = [f for f in sorted((tmp_path / "m" / "commitlog").iterdir())
             if not f.name.endswith(BUILDING_SUFFIX)]
    assert [f.name for f in files] == [f"{i * SEG:020d}" for i in range(len(files))]
    assert all(f.stat().st_size == SEG for f in files)
    assert first.physical_offset == SEG
    raw = files[0].read_bytes()
    assert HEAD.unpack_from(raw, 1000) == (SEG - 1000, BLANK_MAGIC)
    assert raw[1008:] == bytes(SEG - 1008)
    cq = tmp_path / "m" / "consumequeue" / "T" / "1"
    assert sorted(p.name for p in cq.iterdir()) == [f"{0:020d}"]
    assert (cq / f"{0:020d}").stat().st_size == 64 * 20
    log.close()
    assert not (tmp_path / "m" / "abort").exists()


@pytest.mark.usefixtures("mmap_only")
def test_mmap_files_built_ahead_appear_under_their_names_only_whole(
    open_log: OpenLog, tmp_path: Path
) -> None:
    """The next CommitLog segment and the next index file are built in the background while
    appends go on; a listing taken meanwhile shows each file under a segment's or an index
    file's name at its full size, never empty or short (which a load would take for a broken
    store, or a crash's leftover).  A thread lists both directories over and over while
    appends go on, until in each it has caught a file being built and then seen it whole."""
    root = tmp_path / "m"
    log = open_log(root)
    sizes = {"commitlog": SEG,
             "index": index_file_size(SMALL.index_slots, SMALL.index_entries)}
    short: list[str] = []
    building: dict[str, set[str]] = {d: set() for d in sizes}  # names caught in the making
    built: set[str] = set()  # directories where one of those was listed under its name since
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for d, size in sizes.items():
                for f in (root / d).iterdir():
                    if f.name.endswith(BUILDING_SUFFIX):
                        building[d].add(f.name.removesuffix(BUILDING_SUFFIX))
                    elif not f.name.isdigit() or f.stat().st_size != size:
                        short.append(f"{f} at {f.stat().st_size} bytes")
                    elif f.name in building[d]:
                        built.add(d)
            if built == set(sizes) or short:
                done.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(0, 20_000, 16):  # ~300 segments and ~200 index files; a few will do
            append(log, *(sized(1000, keys=f"a{k} b{k}") for k in range(i, i + 16)))
            if done.is_set():
                break
    finally:
        done.set()
        watcher.join()
    assert not short, f"listed under their final names, not whole: {short}"
    assert built == set(sizes), (
        f"no file caught being built, then whole, in {sorted(set(sizes) - built)}")


@pytest.mark.usefixtures("mmap_only")
def test_mmap_index_files_roll_over(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(tmp_path / "m")
    append(log, *(message("T", keys=f"a{i} b{i}") for i in range(250)))  # 500 entries
    names = sorted(p.name for p in (tmp_path / "m" / "index").iterdir())
    assert len(names) == 3  # 199 entries each
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert keys_of(log, "T", "a0") and keys_of(log, "T", "b249")


@pytest.mark.usefixtures("mmap_only")
def test_mmap_expiry_removes_projection_files(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(tmp_path / "m", commitlog_segment_size=4096)
    append(log, *(sized(500, keys=f"k{i}") for i in range(400)))
    cq = tmp_path / "m" / "consumequeue" / "T" / "0"
    index = tmp_path / "m" / "index"
    n_cq, n_index = len(list(cq.iterdir())), len(list(index.iterdir()))
    assert n_cq > 3 and n_index > 1
    for _ in range(40):
        log.expire(force=True)
    assert len(list(cq.iterdir())) < n_cq
    assert len(list(index.iterdir())) < n_index
    names = sorted(p.name for p in (tmp_path / "m" / "commitlog").iterdir())
    assert names[0] == f"{log.min_physical_offset:020d}"
    assert log.max_physical_offset - log.min_physical_offset <= 10 * 4096
    lo, hi = log.bounds("T", 0)
    assert hi == 400 and read_all(log, "T", 0)[0][0] == lo

