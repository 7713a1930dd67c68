"""The default backend: RocketMQ's store (CommitLog + ConsumeQueue + IndexFile) on mmap.

Directory layout (``root`` is the store directory; the lock and the abort marker are the
shell's, :mod:`evq.backends.shell`)::

    root/checkpoint                            see checkpoint.py
    root/commitlog/<20-digit offset>           log segments, see evq.domain.record
    root/consumequeue/<topic>/<queue>/<off>    see consume_queue.py
    root/index/<yyyyMMddHHmmssSSS>             see index_file.py

Appends copy each producer-encoded record into the current segment, patch the four broker
fields in place and dispatch the ConsumeQueue and index entries from the facts the caller
already knows (no parsing), all under the put lock.  Recovery and replication dispatch from
the bytes instead (:meth:`MmapMessageLog._scan`); both paths produce the same projections.

Power loss: every file and directory here but the lock is created through
:mod:`evq.durable_fs`, so a CommitLog segment's size and directory entry are on disk before a
record goes into it (the allocator builds the next one ahead), and a sync acknowledgement
waits for msync alone.  ConsumeQueue files, created on the append path, are made durable by
the projection flush before it writes the checkpoint.

The life cycle (lock, abort marker, flusher, cleaner, close) is the shell's,
:mod:`evq.backends.shell`; this module supplies recovery, appends, reads and expiry.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import ClassVar

from evq import durable_fs, logs
from evq.backends import disk, rules
from evq.backends.config import StoreConfig, transient_pool_refusal
from evq.backends.mmapfile.append_loop import NO_QUEUE_ENTRY, AppendRun
from evq.backends.mmapfile.appended import ILLEGAL, REFUSED, AppendedBatch
from evq.backends.mmapfile.checkpoint import Checkpoint
from evq.backends.mmapfile.commit import CommitService
from evq.backends.mmapfile.consume_queue import BLANK_ENTRY_SIZE, ConsumeQueue
from evq.backends.mmapfile.index_file import IndexService
from evq.backends.mmapfile.kernels import KERNELS, StoreKernels
from evq.backends.mmapfile.mapped_file import Allocator, MappedFile, MappedFileQueue, segment_name
from evq.backends.mmapfile.point_reads import PointReads
from evq.backends.mmapfile.transient_pool import TransientStorePool
from evq.backends.shell import StoreShell
from evq.domain import record as rec
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.hashing import index_key_hash
from evq.domain.log import (
    DispatchCallback,
    Dispatched,
    ExpiryReport,
    FlushMode,
    GetStatus,
    KeyQueryResult,
    LogClosed,
    ReadResult,
    ReplicationError,
    TagFilter,
    check_empty,
)
from evq.domain.message import decode_properties
from evq.domain.record import TagsCodeFn, default_tags_code

log = logs.get_logger(__name__)

_STORE_V4 = rec.STORE_V4
_BLANK = rec.BLANK
_INT64 = rec.INT64
_SYSFLAG = struct.Struct(">i")
_RECOVER_LAST_FILES = 3  # normal recovery re-checks the last three segments, as RocketMQ
PROGRESS_EVERY_S = 2.0
"""How often a recovery that re-dispatches records says how far it got (re-dispatch runs at
tens of thousands of records a second: after a crash at full speed, seconds of them)."""
_PROGRESS_CHECK = 4096  # records re-dispatched between looks at the clock
_ESCAPED = "~"  # starts the directory name of a topic outside the legal alphabet


def _queue_dir_name(topic: str) -> str:
    """A topic's ConsumeQueue directory: the raw name, as RocketMQ, for every legal topic.

    Every character a legal name may hold (``[%|a-zA-Z0-9_-]``) is safe in a file name, so a
    legal name is its own directory name and nothing decodes it (decoding ``%de`` in
    ``%RETRY%default`` once lost a whole queue).  A name outside that alphabet (only the
    embedded store API can append one) is spelled ``~`` + its UTF-8 in hex: ``~`` is not a
    legal topic character, so the two spellings never meet.
    """
    if tp.is_legal_topic_chars(topic):
        return topic
    return _ESCAPED + topic.encode().hex()


def _topic_of_dir(name: str) -> str:
    if name.startswith(_ESCAPED):
        return bytes.fromhex(name[len(_ESCAPED):]).decode()
    return name


class MmapMessageLog(StoreShell):
    """Open (and recover) with :meth:`open`; see the module docstring for the layout."""

    kernels: ClassVar[StoreKernels] = KERNELS
    """The append and index loops this class runs (see :mod:`evq.backends.mmapfile.kernels`)."""

    # The fields a single send's append reads and sets (StoreShell's among them: a slot
    # declared here holds what the base's __init__ assigns), in slots, so that the compiled
    # append reads them by their place in the object (store_kernels.LOG_FIELDS), where an
    # instance attribute's lookup each was about a tenth of the append.  The rest stay in the
    # instance's __dict__.
    __slots__ = (
        "_allocator",
        "_clock",
        "_closed",
        "_committer",
        "_dispatched",
        "_host",
        "_index",
        "_last_store_ts",
        "_log",
        "_put_lock",
        "_refused",
        "_run",
        "_subscribers",
        "_warm_at",
    )

    def __init__(
        self,
        root: Path,
        config: StoreConfig,
        clock: Clock,
        tags_code_fn: TagsCodeFn,
    ):
        super().__init__(root, config, clock, tags_code_fn)
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._new_projection_files = durable_fs.PendingSyncs()
        self._dispatched = 0  # log offset up to which projections are applied
        self._allocator = Allocator(warm=config.warm_segments,
                                    allocate_blocks=config.flush is FlushMode.SYNC_FLUSH)
        self._pool = self._transient_pool(config)
        # The log offset at which appends next ask the allocator to warm ahead: never for a
        # locked pool, whose buffers were faulted in when they were locked.
        self._warm_at = sys.maxsize if self._pool is not None and self._pool.locked else 0
        self._committer: CommitService | None = None
        self._log = MappedFileQueue(root / "commitlog", config.commitlog_segment_size,
                                    self._allocator, pool=self._pool)
        self._index = IndexService(root / "index", config.index_slots, config.index_entries,
                                   self._allocator, self.kernels.put_entries, self._put_lock,
                                   self.kernels.chain_offsets, self.kernels.copy_runs,
                                   self.kernels.write_runs)
        self._point_reads = PointReads()
        self._checkpoint: Checkpoint | None = None
        self._checkpoint_lock = threading.Lock()  # the projection rounds' and truncations'
        self._index_ts = 0
        """The checkpoint's indexMsgTimestamp: the store time up to which the index was last
        written back (only every ``flush_index_interval_ms`` in the periodic rounds)."""
        self._index_due = 0.0  # time.monotonic() from which a periodic round writes it back
        self._run = self.kernels.append_run(
            records=(), mf=None, mm=None, start=0, pos=0, room=0,  # type: ignore[arg-type]
            min_size=rec.MIN_RECORD_SIZE, max_size=self._max_record, now=-1, store_fields=b"",
            cqs=self._cqs, patch_v6=self._patch_store_fields,
        )
        """The append loop's state (see :meth:`append`), used under the put lock."""
        if self.kernels.append is not None:
            # The compiled append (store_kernels.pyx) as this store's own: a method calling it
            # would add the Python frame the twin exists to save.
            self.append = types.MethodType(self.kernels.append, self)  # type: ignore[method-assign]
        if self.kernels.read_queue is not None:  # the compiled pull, as this store's own
            self._read_queue = types.MethodType(  # type: ignore[method-assign]
                self.kernels.read_queue, self)

    def _transient_pool(self, config: StoreConfig) -> TransientStorePool | None:
        """The transient store pool if the config enables it and its rule allows it (see
        :func:`evq.backends.config.transient_pool_refusal`; a warning says why not)."""
        if not config.transient_store_pool_enable:
            return None
        why = transient_pool_refusal(config)
        if why:
            log.warning("transient_store_pool_ignored", path=str(self.root), reason=why)
            return None
        log.info("transient_store_pool_enabled", path=str(self.root),
                 buffers=config.transient_store_pool_size,
                 buffer_bytes=config.commitlog_segment_size)
        return TransientStorePool(config.transient_store_pool_size,
                                  config.commitlog_segment_size)

    # --- opening and recovery ------------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        config: StoreConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        tags_code_fn: TagsCodeFn = default_tags_code,
        background: bool = True,
    ) -> MmapMessageLog:
        """Open the store at ``root``, recovering after a crash if the abort marker is there.

        ``background=False`` runs no cleaner thread (tests drive :meth:`expire` themselves).
        """
        self = cls(Path(root), config or StoreConfig(), clock, tags_code_fn)
        self._start(background)
        return self

    def _recover(self, abnormal: bool) -> tuple[int, int]:
        self._checkpoint = Checkpoint(self.root / "checkpoint")
        self._index_ts = self._checkpoint.index_ts
        self._log.load()
        self._load_consume_queues()
        self._index.load((self._checkpoint.index_file, self._checkpoint.index_synced))
        return self._recover_log(abnormal)

    def _prepare_appends(self) -> None:
        """A segment to append to, allocated a chunk past its end (whatever was written
        before is allocated, so a full disk needs no more space for the store to open).  On a
        full disk the store opens and serves reads: puts are refused until
        :meth:`_allocate_again` succeeds."""
        try:
            self._allocate_again()
        except OSError as exc:
            if not disk.no_space(exc):
                raise
            log.warning("store_opened_on_full_disk", path=str(self.root), error=str(exc))
            self._found_no_space(exc)
        last = self._log.last()
        if last is not None:  # warm where appends go before the first asks (see _warm_ahead)
            self._warm_ahead(last, last.wrote)
        self._index.prepare(self._clock.now_ms())
        if self._pool is not None:
            self._committer = CommitService(
                self._log, self.config, notify=self._subscribers.notify,
                committed=self._wake_flusher, failed=self._commit_failed,
            )

    def make_readable(self, end_offset: int) -> None:
        """With a transient store pool, commit now if readers do not see ``end_offset`` yet
        (a commit of whatever the buffers hold: bytes the commit service would write within
        its interval anyway)."""
        if self._committer is not None and self._log.read_end < end_offset:
            self._commit()
            self._wake_flusher()

    def _commit(self) -> int:
        """Commit the pool buffers now; returns the committed end.  A commit that finds no
        space refuses puts (:meth:`_commit_failed`) and leaves the bytes for a later one."""
        assert self._committer is not None
        try:
            return self._committer.commit_now()
        except OSError as exc:
            if not disk.no_space(exc):
                raise
            log.warning("commit_failed", error=str(exc))
            self._commit_failed(exc)
            return self._log.read_end

    def _wake_flusher(self) -> None:
        flusher = self._flusher
        if flusher is not None:
            flusher.wake()

    def _commit_failed(self, exc: OSError) -> None:
        """A commit that found no space (the blocks are reserved before an append, so only a
        file system that takes more for its own bookkeeping): refuse puts until there is
        room; the bytes stay in the pool buffers and the next commit writes them."""
        if disk.no_space(exc):
            self._found_no_space(exc)

    def _allocate_again(self) -> None:
        """With a transient store pool, what a commit left in the buffers goes to the files
        first (its arrivals announced): puts resume once everything acknowledged is there."""
        if self._committer is not None:
            self._committer.commit_now()
        last = self._log.last()
        if last is None:
            self._log.new_segment(0)
        else:
            last.reserve(last.wrote + rec.BLANK_SIZE)
            self._log.lend_buffer(last)
            self._log.prefetch_after(last)

    def _load_consume_queues(self) -> None:
        base = self.root / "consumequeue"
        if not base.is_dir():
            return
        for tdir in sorted(base.iterdir()):
            for qdir in sorted(tdir.iterdir()):
                if not qdir.name.isdigit():
                    continue
                cq = self._new_cq(_topic_of_dir(tdir.name), int(qdir.name))
                cq.load()
                cq.next_offset = cq.max_offset

    def _new_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            topic, queue_id,
            self.root / "consumequeue" / _queue_dir_name(topic) / str(queue_id),
            self.config.consume_queue_entries, self._new_projection_files,
        )
        cq.next_offset = 0
        self._cqs[(topic, queue_id)] = cq
        return cq

    def _recover_log(self, abnormal: bool) -> tuple[int, int]:
        """Find the log end, cut what lies past it, and bring projections up to it.

        Normal shutdown: CRC-check the last three segments.  Crash: re-check from the last
        segment whose first record predates the checkpoint.  Either way projections are
        re-dispatched from where the consume queues stop covering the log; after a crash, from
        no later than the checkpoint's log offset either.
        """
        files = self._log.files
        if not files:
            for cq in self._cqs.values():
                cq.truncate(0)
                cq.next_offset = 0
            self._index.truncate(0)
            return 0, 0
        if abnormal:
            assert self._checkpoint is not None
            floor = self._checkpoint.min_timestamp
            start_i = 0
            for i in range(len(files) - 1, -1, -1):
                ts = self._first_store_ts(files[i])
                if 0 <= ts <= floor:
                    start_i = i
                    break
        else:
            start_i = max(0, len(files) - _RECOVER_LAST_FILES)
        covered = max((self._cq_coverage(cq) for cq in self._cqs.values()), default=0)
        covered = max(covered, files[0].start)
        # The index of an appended batch is written after its records' ConsumeQueue entries,
        # so after a crash it may lag them; re-dispatch from wherever either projection stops
        # (not earlier than the checkpoint's segment: a record without keys leaves the index
        # end behind without anything missing), rather than re-dispatching whole segments.
        # After a power cut the projection files are not even of one moment: the kernel wrote
        # some pages back and not others, so one queue may reach further than another, or
        # than the index.  Everything below the checkpoint's offset was flushed before it was
        # written, so re-dispatch starts there at the latest.
        index_covered = max(self._index.end_phys, files[start_i].start)
        assert self._checkpoint is not None
        flushed = max(self._checkpoint.physic_offset, files[0].start)
        dispatch_from = min(covered, index_covered, flushed) if abnormal else covered
        scan_from = min(files[start_i].start, dispatch_from)
        log.info("store_recovery_scan", path=str(self.root), abnormal=abnormal,
                 scan_from=scan_from, dispatch_from=dispatch_from)
        for mf in files:  # positions are unknown until scanned: assume full, the scan cuts
            mf.wrote = mf.flushed = mf.allocated  # (never reading a hole: see mapped_file)
        end = self._scan(scan_from, dispatch_from=dispatch_from,
                         check_crc=self.config.check_crc_on_recover)
        cut = self._cut(end)
        self._dispatched = end
        return end, cut

    def _first_store_ts(self, mf: MappedFile) -> int:
        if mf.allocated < rec.MIN_RECORD_SIZE:  # nothing written (and a hole to read)
            return -1
        size, magic = rec.peek(mf.mm, 0)
        if magic not in (rec.MAGIC_V1, rec.MAGIC_V2) or size < rec.MIN_RECORD_SIZE:
            return -1
        return self._store_ts_in(mf.mm, 0)

    @staticmethod
    def _store_ts_in(mm: mmap.mmap, rel: int) -> int:
        (flags,) = _SYSFLAG.unpack_from(mm, rel + rec.SYSFLAG_AT)
        return _INT64.unpack_from(mm, rel + rec.store_timestamp_at(flags))[0]

    def _cq_coverage(self, cq: ConsumeQueue) -> int:
        """Log offset just past the last record this queue has an entry for."""
        mx = cq.max_offset
        if mx <= cq.min_offset:
            return 0
        e = cq.entry(mx - 1)
        return e[0] + e[1] if e is not None and e[1] != BLANK_ENTRY_SIZE else 0

    def _scan(self, start: int, *, dispatch_from: int, check_crc: bool) -> int:
        """Validate records from ``start``; dispatch those at or past ``dispatch_from``.

        Returns the offset of the first byte that is not a valid record: a short or zero
        size, a wrong magic, a CRC mismatch, or a PHYSICALOFFSET field that disagrees with
        the record's position (a torn write that never got its offsets patched).
        """
        pos = start
        batch: list[Dispatched] = []
        report = bool(self._subscribers)
        # Index entries wait here while records share a store time, and go in one put (one
        # a record was a sixth of a re-dispatch); the scan's records are in log order.
        indexed: list[tuple[tuple[int, ...], int]] = []
        indexed_ts = 0
        now = self._clock.now_ms()  # once a scan: a clock call a record was a twentieth of it
        ceiling = now + rules.MAX_CLOCK_SKEW_MS  # see _note_store_ts
        dispatched = 0
        report_at = time.monotonic() + PROGRESS_EVERY_S
        mf: MappedFile | None = None
        while True:
            if mf is None or not mf.start <= pos < mf.end:  # (the segments stay as they are)
                mf = self._log.find(pos)
                if mf is None:
                    break
            if pos < dispatch_from:
                # What needs no dispatch is only validated: a normal restart re-checks three
                # segments, a run the record codec checks without an object per record.
                # Whatever stopped it (padding, the end, a bad record, dispatch_from) is then
                # looked at below.
                pos, latest = rec.valid_run(mf.mm, pos - mf.start, mf.wrote, pos,
                                            dispatch_from, check_crc=check_crc,
                                            ceiling=ceiling)
                if latest >= 0:
                    self._note_store_ts(latest, now)
            rel = pos - mf.start
            if rel + rec.BLANK_SIZE > mf.wrote:
                break
            size, magic = rec.peek(mf.mm, rel)
            if rules.is_padding(size, magic, pos, mf.size):
                pos = mf.end
                continue
            if size <= 0 or rel + size > mf.wrote:
                break
            f = rules.valid_record(memoryview(mf.mm)[rel : rel + size], 0, pos,
                                   check_crc=check_crc)
            if f is None:
                break
            self._note_store_ts(f.store_timestamp, now)
            if pos >= dispatch_from:
                if indexed and f.store_timestamp != indexed_ts:
                    self._index.put(indexed, indexed_ts)
                    indexed = []
                indexed_ts = f.store_timestamp
                d = self._dispatch_fields(f, pos, indexed, report)
                if d is not None:
                    batch.append(d)
                dispatched += 1
                if not dispatched % _PROGRESS_CHECK and time.monotonic() >= report_at:
                    report_at = time.monotonic() + PROGRESS_EVERY_S
                    log.info("store_redispatch_progress", path=str(self.root), at=pos,
                             since=dispatch_from, records=dispatched)
            pos += size
        if indexed:
            self._index.put(indexed, indexed_ts)
        if batch:
            self._subscribers.notify(batch)
        return pos

    def _note_store_ts(self, ts: int, now: int) -> None:
        """Recovery scans the newest records even when nothing needs dispatching, to find the
        store-time floor (:func:`evq.backends.rules.later_store_time`; ``now``: the clock as
        the scan began)."""
        self._last_store_ts = rules.later_store_time(self._last_store_ts, ts, now)

    def _dispatch_fields(self, f: rec.Fields, phys: int,
                         indexed: list[tuple[tuple[int, ...], int]], report: bool
                         ) -> Dispatched | None:
        """Apply one parsed record to the projections (recovery and replication): its queue
        entry now, its index entry (if the index does not hold it yet) onto ``indexed`` for
        the caller to put.  The record's event if ``report`` (someone listens) and it went
        into a queue."""
        props = decode_properties(f.properties)
        keys = rec.index_keys_of(props, f.sysflag)
        if keys and phys > self._index.end_phys:
            indexed.append((tuple(index_key_hash(f.topic, k) for k in keys), phys))
        if f.sysflag & sf.TRANSACTION_MASK in sf.NOT_CONSUMABLE:
            return None
        key = (f.topic, f.queue_id)
        cq = self._cqs.get(key) or self._new_cq(*key)
        if f.queue_offset != cq.next_offset and cq.next_offset and not self._redispatch_ok(
            cq, f, phys
        ):
            return None
        tags = self._tags_code_fn(f.topic, props, f.store_timestamp)
        cq.put(f.queue_offset, phys, f.size, tags)
        if f.queue_offset >= cq.next_offset:
            cq.next_offset = f.queue_offset + 1
        if not report:
            return None
        return Dispatched(f.topic, f.queue_id, f.queue_offset, phys, f.size, tags,
                          f.store_timestamp, f.sysflag)

    def _redispatch_ok(self, cq: ConsumeQueue, f: rec.Fields, phys: int) -> bool:
        """May a record whose queue offset is not its queue's next one go into the queue?
        Only as the same entry again (a re-dispatch), over a blank, or over an entry that
        names no record holding that place (what a power cut leaves of an entry it never
        wrote back, or tore at a page boundary).  No CRC covers QUEUEOFFSET or QUEUEID: a
        damaged one must neither overwrite another record's entry nor blank-fill the queue up
        to a far offset (any number of files); the record keeps the entry it already has, if
        any."""
        e = cq.entry(f.queue_offset) if f.queue_offset < cq.next_offset else None
        if e is not None and (e[1] == BLANK_ENTRY_SIZE or (e[0], e[1]) == (phys, f.size)
                              or not self._holds_place(e, cq, f.queue_offset)):
            return True
        log.warning(
            "dispatch_skipped", reason="queue offset out of sequence", topic=f.topic,
            queue_id=f.queue_id, queue_offset=f.queue_offset, next_offset=cq.next_offset,
            physical_offset=phys,
        )
        return False

    def _holds_place(self, entry: tuple[int, int, int], cq: ConsumeQueue, queue_offset: int
                     ) -> bool:
        """Whether ``entry`` points at a whole record of the log that is the one at
        ``queue_offset`` of ``cq``."""
        phys, size, _ = entry
        view = self.lookup(phys)
        if view is None or len(view) != size:
            return False
        try:
            g = rec.read_fields(view, 0, check_crc=False)
        except rec.RecordError:
            return False
        return (g.topic, g.queue_id, g.queue_offset) == (cq.topic, cq.queue_id, queue_offset)

    def _cut(self, end: int) -> int:
        """Truncate the log and every projection at ``end``; returns the bytes dropped."""
        dropped = self._log.truncate(end)
        self._point_reads.keep(self._log.files)
        if dropped:
            log.warning("commitlog_truncated", at=end, cut_bytes=dropped)
        for cq in self._cqs.values():
            cq.truncate_to_log(end)
            cq.next_offset = cq.max_offset
            cq.correct_min_offset(self._log.min_offset)
        self._index.truncate(end)
        cp = self._checkpoint
        if cp is not None and cp.index_synced:
            with self._checkpoint_lock:  # entries it counts may be zeros from now on
                cp.index_file = cp.index_synced = 0
                cp.save()
        return dropped

    # --- writing -------------------------------------------------------------------------

    def append(self, records: Sequence[rec.PutRecord]) -> AppendedBatch:
        """The reference of ``append`` in store_kernels.pyx, which replaces it per instance
        where the kernels are compiled (see :meth:`__init__`): a change here is made there."""
        with self._put_lock:
            if self._closed:
                raise LogClosed("the log is closed")
            if self._refused:  # the disk is full: see evq.backends.shell
                return AppendedBatch([REFUSED] * len(records), 0, self._host)
            now = self._clock.now_ms()
            # Store times never go backwards, so offset-for-time can binary search a queue.
            if now < self._last_store_ts:
                now = self._last_store_ts
            self._last_store_ts = now
            # One run a store, refreshed a call (a run built a call was a sixth of a single
            # send's append): the write segment and its writer (the mapping, or with a
            # transient store pool the buffer the commit service writes to the file: readers
            # never look there, see _queue_end, MappedFile.read_end) as they are now, and
            # the store fields packed once a millisecond.
            run = self._run
            mf = self._log.files[-1]
            run.at(mf)
            if now != run.now:
                run.now, run.store_fields = now, _STORE_V4.pack(now, self._host)
            run.records, run.places, run.indexed = records, [], []
            run.notify = [] if self._subscribers else None
            append_records, count, i, prepared = self.kernels.append_records, len(records), 0, -1
            try:
                # The loop appends records while they take the fast path; the rare steps
                # between are taken here (see append_loop).
                while (i := append_records(run, i)) < count:
                    if i == prepared:  # its rare step left it off the fast path: a bug
                        raise RuntimeError(f"the append loop stopped twice at record {i}")
                    prepared = i
                    i += self._prepare_record(run, records[i])
            except OSError as exc:
                if not disk.no_space(exc):
                    raise
                # The disk is full.  Whatever can fail (a segment or its next chunk, a queue's
                # file or chunk) is allocated before a record is written, so the records
                # appended so far stay whole and the rest are refused, as is every put until
                # there is room again (see evq.backends.shell).
                self._found_no_space(exc)
                run.places += [REFUSED] * (count - len(run.places))
            # Out of the run before anything else runs: a dispatch subscriber may append
            # (the lock is reentrant), and the run then keeps no batch alive.
            places, indexed, notify, mf, pos, end = (
                run.places, run.indexed, run.notify, run.mf, run.pos, run.start + run.pos)
            run.records = ()
            if indexed:
                self._put_index(indexed, now)
            self._dispatched = end
            self._warm_ahead(mf, pos)
            if notify:
                if self._committer is not None:  # announced once they are in the file
                    self._committer.defer(end, notify)
                else:
                    self._subscribers.notify(notify)
        return AppendedBatch(places, now, self._host)

    def _warm_ahead(self, mf: MappedFile, pos: int) -> None:
        """Have the allocator fault in the pages past ``pos`` of the write segment ``mf``
        whenever the writer crosses into a new chunk (see :meth:`Allocator.warm_ahead`)."""
        if mf.start + pos >= self._warm_at:
            self._warm_at = self._allocator.warm_ahead(mf, pos)

    def _prepare_record(self, run: AppendRun, r: rec.PutRecord) -> int:
        """The rare steps before record ``r`` (where :func:`append_records` stopped): returns
        1 if it is refused as illegal (its place noted), else 0 once it will take the fast path:
        the segment rolled or allocated further, its queue made and ready.  Raises ``OSError``
        (ENOSPC) before any byte of it is written."""
        n = len(r.data)
        if not run.min_size <= n <= run.max_size:
            run.places.append(ILLEGAL)
            return 1
        if run.pos + n > run.room:
            mf, pos = run.mf, run.pos
            seg = mf.size
            if pos + n > seg - rec.BLANK_SIZE:
                if pos + rec.BLANK_SIZE <= seg:  # a log cut at a segment end: none
                    _BLANK.pack_into(run.mm, pos, seg - pos, rec.BLANK_MAGIC)
                mf.wrote = seg
                mf = self._log.new_segment(mf.end)
                self._note_usage()
            # Allocated before a byte of the record is written (or OSError).
            mf.reserve(mf.wrote + n + rec.BLANK_SIZE)
            run.at(mf)
        if not r.sysflag & NO_QUEUE_ENTRY:
            key = (r.topic, r.queue_id)
            cq = self._cqs.get(key) or self._new_cq(*key)
            if cq.next_offset >= cq.ready_below:  # may find no space: before the record
                cq.prepare(cq.next_offset)
        return 0

    def _put_index(self, indexed: list[tuple[tuple[int, ...], int]], now: int) -> None:
        """Index appended records.  The index is the one projection a full disk may cost
        entries (RocketMQ's too): the records are stored and acknowledged by then, so a
        lookup by key misses them, and puts are refused until there is room."""
        try:
            self._index.put(indexed, now)
        except OSError as exc:
            self._index_failed(indexed, exc)

    def _index_failed(self, indexed: list[tuple[tuple[int, ...], int]], exc: OSError) -> None:
        """What :meth:`_put_index` (and the compiled append) do when the index put raised
        ``exc``: a full disk drops the entries left, anything else propagates."""
        if not disk.no_space(exc):
            raise exc
        log.warning("index_entries_dropped", records=len(indexed), error=str(exc))
        self._found_no_space(exc)

    def _patch_store_fields(self, mm: mmap.mmap, pos: int, flags: int, now: int) -> None:
        rules.stamp_store_fields(mm, pos, flags, now, self._host)  # type: ignore[arg-type]

    def _flush_log(self, target: int) -> int:
        """msync every segment holding bytes below ``target``; returns the durable end.

        Not under the put lock: appends only add bytes past ``wrote`` and segments after the
        last, so the segment list's own lock gives a consistent snapshot without making the
        group commit queue behind writers.  With a transient store pool everything written
        is committed first (this is also the last flush at close).
        """
        if self._committer is not None:  # what a failed commit left out waits for the next
            target = max(target, self._commit())
        with self._log.lock:
            files = list(self._log.files)
        for mf in files:
            if mf.flushed < mf.read_end and mf.start < target:
                mf.flush()
        durable = target
        for mf in files:
            if mf.flushed < mf.wrote:
                durable = min(durable, mf.start + mf.flushed)
                break
        return durable

    def _flush_projections(self, periodic: bool = False) -> None:
        """A periodic round writes the index head back only every ``flush_index_interval_ms``:
        under unique keys nearly every page of its slot table changes within a second, and
        copying and writing back 20 MB a second took the loop's time slices (issue 18).
        Between write-backs a round puts the index's new entries on disk and the checkpoint
        records how many (see :mod:`~evq.backends.mmapfile.index_file`): a crash links them
        in again, and re-indexes from the log only what came after.  The checkpoint keeps
        the index's time of the last write-back, where recovery's scan starts at the latest
        should the entries not be there (:meth:`_recover_log`)."""
        with self._put_lock:
            cqs = list(self._cqs.values())
            last_ts = self._last_store_ts
            durable = self._flusher.durable if self._flusher else 0
            truncations = self._index.truncations
        for cq in cqs:
            cq.flush()
        now = time.monotonic()
        synced = self._index.sync_entries() if periodic and now < self._index_due else None
        if synced is None:
            self._index.flush()
            self._index_due = now + self.config.flush_index_interval_ms / 1000
            self._index_ts = last_ts
            synced = (0, 0)
        self._new_projection_files.sync()
        cp = self._checkpoint
        if cp is not None:
            with self._checkpoint_lock:
                if self._index.truncations != truncations:
                    synced = (0, 0)  # what it counted may be gone
                cp.physic_ts = cp.logics_ts = last_ts
                cp.index_ts = self._index_ts
                cp.physic_offset = durable
                cp.index_file, cp.index_synced = synced
                cp.save()

    def subscribe_dispatch(self, callback: DispatchCallback,
                           wanted: Sized | None = None) -> Callable[[], None]:
        unsubscribe = super().subscribe_dispatch(callback, wanted)
        if self._committer is not None:
            # Appends before the subscription built no reports, and with a pool their
            # records become readable only once committed: commit them now, so the
            # listener's first read sees them.
            self._commit()
        return unsubscribe

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
        if self._closed:  # the files are unmapped: any answer would be made up
            raise LogClosed("the log is closed")
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return ReadResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        return self._read_queue(cq, offset, max_count, max_bytes, tag_filter)

    def _read_queue(self, cq: ConsumeQueue, offset: int, max_count: int, max_bytes: int,
                    tag_filter: TagFilter | None) -> ReadResult:
        """A pull from ``cq``: the reference of ``read_queue`` in store_kernels.pyx, which
        replaces it per instance where the kernels are compiled (see :meth:`__init__`)."""
        return rules.read_queue(
            offset, cq.min_offset, self._queue_end(cq), max_count=max_count, max_bytes=max_bytes,
            tag_filter=tag_filter, entries=lambda qo, n: list(cq.entries(qo, n)),
            view=self._viewer(), log_min=self._log.min_offset,
            entries_per_file=self.config.consume_queue_entries,
        )

    def _queue_end(self, cq: ConsumeQueue, committed: int | None = None) -> int:
        """The queue offset past the last entry whose record readers may see.

        Without a pool, the queue's end.  With one, entries are written at append time, before
        their records reach the file: the end is the first entry whose record lies past the
        committed end of the log (entries follow the log, so a binary search finds it; an
        entry still being written counts as past).  Reads stop there, rather than skip a
        record they cannot see yet and move the consumer past it for good.  ``committed``:
        the log's committed end, for a caller that asks for many queues at one moment.
        """
        hi = cq.next_offset
        if self._pool is None:
            return hi
        if committed is None:
            committed = self._log.read_end

        def unseen(qo: int) -> bool:
            e = cq.entry(qo)
            return e is None or (e[1] != BLANK_ENTRY_SIZE and e[0] + e[1] > committed)

        lo = cq.min_offset
        if hi <= lo or not unseen(hi - 1):
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi) // 2
            if unseen(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def _viewer(self) -> rules.ViewFn:
        """The record views of one pull.  A pull's records lie one after another in the log,
        nearly always in one segment, so the segment last found is kept with one view of it
        and the end readers may see, taken at its first use: the queue's end was read before
        that, so every record of an entry below it lies within."""
        find = self._log.find
        seg_start = seg_limit = 0
        seg: memoryview | None = None

        def view(phys: int, size: int) -> memoryview | None:
            nonlocal seg_start, seg_limit, seg
            rel = phys - seg_start
            if seg is None or rel < 0 or rel + size > seg_limit:
                mf = find(phys)
                if mf is None:
                    return None
                seg_start, seg_limit, seg = mf.start, mf.read_end, memoryview(mf.mm)
                rel = phys - seg_start
                if rel + size > seg_limit:
                    return None
            return seg[rel : rel + size]

        return view

    def lookup(self, physical_offset: int) -> memoryview | None:
        if self._closed:
            raise LogClosed("the log is closed")
        mf = self._log.find(physical_offset)
        if mf is None or physical_offset < self._log.min_offset:
            return None
        rel = physical_offset - mf.start
        if rel + rec.BLANK_SIZE > mf.read_end:
            return None
        mm = self._point_reads.mapping(mf)
        size, magic = rec.peek(mm, rel)
        if magic not in (rec.MAGIC_V1, rec.MAGIC_V2) or size < rec.MIN_RECORD_SIZE:
            return None
        if rel + size > mf.read_end:
            return None
        if _INT64.unpack_from(mm, rel + rec.PHYSICAL_OFFSET_AT)[0] != physical_offset:
            return None
        return memoryview(mm)[rel : rel + size]

    def query_keys(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> KeyQueryResult:
        if self._closed:
            raise LogClosed("the log is closed")
        # The index answers whole seconds and hashed keys: the shared rule checks the records.
        records, offsets = rules.query_keys(
            lambda limit: self._index.lookup(topic, key, begin_ms, end_ms, limit), self.lookup,
            topic, key, max_count, begin_ms, end_ms, self.max_physical_offset,
        )
        ts, phys_last = self._index.last_update
        return KeyQueryResult(records, offsets, ts, phys_last)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        return cq.offset_for_time(timestamp_ms, self._store_ts_at_phys)

    def _store_ts_at_phys(self, phys: int) -> int:
        mf = self._log.find(phys)
        if mf is None or phys < self._log.min_offset or phys - mf.start >= mf.read_end:
            return -1
        return self._store_ts_in(self._point_reads.mapping(mf), phys - mf.start)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        if cq is None or not cq.min_offset <= offset < self._queue_end(cq):
            return -1
        e = cq.entry(offset)
        if e is None or e[1] == BLANK_ENTRY_SIZE:
            return -1
        return self._store_ts_at_phys(e[0])

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self._cqs.get((topic, queue_id))
        return (cq.min_offset, self._queue_end(cq)) if cq is not None else (0, 0)

    def queues(self) -> dict[tuple[str, int], int]:
        """Max offsets as :meth:`bounds` gives them: with a transient store pool, of the
        entries whose records are committed, so that no figure promises what a pull cannot
        read yet."""
        with self._put_lock:
            committed = self._log.read_end
            return {k: self._queue_end(cq, committed) for k, cq in self._cqs.items()}

    # --- raw log -------------------------------------------------------------------------

    @property
    def min_physical_offset(self) -> int:
        return self._log.min_offset

    @property
    def max_physical_offset(self) -> int:
        """The end of what readers see: with a transient store pool, of what is committed
        (RocketMQ's ``getMaxPhyOffset``); replication ships no further."""
        return self._log.read_end

    def _log_end(self) -> int:
        return self._log.read_end

    def read_log(self, physical_offset: int, max_bytes: int) -> bytes:
        if self._closed:
            raise LogClosed("the log is closed")
        mf = self._log.find(physical_offset)
        if mf is None:
            return b""
        rel = physical_offset - mf.start
        return mf.mm[rel : min(mf.read_end, rel + max_bytes)]

    def append_replicated(self, physical_offset: int, data: bytes | memoryview) -> int:
        with self._put_lock:
            if self._closed:
                raise LogClosed("the log is closed")
            end = self._log.max_offset
            if physical_offset != end:
                raise ReplicationError(
                    f"replicated bytes start at {physical_offset}, this log ends at {end}"
                )
            view = memoryview(data)
            if not self._log.files:  # its first segment found no space when the store opened
                self._log.new_segment(end - end % self.config.commitlog_segment_size)
            while view:
                mf = self._log.files[-1]
                if mf.wrote == mf.size:
                    mf = self._log.new_segment(mf.end)
                n = min(len(view), mf.size - mf.wrote)
                mf.reserve(mf.wrote + n)  # a full disk: OSError, and the slave asks again
                mf.writer[mf.wrote : mf.wrote + n] = view[:n]
                mf.wrote += n
                view = view[n:]
            # A slave runs without the pool (transient_pool_refusal); should a store with one
            # take replicated bytes, they are committed at once, for the scan reads the file.
            new_end = self._log.commit()
            reached = self._scan(self._dispatched, dispatch_from=self._dispatched, check_crc=True)
            # Records may be split across transfers: an incomplete tail waits for the rest.
            if reached < new_end and not self._incomplete_tail(reached, new_end):
                self._cut(reached)
                raise ReplicationError(f"replicated bytes hold a broken record at {reached}")
            self._dispatched = reached
            return new_end

    def _incomplete_tail(self, pos: int, end: int) -> bool:
        mf = self._log.find(pos)
        if mf is None:
            return True
        rel = pos - mf.start
        if end - pos < 8:
            return True
        size, magic = rec.peek(mf.mm, rel)
        return magic in (rec.MAGIC_V1, rec.MAGIC_V2) and size > end - pos

    def begin_at(self, physical_offset: int) -> None:
        with self._put_lock:
            if self._closed:
                raise LogClosed("the log is closed")
            check_empty(self.min_physical_offset, self.max_physical_offset)
            size = self.config.commitlog_segment_size
            if physical_offset % size:  # recovery scans segments from their first byte
                raise ReplicationError(f"this store begins only at a multiple of its segment "
                                       f"size {size}, not at {physical_offset}")
            self._log.begin_at(physical_offset)
            self._point_reads.keep(self._log.files)
            self._dispatched = physical_offset
            if self._flusher is not None:
                self._flusher.restart(physical_offset)

    def truncate(self, physical_offset: int) -> None:
        with self._put_lock:
            if self._closed:
                raise LogClosed("the log is closed")
            if physical_offset >= self._log.max_offset:
                return
            self._cut(physical_offset)
            self._dispatched = min(self._dispatched, physical_offset)
            if self._flusher is not None:
                self._flusher.cut(physical_offset)
            if not self._log.files:
                self._log.new_segment(physical_offset - physical_offset %
                                      self.config.commitlog_segment_size)

    # --- projections, expiry, lifecycle ---------------------------------------------------

    def expire(self, now_ms: int | None = None, *, force: bool = False) -> ExpiryReport:
        now = self._clock.now_ms() if now_ms is None else now_ms
        keep_ms = self.config.file_reserved_hours * 3600 * 1000
        with self._put_lock:
            files = self._log.files
            # Never delete bytes a projection has not applied: only segments whose successor
            # starts within the dispatched part of the log may go.
            applied = sum(1 for mf in files if mf.start <= self._dispatched)
            count = rules.expired_segments(
                applied, lambda i: self._first_store_ts(files[i]), now, keep_ms, force=force
            )
            gone = self._log.delete_first(count)
            self._point_reads.keep(self._log.files)
            log_min = self._log.min_offset
            for cq in self._cqs.values():
                cq.delete_expired(log_min)
            self._index.delete_expired(log_min)
        deleted = sum(mf.size for mf in gone)
        if gone:
            log.info("commitlog_expired", segments=[segment_name(mf.start) for mf in gone],
                     bytes=deleted, min_offset=log_min)
        return ExpiryReport(len(gone), deleted, log_min)

    def _release_files(self) -> None:
        if self._committer is not None:
            self._committer.close()
        self._allocator.close()
        for cq in self._cqs.values():
            cq.close()
        self._index.close()
        self._log.close()
        self._point_reads.keep([])
        if self._pool is not None:
            self._pool.close()
        if self._checkpoint is not None:
            self._checkpoint.close()
