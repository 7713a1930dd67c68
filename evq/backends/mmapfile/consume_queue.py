"""ConsumeQueue: the per-(topic, queue) projection of the CommitLog.

Files live in ``consumequeue/<topic>/<queueId>/<20-digit byte offset>``.  Entry *n* of the
queue (queue offset *n*) sits at byte ``20 * n`` of the logical file::

    offset  size  field
         0     8  commit-log physical offset of the record
         8     4  record size
        12     8  tags code (hash of TAGS; the delivery time in SCHEDULE_TOPIC_XXXX)

A zero size marks an entry never written.  Positions before the first entry of a queue that
started late (after expiry or truncation) hold blank entries: offset 0, size 2**31-1.  A file
is allocated a chunk ahead of its last entry (:meth:`MappedFile.reserve`), never written
where it is not.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from evq import durable_fs
from evq.backends.mmapfile.mapped_file import MappedFile, MappedFileQueue
from evq.backends.rules import BLANK_ENTRY_SIZE
from evq.backends.time_samples import TimeSamples

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20
_pack_entry = ENTRY.pack_into
_BLANK = ENTRY.pack(0, BLANK_ENTRY_SIZE, 0)


class ConsumeQueue:
    # The three fields the compiled append reads and sets a send (store_kernels.QueueTail) are
    # slots, read there by their place in the object; the rest stay in the __dict__.
    __slots__ = ("__dict__", "__weakref__", "_last", "next_offset", "ready_below")

    def __init__(
        self, topic: str, queue_id: int, directory: Path, entries_per_segment: int,
        pending: durable_fs.PendingSyncs | None = None,
    ):
        """``pending``: where new files and directories wait to be made durable.  A queue's
        files are created on the append path, under the put lock, where a directory fsync
        would hold every writer up; the projection flush syncs them before its checkpoint
        says the queues are on disk."""
        self.topic = topic
        self.queue_id = queue_id
        self.files = MappedFileQueue(directory, entries_per_segment * ENTRY_SIZE,
                                     random_access=True, pending=pending)
        self.min_offset = 0
        self._last: MappedFile | None = None
        self.ready_below = 0
        """Queue offsets from the last file's start up to this one :meth:`put` writes without
        allocating (their entries wholly allocated): the append path calls :meth:`prepare`
        only for an offset past it (its next offset never lies before the last file), which
        moves it past that offset."""
        self._times = TimeSamples()

    # --- writing (dispatch) ---------------------------------------------------------------

    def prepare(self, queue_offset: int) -> None:
        """Make the file (and chunk) entry ``queue_offset`` goes into ready, so that its
        :meth:`put` cannot fail; raises ``OSError`` (ENOSPC) when the disk has no room.  The
        append path calls this before it writes the record the entry will name."""
        mf = self._last
        pos = queue_offset * ENTRY_SIZE
        if mf is None or not 0 <= pos - mf.start <= mf.allocated - ENTRY_SIZE:
            self._segment_for(pos)

    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> None:
        """Write entry ``queue_offset``; rewriting an existing entry is allowed (recovery
        re-dispatch writes the same values again).  Raises ``OSError`` (ENOSPC) and writes
        nothing when the disk has no room for the entry's file or its next chunk (never after
        :meth:`prepare`)."""
        pos = queue_offset * ENTRY_SIZE
        mf = self._last
        # The whole entry within the allocated blocks: an allocation chunk (1 MiB) is not a
        # multiple of an entry, and one entry in 52,429 straddles a chunk's end.
        if mf is None or not 0 <= pos - mf.start <= mf.allocated - ENTRY_SIZE:
            mf = self._segment_for(pos)
        rel = pos - mf.start
        _pack_entry(mf.mm, rel, physical_offset, size, tags_code)
        if rel >= mf.wrote:  # positions are whole entries
            mf.wrote = rel + ENTRY_SIZE

    def _segment_for(self, pos: int) -> MappedFile:
        files = self.files
        if not files.files:
            # A queue that starts late (its older files expired): blanks before its first entry.
            files.new_segment(pos - pos % files.segment_size)
            self.min_offset = pos // ENTRY_SIZE
        while files.files[-1].end <= pos:
            last = files.files[-1]
            last.reserve(last.size)
            _fill_blanks(last, last.size)
            files.new_segment(last.end)
        mf = files.find(pos)
        if mf is None:
            raise IndexError(f"queue offset {pos // ENTRY_SIZE} is below this queue's files")
        mf.reserve(pos - mf.start + ENTRY_SIZE)
        _fill_blanks(mf, pos - mf.start)
        if mf is files.files[-1]:
            self._set_last(mf)
        return mf

    def _set_last(self, mf: MappedFile | None) -> None:
        self._last = mf
        self.ready_below = (mf.start + mf.allocated) // ENTRY_SIZE if mf is not None else 0

    # --- reading --------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        return self.files.max_offset // ENTRY_SIZE

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        mf = self.files.find(queue_offset * ENTRY_SIZE)
        if mf is None:
            return None
        rel = queue_offset * ENTRY_SIZE - mf.start
        if rel >= mf.wrote:
            return None
        return ENTRY.unpack_from(mf.mm, rel)

    def entries(self, queue_offset: int, max_count: int) -> Iterator[tuple[int, int, int]]:
        """Entries from ``queue_offset`` to at most ``max_count``, within one segment
        (a read never spans segments; the caller comes back for the next)."""
        pos = queue_offset * ENTRY_SIZE
        mf = self.files.find(pos)
        if mf is None:
            return iter(())
        rel = pos - mf.start
        end = min(mf.wrote, rel + max_count * ENTRY_SIZE)
        if end <= rel:
            return iter(())
        return ENTRY.iter_unpack(mf.mm[rel:end])

    # --- recovery and expiry --------------------------------------------------------------

    def load(self) -> None:
        """Map the files and find the written end: entries are written in order, so the
        written part of a segment is a prefix of non-zero sizes (binary search)."""
        self.files.load()
        for mf in self.files.files:
            mf.wrote = mf.flushed = _written_prefix(mf)
            if mf.wrote < mf.size:
                break
        if self.files.files:
            self._set_last(self.files.files[-1])
            self.min_offset = self.files.files[0].start // ENTRY_SIZE

    def truncate_to_log(self, log_end: int) -> None:
        """Drop entries whose record lies beyond the log end (the log lost a tail)."""
        qo = self.max_offset
        first = self.files.min_offset // ENTRY_SIZE
        while qo > first:
            e = self.entry(qo - 1)
            if e is None or (e[1] != BLANK_ENTRY_SIZE and e[0] + e[1] <= log_end):
                break
            qo -= 1
        if qo < self.max_offset:
            self.truncate(qo)

    def truncate(self, queue_offset: int) -> None:
        self.files.truncate(queue_offset * ENTRY_SIZE)
        self._set_last(self.files.last())
        self.min_offset = min(self.min_offset, queue_offset)
        self._times.clear()

    def correct_min_offset(self, log_min: int) -> None:
        """The first entry whose record is still in the log (expiry moved the log start)."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.entry(mid)
            if e is not None and e[1] != BLANK_ENTRY_SIZE and e[0] >= log_min:
                hi = mid
            else:
                lo = mid + 1
        self.min_offset = lo

    def delete_expired(self, log_min: int) -> int:
        """Delete segments whose every entry points below ``log_min``; returns how many."""
        self.correct_min_offset(log_min)
        count = 0
        for mf in self.files.files[:-1]:
            if mf.end // ENTRY_SIZE <= self.min_offset:
                count += 1
            else:
                break
        if count:
            self.files.delete_first(count)
        return count

    def offset_for_time(self, timestamp_ms: int, store_time: Callable[[int], int]) -> int:
        """Search over store times (non-decreasing within a queue)."""

        def time_at(qo: int) -> int:
            e = self.entry(qo)
            return store_time(e[0]) if e is not None and e[1] != BLANK_ENTRY_SIZE else -1

        return self._times.first_at_or_after(self.min_offset, self.max_offset, timestamp_ms,
                                             time_at)

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()
        self._set_last(None)



def _fill_blanks(mf: MappedFile, upto: int) -> None:
    if upto > mf.wrote:
        mf.mm[mf.wrote : upto] = _BLANK * ((upto - mf.wrote) // ENTRY_SIZE)
        mf.wrote = upto


def _written_prefix(mf: MappedFile) -> int:
    n = mf.allocated // ENTRY_SIZE  # past a hole nothing was written (nor may be read)
    lo, hi = 0, n
    mm = mf.mm
    while lo < hi:
        mid = (lo + hi) // 2
        if ENTRY.unpack_from(mm, mid * ENTRY_SIZE)[1] != 0:
            lo = mid + 1
        else:
            hi = mid
    return lo * ENTRY_SIZE
