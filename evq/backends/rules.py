"""The port's arithmetic, written once for every backend.

What a caller can observe must not depend on the backend (a slave may run another backend
than its master, and one conformance suite proves them all), so the rules that decide it live
here as pure functions over explicit inputs, and each backend supplies only the look-ups:

* where a record lands: a record never spans a segment and leaves room for the 8-byte BLANK
  header that pads a segment's end (:func:`fits`, :func:`segment_end`);
* what a pull answers: the status for an offset outside ``[min, max)``, the bounded scan of
  queue entries with tag filtering, ``max_count`` and ``max_bytes``, and the next offset
  (:func:`read_queue`);
* offset-for-time: a search over store times that never decrease within a queue
  (:func:`first_at_or_after`, :func:`first_between` when both ends are known);
* key queries: candidates from an index, checked against the records themselves (topic, key,
  store time within ``[begin, end]``), newest first, asking the index for more candidates when
  too few survive (:func:`query_keys`);
* whether bytes at a log position are a whole, valid record or a segment's BLANK padding
  (:func:`valid_record`, :func:`is_padding`), for recovery and replication;
* the broker's fields stamped into a record (:func:`stamp_store_fields`) and store times that
  never go backwards (:func:`later_store_time`);
* retention: which leading segments expire (:func:`expired_segments`) and when the cleaner
  runs (:func:`clean_due`).

No I/O here: a backend passes callables that read its own structures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from evq.backends.config import StoreConfig
from evq.domain import record as rec
from evq.domain import sysflag as sf
from evq.domain.log import GetStatus, ReadResult, TagFilter
from evq.domain.message import decode_properties

BLANK_ENTRY_SIZE = 0x7FFFFFFF
"""Size of a queue entry that stands for no record (mmap ConsumeQueue blanks)."""

SCAN_LIMIT = 800
"""Queue entries one pull scans at most: RocketMQ reads 16,000 ConsumeQueue bytes (800 x 20)."""

Entry = tuple[int, int, int]
"""A queue entry: (physical offset, record size, tags code)."""

EntriesFn = Callable[[int, int], Sequence[Entry]]
"""``(queue offset, count)`` -> up to ``count`` consecutive entries from that offset; fewer
(or none) only where the queue ends or has no entries (expired, never written)."""

ViewFn = Callable[[int, int], "memoryview | None"]
"""``(physical offset, size)`` -> the record's bytes, or None when the log no longer has it."""

MAX_CLOCK_SKEW_MS = 24 * 3600 * 1000
HOST_V6_BITS = sf.BORNHOST_V6 | sf.STOREHOST_V6


# --- where records land ------------------------------------------------------------------


def max_record_size(config: StoreConfig) -> int:
    """The largest record a store accepts: the configured limit, and never more than a
    segment minus the BLANK header (a record never spans segments)."""
    return min(config.max_message_size, config.commitlog_segment_size - rec.BLANK_SIZE)


def segment_end(phys: int, segment_size: int) -> int:
    return phys - phys % segment_size + segment_size


def fits(pos_in_segment: int, size: int, segment_size: int) -> bool:
    """May a record of ``size`` bytes start ``pos_in_segment`` bytes into a segment?  Only if
    the BLANK header still fits after it, so that padding is always a readable record."""
    return pos_in_segment + size + rec.BLANK_SIZE <= segment_size


def is_padding(size: int, magic: int, phys: int, segment_size: int) -> bool:
    """A BLANK record at ``phys`` that runs exactly to its segment's end."""
    return magic == rec.BLANK_MAGIC and phys + size == segment_end(phys, segment_size)


def valid_record(
    buf: bytes | bytearray | memoryview, pos: int, phys: int, *, check_crc: bool
) -> rec.Fields | None:
    """The fields of the record at ``buf[pos:]`` if it is whole and belongs at log offset
    ``phys``: layout, body CRC, and a PHYSICALOFFSET field equal to its position (a torn write
    never got its offsets patched); None otherwise."""
    try:
        f = rec.read_fields(buf, pos, check_crc=check_crc)
    except rec.RecordError:
        return None
    return f if f.crc_ok and f.physical_offset == phys else None


def stored_sysflag(sysflag: int, data: bytes | bytearray | memoryview) -> int:
    """The flags a record is stored with: the caller's, but the host widths of the bytes
    themselves (they decide where the store fields sit)."""
    return (sysflag & ~HOST_V6_BITS) | (data[rec.SYSFLAG_AT + 3] & HOST_V6_BITS)


