"""The MessageLog port over an ordered key-value store (LMDB, RocksDB, memory).

Directory layout of a persistent store (``root`` is the store directory; the lock and the abort
marker are the shell's, :mod:`evq.backends.shell`)::

    root/<driver>  the key-value store's own files (see the driver's module)

Tables and keys are drawn in :mod:`evq.backends.kvlog.layout`.  Physical offsets are the same
byte positions as mmap's, BLANK padding included (a padding row holds only the BLANK header),
so :meth:`read_log` returns mmap's bytes and a replica may run any backend.

Every append batch, replicated batch, truncation and expiry is one atomic write covering the
log and every projection: after a crash there is nothing to re-dispatch and no torn tail to
cut, because the store's own write-ahead log (RocksDB) or copy-on-write commit (LMDB) never
exposes half a write.  Recovery reads the meta row and the queue rows and finds the store-time
floor in the last record.  A replica's incomplete trailing record (bytes that arrived without
the rest of their record) is kept in memory only: a crash drops it and the replica asks for it
again from its log end.

Durability: a write survives a process crash when it returns; :meth:`wait_durable` under
SYNC_FLUSH waits for the flusher's next ``sync`` (fsync), which serves every waiter at once
(group commit), and ASYNC_FLUSH syncs periodically (the shell's
:class:`~evq.backends.flush.Flusher` drives both).  So that a power cut keeps what
was synced, the store directory, the driver's directory and the abort marker are created
through :mod:`evq.durable_fs` (their directory entries synced).  The life cycle (lock, marker,
flusher, cleaner, close) is the shell's, :mod:`evq.backends.shell`; this module supplies
recovery, appends, reads and expiry.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from evq import logs
from evq.backends import disk, rules
from evq.backends.config import StoreConfig
from evq.backends.kvlog import layout as lay
from evq.backends.kvlog.driver import Batch, Driver, DriverError, Reader
from evq.backends.kvlog.layout import Table
from evq.backends.shell import StoreShell
from evq.backends.time_samples import TimeSamples
from evq.domain import record as rec
from evq.domain import sysflag as sf
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.log import (
    AppendResult,
    Dispatched,
    ExpiryReport,
    GetStatus,
    KeyQueryResult,
    LogClosed,
    PutStatus,
    ReadResult,
    ReplicationError,
    TagFilter,
    check_empty,
)
from evq.domain.message import decode_properties
from evq.domain.record import TagsCodeFn, default_tags_code

log = logs.get_logger(__name__)

_SCAN_CHUNK = 1024  # rows per range read when walking a stretch of the log
_RECORD_MAGICS = (rec.MAGIC_V1, rec.MAGIC_V2)


@attrs.define(slots=True)
class QueueState:
    """One (topic, queue): its key prefix and ``[min, next)`` offsets, mirrored in memory."""

    prefix: bytes
    min: int = 0
    next: int = 0
    times: TimeSamples = attrs.field(factory=TimeSamples)


class KeyedMessageLog(StoreShell):
    """Open with :meth:`open`; see the module docstring."""

    def __init__(self, root: Path, config: StoreConfig, clock: Clock, tags_code_fn: TagsCodeFn,
                 factory: type[Driver]):
        super().__init__(root, config, clock, tags_code_fn, persistent=factory.persistent)
        self._factory = factory
        self._seg = config.commitlog_segment_size
        self._driver: Driver | None = None
        self._end = 0  # committed log end
        self._min = 0
        self._pending = bytearray()  # a replica's bytes past the last whole record
        self._queues: dict[tuple[str, int], QueueState] = {}
        self._index_last = (0, 0)

    # --- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        config: StoreConfig | None = None,
        *,
        driver: type[Driver],
        clock: Clock = SYSTEM_CLOCK,
        tags_code_fn: TagsCodeFn = default_tags_code,
        background: bool = True,
    ) -> KeyedMessageLog:
        """Open the store at ``root`` with the driver ``driver`` makes.

        ``background=False`` runs no cleaner thread (tests drive :meth:`expire` themselves).
        """
        self = cls(Path(root), config or StoreConfig(), clock, tags_code_fn, driver)
        self._start(background)
        return self

    def _recover(self, abnormal: bool) -> tuple[int, int]:
        """Nothing to cut: the driver never exposes half a write (see the module docstring)."""
        self._driver = self._factory.open(self.root)
        self._load()
        return self._end, 0

    def _load(self) -> None:
        with self._reader() as r:
            state = r.get(Table.META, lay.STATE_KEY)
            if state is not None:
                self._end, self._min, ts, phys = lay.STATE.unpack(state)
                self._index_last = (ts, phys)
            start = b""
            while rows := r.scan(Table.QUEUES, start, lay.LOG_KEY_END, _SCAN_CHUNK):
                for prefix, value in rows:
                    lo, nxt = lay.QUEUE_ROW.unpack(value)
                    self._queues[lay.queue_topic(prefix)] = QueueState(prefix, lo, nxt)
                start = rows[-1][0] + b"\0"
            last = self._last_record(r, self._end)
        self._last_store_ts = last[1].store_timestamp if last is not None else 0

    def _last_record(
        self, r: Reader, before: int, *, indexed: bool = False
    ) -> tuple[int, rec.Fields] | None:
        """The newest record below ``before`` (with index keys, if ``indexed``)."""
        stop = lay.log_key(before)
        while rows := r.scan_back(Table.LOG, lay.log_key(self._min), stop, _SCAN_CHUNK):
            for key, value in rows:
                f = _fields(value)
                if f is not None and (not indexed or rules.index_keys(f)):
                    return lay.U64.unpack(key)[0], f
            stop = rows[-1][0]
        return None

    def _reader(self) -> contextlib.AbstractContextManager[Reader]:
        if self._closed or self._driver is None:
            raise LogClosed("the log is closed")
        return self._driver.reader()

    def _check_open(self) -> Driver:
        if self._closed or self._driver is None:
            raise LogClosed("the log is closed")
        return self._driver

    # --- writing -------------------------------------------------------------------------

    def append(self, records: Sequence[rec.PutRecord]) -> list[AppendResult]:
        results: list[AppendResult] = []
        add = results.append
        with self._put_lock:
            driver = self._check_open()
            if self._refused:  # the disk is full: see evq.backends.shell
                return [AppendResult(PutStatus.SERVICE_NOT_AVAILABLE) for _ in records]
            if self._pending:  # local appends on a replica: its partial record is abandoned
                log.warning("replicated_tail_dropped", at=self._end, bytes=len(self._pending))
                self._pending.clear()
            now = max(self._clock.now_ms(), self._last_store_ts)
            self._last_store_ts = now
            batch = driver.batch()
            put = batch.put
            seg, host, limit, queues = self._seg, self._host, self._max_record, self._queues
            end = self._end
            nexts: dict[tuple[str, int], int] = {}
            notify: list[Dispatched] | None = [] if self._subscribers else None
            index_last = self._index_last
            for r in records:
                data = r.data
                n = len(data)
                if n > limit or n < rec.MIN_RECORD_SIZE:
                    add(AppendResult(PutStatus.MESSAGE_ILLEGAL))
                    continue
                pos = end % seg
                if not rules.fits(pos, n, seg):
                    put(Table.LOG, lay.log_key(end), rec.encode_blank(seg - pos))
                    end += seg - pos
                    self._note_usage()  # a segment's worth written: as mmap samples
                phys = end
                flags = rules.stored_sysflag(r.sysflag, data)
                buf = bytearray(data)
                if flags & sf.TRANSACTION_MASK in sf.NOT_CONSUMABLE:
                    qo = -1
                else:
                    key = (r.topic, r.queue_id)
                    qo = nexts.get(key, -1)
                    if qo < 0:
                        st = queues.get(key)
                        qo = st.next if st is not None else 0
                    nexts[key] = qo + 1
                rec.OFFSETS.pack_into(buf, rec.QUEUE_OFFSET_AT, max(qo, 0), phys)
                rules.stamp_store_fields(buf, 0, flags, now, host)
                batch.append(Table.LOG, lay.log_key(phys), buf)
                if qo >= 0:
                    prefix = self._prefix(r.topic, r.queue_id)
                    put(Table.QUEUE, prefix + lay.U64.pack(qo),
                        lay.QUEUE_ENTRY.pack(phys, n, r.tags_code, now))
                    if notify is not None:
                        notify.append(Dispatched(r.topic, r.queue_id, qo, phys, n, r.tags_code,
                                                 now, flags))
                if r.keys:
                    for k in r.keys:
                        put(Table.INDEX, lay.index_key(lay.index_prefix(r.topic, k), now, phys),
                            b"")
                    index_last = (now, phys)
                end = phys + n
                add(AppendResult(PutStatus.PUT_OK, phys, n, max(qo, 0), now, host))
            if end == self._end:
                return results
            try:
                self._commit(batch, end, nexts, {}, index_last)
            except DriverError as exc:  # nothing of the batch was written: it is atomic
                need = end - self._end
                if not disk.failed_for_space(exc, need, self._usage()[2]):
                    raise
                self._found_no_space(exc, 2 * need + disk.WRITE_SLACK)
                return [AppendResult(PutStatus.SERVICE_NOT_AVAILABLE)
                        if r.status is PutStatus.PUT_OK else r for r in results]
            if notify:
                self._subscribers.notify(notify)
        return results

    def _prefix(self, topic: str, queue_id: int) -> bytes:
        st = self._queues.get((topic, queue_id))
        return st.prefix if st is not None else lay.queue_prefix(topic, queue_id)

    def _commit(
        self, batch: Batch, end: int, nexts: dict[tuple[str, int], int],
        mins: dict[tuple[str, int], int], index_last: tuple[int, int],
        log_min: int | None = None,
    ) -> None:
        """Add the queue rows and the meta row to ``batch``, write it, then mirror it in
        memory (only then: a failed write leaves the mirror as the store is)."""
        new_min = self._min if log_min is None else log_min
        queues = self._queues
        rows: list[tuple[tuple[str, int], int, int]] = []
        for key in nexts.keys() | mins.keys() if mins else nexts:
            st = queues.get(key)
            lo = mins.get(key, st.min if st is not None else 0)
            nxt = nexts.get(key, st.next if st is not None else 0)
            prefix = st.prefix if st is not None else lay.queue_prefix(*key)
            batch.put(Table.QUEUES, prefix, lay.QUEUE_ROW.pack(lo, nxt))
            rows.append((key, lo, nxt))
        batch.put(Table.META, lay.STATE_KEY, lay.STATE.pack(end, new_min, *index_last))
        assert self._driver is not None
        self._driver.write(batch)
        self._end = end
        self._min = new_min
        self._index_last = index_last
        for key, lo, nxt in rows:
            st = queues.get(key)
            if st is None:
                queues[key] = QueueState(lay.queue_prefix(*key), lo, nxt)
            else:
                if nxt < st.next:  # cut back: its sampled store times may be replaced
                    st.times.clear()
                st.min, st.next = lo, nxt

    def _flush_log(self, target: int) -> int:
        """Sync everything written so far: everything below ``target`` was written before."""
        driver = self._driver
        if driver is None:
            return target
        driver.sync()
        return target

    # --- reading -------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tag_filter: TagFilter | None = None,
    ) -> ReadResult:
        st = self._queues.get((topic, queue_id))
        with self._reader() as r:
            if st is None:
                return ReadResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
            prefix = st.prefix
            fetched: dict[int, bytes | None] = {}

            def entries(qo: int, count: int) -> list[rules.Entry]:
                rows = r.scan(Table.QUEUE, prefix + lay.U64.pack(qo),
                              prefix + lay.U64.pack(qo + count), count)
                out: list[rules.Entry] = []
                for k, v in rows:
                    if lay.U64.unpack_from(k, len(prefix))[0] != qo + len(out):
                        break  # a gap: expiry is deleting below it
                    phys, size, tags, _ = lay.QUEUE_ENTRY.unpack(v)
                    out.append((phys, size, tags))
                if tag_filter is None:
                    wanted = _pull_prefix(out, max_count, max_bytes)
                    records = r.get_many(Table.LOG, map(lay.log_key, wanted))
                    fetched.update(zip(wanted, records, strict=True))
                return out

            def view(phys: int, size: int) -> memoryview | None:
                v = fetched.pop(phys) if phys in fetched else r.get(Table.LOG, lay.log_key(phys))
                return memoryview(v) if v is not None and len(v) == size else None

            return rules.read_queue(
                offset, st.min, st.next, max_count=max_count, max_bytes=max_bytes,
                tag_filter=tag_filter, entries=entries, view=view, log_min=self._min,
                entries_per_file=self.config.consume_queue_entries,
            )

    def lookup(self, physical_offset: int) -> memoryview | None:
        with self._reader() as r:
            return self._lookup(r, physical_offset)

    def _lookup(self, r: Reader, phys: int) -> memoryview | None:
        if phys < self._min:
            return None
        v = r.get(Table.LOG, lay.log_key(phys))
        if v is None:
            return None
        size, magic = rec.peek(v, 0)
        if magic not in _RECORD_MAGICS or size != len(v):
            return None
        return memoryview(v)

    def query_keys(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> KeyQueryResult:
        prefix = lay.index_prefix(topic, key)
        start, stop = lay.index_bounds(prefix, begin_ms, end_ms)
        with self._reader() as r:

            def candidates(limit: int) -> list[int]:
                rows = r.scan_back(Table.INDEX, start, stop, limit)
                return [lay.index_phys(k) for k, _ in rows]

            records, offsets = rules.query_keys(
                candidates, lambda phys: self._lookup(r, phys), topic, key, max_count,
                begin_ms, end_ms, self._end,
            )
        ts, phys = self._index_last
        return KeyQueryResult(records, offsets, ts, phys)

    def _entry_time(self, r: Reader, st: QueueState, offset: int) -> int:
        """Store time of a queue's entry (kept in the entry: no log read); -1 if none."""
        v = r.get(Table.QUEUE, st.prefix + lay.U64.pack(offset))
        if v is None:
            return -1
        phys, _, _, ts = lay.QUEUE_ENTRY.unpack(v)
        return ts if phys >= self._min else -1

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        st = self._queues.get((topic, queue_id))
        with self._reader() as r:
            if st is None:
                return 0
            return st.times.first_at_or_after(st.min, st.next, timestamp_ms,
                                              lambda qo: self._entry_time(r, st, qo))

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        st = self._queues.get((topic, queue_id))
        with self._reader() as r:
            if st is None or not st.min <= offset < st.next:
                return -1
            return self._entry_time(r, st, offset)

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        st = self._queues.get((topic, queue_id))
        return (st.min, st.next) if st is not None else (0, 0)

    def queues(self) -> dict[tuple[str, int], int]:
        with self._put_lock:
            return {k: st.next for k, st in self._queues.items()}

    # --- raw log -------------------------------------------------------------------------

    @property
    def min_physical_offset(self) -> int:
        return self._min

    @property
    def max_physical_offset(self) -> int:
        return self._end + len(self._pending)

    def _log_end(self) -> int:
        return self._end

    def read_log(self, physical_offset: int, max_bytes: int) -> bytes:
        with self._put_lock, self._reader() as r:
            pos = physical_offset
            stop = min(rules.segment_end(pos, self._seg), pos + max_bytes,
                       self.max_physical_offset)
            if pos < self._min or pos >= stop:
                return b""
            out = bytearray()
            at = pos  # log offset of out[0]
            if pos < self._end:
                floor = r.scan_back(Table.LOG, b"", lay.log_key(pos + 1), 1)
                at = lay.U64.unpack(floor[0][0])[0]
                cursor = floor[0][0]
                while at + len(out) < min(stop, self._end):
                    rows = r.scan(Table.LOG, cursor, lay.log_key(stop), _SCAN_CHUNK)
                    if not rows:
                        break
                    for _, value in rows:
                        out += value
                        size, magic = rec.peek(value, 0)
                        if magic == rec.BLANK_MAGIC and len(value) == rec.BLANK_SIZE:
                            out += bytes(size - rec.BLANK_SIZE)  # padding: zeros to the end
                    cursor = rows[-1][0] + b"\0"
            if stop > self._end:
                out += self._pending[max(pos, self._end) - self._end : stop - self._end]
            return bytes(out[pos - at : stop - at])

    def append_replicated(self, physical_offset: int, data: bytes | memoryview) -> int:
        with self._put_lock:
            driver = self._check_open()
            end = self.max_physical_offset
            if physical_offset != end:
                raise ReplicationError(
                    f"replicated bytes start at {physical_offset}, this log ends at {end}"
                )
            self._pending += data
            buf = self._pending
            batch = driver.batch()
            nexts: dict[tuple[str, int], int] = {}
            mins: dict[tuple[str, int], int] = {}
            notify: list[Dispatched] = []
            index_last = self._index_last
            used = 0
            phys = self._end
            broken = False
            while len(buf) - used >= rec.BLANK_SIZE:
                size, magic = rec.peek(buf, used)
                if rules.is_padding(size, magic, phys, self._seg):
                    if len(buf) - used < size:
                        break  # the rest of the padding is on its way
                    batch.put(Table.LOG, lay.log_key(phys), bytes(buf[used : used + 8]))
                elif magic in _RECORD_MAGICS and size >= rec.MIN_RECORD_SIZE and (
                    phys % self._seg + size <= self._seg
                ):
                    if len(buf) - used < size:
                        break  # the rest of the record is on its way
                    f = rules.valid_record(memoryview(buf)[used : used + size], 0, phys,
                                           check_crc=True)
                    if f is None:
                        broken = True
                        break
                    raw = bytes(buf[used : used + size])
                    batch.append(Table.LOG, lay.log_key(phys), raw)
                    d, index_last = self._dispatch_fields(batch, f, phys, nexts, mins,
                                                          index_last)
                    if d is not None:
                        notify.append(d)
                else:
                    broken = True
                    break
                used += size
                phys += size
            if used:
                self._commit(batch, phys, nexts, mins, index_last)
            del self._pending[: len(buf) if broken else used]
            if notify and self._subscribers:
                self._subscribers.notify(notify)
            if broken:
                raise ReplicationError(f"replicated bytes hold a broken record at {phys}")
            return self.max_physical_offset

    def _dispatch_fields(
        self, batch: Batch, f: rec.Fields, phys: int, nexts: dict[tuple[str, int], int],
        mins: dict[tuple[str, int], int], index_last: tuple[int, int],
    ) -> tuple[Dispatched | None, tuple[int, int]]:
        """Add one replicated record's projection rows to ``batch``; the queue offset is the
        record's own, accepted only as its queue's next (a record must never take another's
        entry) or as the first of a queue that starts late."""
        self._last_store_ts = rules.later_store_time(self._last_store_ts, f.store_timestamp,
                                                     self._clock.now_ms())
        props = decode_properties(f.properties)
        keys = rec.index_keys_of(props, f.sysflag)
        for k in keys:
            batch.put(Table.INDEX, lay.index_key(lay.index_prefix(f.topic, k), f.store_timestamp,
                                                 phys), b"")
        if keys:
            index_last = (f.store_timestamp, phys)
        if f.sysflag & sf.TRANSACTION_MASK in sf.NOT_CONSUMABLE:
            return None, index_last
        key = (f.topic, f.queue_id)
        st = self._queues.get(key)
        nxt = nexts.get(key, st.next if st is not None else 0)
        if f.queue_offset != nxt and nxt:
            log.warning(
                "dispatch_skipped", reason="queue offset out of sequence", topic=f.topic,
                queue_id=f.queue_id, queue_offset=f.queue_offset, next_offset=nxt,
                physical_offset=phys,
            )
            return None, index_last
        if nxt == 0 and f.queue_offset:
            mins[key] = f.queue_offset
        tags = self._tags_code_fn(f.topic, props, f.store_timestamp)
        batch.put(Table.QUEUE, self._prefix(*key) + lay.U64.pack(f.queue_offset),
                  lay.QUEUE_ENTRY.pack(phys, f.size, tags, f.store_timestamp))
        nexts[key] = f.queue_offset + 1
        return Dispatched(f.topic, f.queue_id, f.queue_offset, phys, f.size, tags,
                          f.store_timestamp, f.sysflag), index_last

    def begin_at(self, physical_offset: int) -> None:
        with self._put_lock:
            driver = self._check_open()
            check_empty(self._min, self.max_physical_offset)
            self._commit(driver.batch(), physical_offset, {}, {}, self._index_last,
                         physical_offset)
            if self._flusher is not None:
                self._flusher.restart(physical_offset)

    def truncate(self, physical_offset: int) -> None:
        with self._put_lock:
            driver = self._check_open()
            cut = physical_offset
            if cut >= self.max_physical_offset:
                return
            if cut >= self._end:
                del self._pending[cut - self._end :]
                return
            self._pending.clear()
            batch = driver.batch()
            nexts: dict[tuple[str, int], int] = {}
            with driver.reader() as r:
                self._unindex(r, batch, max(cut, self._min), self._end)
                for key, st in self._queues.items():
                    kept = self._queue_end_before(r, st, cut)
                    if kept != st.next:
                        batch.delete_range(Table.QUEUE, st.prefix + lay.U64.pack(kept),
                                           st.prefix + lay.U64.pack(st.next))
                        nexts[key] = kept
                batch.delete_range(Table.LOG, lay.log_key(cut), lay.LOG_KEY_END)
                index_last = self._index_last
                if index_last[1] >= cut:
                    last = self._last_record(r, cut, indexed=True)
                    index_last = (last[1].store_timestamp, last[0]) if last else (0, 0)
            self._commit(batch, cut, nexts, {}, index_last, min(self._min, cut))
            if self._flusher is not None:
                self._flusher.cut(cut)

    def _queue_end_before(self, r: Reader, st: QueueState, cut: int) -> int:
        """The queue offset just past the last entry of ``st`` whose record lies below ``cut``
        (entries follow log order, so walk back from the end)."""
        stop = st.prefix + lay.U64.pack(st.next)
        while rows := r.scan_back(Table.QUEUE, st.prefix + lay.U64.pack(st.min), stop, 64):
            for k, v in rows:
                if lay.QUEUE_ENTRY.unpack(v)[0] < cut:
                    return lay.U64.unpack_from(k, len(st.prefix))[0] + 1
            stop = rows[-1][0]
        return st.min

    def _unindex(self, r: Reader, batch: Batch, start: int, stop: int) -> None:
        """Delete the index rows of the records in ``[start, stop)``: the index is keyed by
        key, so the records say which rows are theirs."""
        cursor = lay.log_key(start)
        while rows := r.scan(Table.LOG, cursor, lay.log_key(stop), _SCAN_CHUNK):
            for k, v in rows:
                f = _fields(v)
                if f is None:
                    continue
                phys = lay.U64.unpack(k)[0]
                for key in rules.index_keys(f):
                    batch.delete(Table.INDEX, lay.index_key(lay.index_prefix(f.topic, key),
                                                            f.store_timestamp, phys))
            cursor = rows[-1][0] + b"\0"

    # --- projections, expiry, lifecycle ---------------------------------------------------

    def expire(self, now_ms: int | None = None, *, force: bool = False) -> ExpiryReport:
        now = self._clock.now_ms() if now_ms is None else now_ms
        keep_ms = self.config.file_reserved_hours * 3600 * 1000
        seg = self._seg
        with self._put_lock:
            driver = self._check_open()
            first = self._min - self._min % seg
            segments = max(self._end - 1, self._min) // seg - first // seg + 1
            with driver.reader() as r:

                def first_store_ts(i: int) -> int:
                    start = first + i * seg
                    for _, v in r.scan(Table.LOG, lay.log_key(start), lay.LOG_KEY_END, 2):
                        f = _fields(v)
                        if f is not None:
                            return f.store_timestamp
                    return -1

                count = rules.expired_segments(segments, first_store_ts, now, keep_ms,
                                               force=force)
                if not count:
                    return ExpiryReport(0, 0, self._min)
                new_min = first + count * seg
                batch = driver.batch()
                self._unindex(r, batch, self._min, new_min)
                batch.delete_range(Table.LOG, lay.log_key(self._min), lay.log_key(new_min))
                mins = {key: self._queue_start_at(r, batch, st, new_min)
                        for key, st in self._queues.items() if st.min < st.next}
            self._commit(batch, self._end, {}, mins, self._index_last, new_min)
        log.info("commitlog_expired", segments=count, bytes=count * seg, min_offset=new_min)
        return ExpiryReport(count, count * seg, new_min)

    def _queue_start_at(self, r: Reader, batch: Batch, st: QueueState, log_min: int) -> int:
        """Delete the entries of ``st`` whose record lies below ``log_min``; returns the first
        offset left (the queue's next offset when none is)."""
        qo = st.min
        start = st.prefix + lay.U64.pack(st.min)
        stop = st.prefix + lay.U64.pack(st.next)
        while rows := r.scan(Table.QUEUE, start, stop, 256):
            for k, v in rows:
                qo = lay.U64.unpack_from(k, len(st.prefix))[0]
                if lay.QUEUE_ENTRY.unpack(v)[0] >= log_min:
                    batch.delete_range(Table.QUEUE, st.prefix + lay.U64.pack(st.min), k)
                    return qo
            start = rows[-1][0] + b"\0"
        batch.delete_range(Table.QUEUE, st.prefix + lay.U64.pack(st.min), stop)
        return st.next

    def _release_files(self) -> None:
        if self._driver is not None:
            driver, self._driver = self._driver, None
            try:
                driver.close()
            except DriverError as exc:  # RocksDB refuses even to close once its WAL found
                # the disk full; what it acknowledged is in the WAL, which its next open reads
                log.error("store_close_failed", path=str(self.root), error=str(exc))


def _pull_prefix(entries: list[rules.Entry], max_count: int, max_bytes: int) -> list[int]:
    """Log offsets of the records an unfiltered pull will view from ``entries``, to read in
    one call: up to ``max_count`` of them and ``max_bytes`` (the first always), at most one
    more than the pull keeps.  A filtered pull views what its filter lets through, which
    only the pull knows, and reads one record at a time."""
    wanted: list[int] = []
    budget = max_bytes
    for phys, size, _ in entries[:max_count]:
        wanted.append(phys)
        budget -= size
        if budget <= 0:
            break
    return wanted


def _fields(value: bytes) -> rec.Fields | None:
    """A log row's record fields; None for padding."""
    _, magic = rec.peek(value, 0)
    if magic not in _RECORD_MAGICS:
        return None
    return rec.read_fields(value, 0, check_crc=False)