def stamp_store_fields(
    buf: bytearray | memoryview, pos: int, sysflag: int, store_ts: int, host: bytes
) -> None:
    """Patch STORETIMESTAMP and STOREHOSTADDRESS of the record at ``pos`` (any host widths)."""
    at = pos + rec.store_timestamp_at(sysflag)
    rec.INT64.pack_into(buf, at, store_ts)
    if sysflag & sf.STOREHOST_V6 and len(host) != 20:
        raise ValueError("record declares an IPv6 store host but the store host is IPv4")
    buf[at + 8 : at + 8 + len(host)] = host


def later_store_time(last: int, seen: int, now_ms: int) -> int:
    """The store-time floor after seeing a stored record's time: appends never stamp times
    older than what the log already holds.  STORETIMESTAMP has no CRC, so a time further ahead
    of the clock than any skew is damage, not a floor."""
    return seen if last < seen <= now_ms + MAX_CLOCK_SKEW_MS else last


def index_keys(f: rec.Fields) -> tuple[str, ...]:
    """The index keys of a parsed record (recovery and replication derive them from bytes)."""
    return rec.index_keys_of(decode_properties(f.properties), f.sysflag)


# --- pulls ---------------------------------------------------------------------------------


def status_outside(offset: int, lo: int, hi: int) -> ReadResult | None:
    """The answer for an offset outside ``[lo, hi)``, or None if the offset is inside."""
    if hi == 0:
        return ReadResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    if offset < lo:
        return ReadResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return ReadResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
    if offset > hi:  # RocketMQ restarts a consumer from 0 when the queue still starts there
        return ReadResult(GetStatus.OFFSET_OVERFLOW_BADLY, lo if lo == 0 else hi, lo, hi)
    return None


def read_queue(
    offset: int,
    lo: int,
    hi: int,
    *,
    max_count: int,
    max_bytes: int,
    tag_filter: TagFilter | None,
    entries: EntriesFn,
    view: ViewFn,
    log_min: int,
    entries_per_file: int,
) -> ReadResult:
    """One pull from queue offset ``offset`` of a queue holding ``[lo, hi)``.

    At most ``max_count`` records and about ``max_bytes`` (always one when one matches), and
    at most :data:`SCAN_LIMIT` entries scanned (or ``max_count`` if larger), so a tag filter
    matching nothing still answers quickly and moves the consumer on.  An entry whose record
    the log no longer holds is skipped.  If not even the first entry exists, the answer is
    OFFSET_FOUND_NULL with the next offset at the start of the next ConsumeQueue file's worth
    of entries, as RocketMQ skips a missing ConsumeQueue file.
    """
    outside = status_outside(offset, lo, hi)
    if outside is not None:
        return outside
    scan_end = min(hi, offset + max(SCAN_LIMIT, max_count))
    records: list[memoryview] = []
    qos: list[int] = []
    keep, keep_qo = records.append, qos.append
    found = total = 0
    last_phys = -1
    qo = offset
    chunk = max(max_count, 32)  # most pulls are satisfied by the first few entries
    full = False
    while not full and qo < scan_end:
        got = entries(qo, min(chunk, scan_end - qo))
        chunk = scan_end - qo
        if not got:
            break
        for phys, size, tags in got:
            if found >= max_count or (found and total + size > max_bytes):
                full = True
                break
            qo += 1
            if size == BLANK_ENTRY_SIZE or phys < log_min:
                continue
            last_phys = phys
            if tag_filter is not None and not tag_filter(tags):
                continue
            v = view(phys, size)
            if v is None:
                continue
            keep(v)
            keep_qo(qo - 1)
            total += size
            found += 1
        else:
            full = found >= max_count
    if records:
        status = GetStatus.FOUND
    elif qo == offset:
        status = GetStatus.OFFSET_FOUND_NULL
        qo = min((offset // entries_per_file + 1) * entries_per_file, hi)
    else:
        status = GetStatus.NO_MATCHED_MESSAGE
    return ReadResult(status, qo, lo, hi, records, qos, last_phys)


# --- time and keys ---------------------------------------------------------------------------


def first_at_or_after(lo: int, hi: int, timestamp_ms: int, store_time: Callable[[int], int]) -> int:
    """The first queue offset in ``[lo, hi)`` stored at or after ``timestamp_ms`` (``hi`` if
    none); ``store_time`` answers -1 for an offset without a record, which sorts it first.

    Store times never decrease along a queue, so a binary search would do, but each probe is a
    record read and a binary search over a million entries makes twenty.  A queue's store
    times are close to linear in the offset between any two points not separated by a pause,
    so each probe goes where the time falls on the line between the nearest probed offsets
    below and above the answer (aiming between the last record before the time and the first
    at it, since many records share a millisecond).  Every probe narrows the line to a
    straighter stretch: about eight reads for a queue of a hundred thousand or a million
    entries written by a real broker.  When an interpolated probe fails to halve the range the
    next one halves it, so a burst-shaped queue costs at most about twice a binary search.
    """
    if lo >= hi:
        return lo
    t_hi = store_time(hi - 1)
    if t_hi < timestamp_ms:
        return hi
    if lo == hi - 1:
        return lo
    t_lo = store_time(lo)
    if t_lo >= timestamp_ms:
        return lo
    return first_between(lo, t_lo, hi - 1, t_hi, timestamp_ms, store_time)


def first_between(
    a: int, ta: int, b: int, tb: int, timestamp_ms: int, store_time: Callable[[int], int]
) -> int:
    """The first offset in ``(a, b]`` stored at or after ``timestamp_ms``, given two probes
    already made: ``ta < timestamp_ms <= tb``.  A caller that knows the times at both ends
    (sampled ones) starts here and saves :func:`first_at_or_after` its two end reads."""
    lo, hi = a + 1, b  # the answer lies in [lo, hi]
    halve = False
    while lo < hi:
        width = hi - lo
        if halve or ta < 0:  # ta < 0: no record there (expired), nothing to interpolate from
            mid = (lo + hi) // 2
        else:
            mid = a + (2 * (timestamp_ms - ta) - 1) * (b - a) // (2 * (tb - ta))
            mid = min(max(mid, lo), hi - 1)
        t = store_time(mid)
        if t >= timestamp_ms:
            hi, b, tb = mid, mid, t
        else:
            lo, a, ta = mid + 1, mid, t
        halve = not halve and (hi - lo) * 2 > width
    return lo


def query_keys(
    candidates: Callable[[int], list[int]],
    lookup: Callable[[int], memoryview | None],
    topic: str,
    key: str,
    max_count: int,
    begin_ms: int,
    end_ms: int,
    log_end: int,
) -> tuple[list[memoryview], list[int]]:
    """Records indexed under ``topic#key`` stored within ``[begin_ms, end_ms]``, newest first.

    ``candidates(limit)`` gives up to ``limit`` log offsets from the index, newest first; an
    index may over-answer (hash collisions, other topics, coarse times, entries past a
    truncated end, a key indexed twice), so each candidate's record is checked, and when the
    candidates run out before ``max_count`` hits the index is asked for more.
    """
    limit = max_count * 4 + 16
    while True:
        found = candidates(limit)
        records, offsets = _key_hits(found, lookup, topic, key, max_count, begin_ms, end_ms,
                                     log_end)
        if len(records) >= max_count or len(found) < limit:
            return records, offsets
        limit *= 4


def _key_hits(
    candidates: list[int],
    lookup: Callable[[int], memoryview | None],
    topic: str,
    key: str,
    max_count: int,
    begin_ms: int,
    end_ms: int,
    log_end: int,
) -> tuple[list[memoryview], list[int]]:
    records: list[memoryview] = []
    offsets: list[int] = []
    seen: set[int] = set()
    for phys in candidates:
        if len(records) >= max_count:
            break
        if phys >= log_end or phys in seen:
            continue
        seen.add(phys)
        view = lookup(phys)
        if view is None:
            continue
        try:
            f = rec.read_fields(view, 0, check_crc=False)
        except rec.RecordError:
            continue
        if f.topic != topic or not begin_ms <= f.store_timestamp <= end_ms:
            continue
        if key not in index_keys(f):
            continue
        records.append(view)
        offsets.append(phys)
    return records, offsets


# --- retention -------------------------------------------------------------------------------


def expired_segments(
    segments: int, first_store_ts: Callable[[int], int], now_ms: int, keep_ms: float,
    *, force: bool,
) -> int:
    """How many leading segments of ``segments`` expiry deletes.

    A segment's newest record is older than the next segment's first one, so segment ``i``
    goes once ``first_store_ts(i + 1)`` is past retention (-1: unknown, keep).  ``force``
    (disk nearly full) takes one more.  The last segment always stays.
    """
    count = 0
    while count < segments - 1:
        ts = first_store_ts(count + 1)
        if ts < 0 or ts + keep_ms > now_ms:
            break
        count += 1
    if force and count < segments - 1:
        count += 1
    return count


def clean_due(config: StoreConfig, now_ms: int, disk_ratio: float) -> tuple[bool, bool]:
    """(clean now, force): RocketMQ deletes expired files at ``deleteWhen`` hours or when disk
    use passes the high watermark, and the oldest files even unexpired past the
    forcible-clean ratio."""
    hour = time.localtime(now_ms / 1000).tm_hour
    force = disk_ratio >= config.disk_space_clean_forcibly_ratio
    due = (force or disk_ratio >= config.disk_max_used_space_ratio / 100
           or hour in config.delete_hours())
    return due, force
