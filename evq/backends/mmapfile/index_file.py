"""IndexFile: the key index projection (``topic#KEY`` and ``topic#UNIQ_KEY`` -> log offsets).

Files live in ``index/<yyyyMMddHHmmssSSS>`` (creation time, local zone).  Layout, big-endian but
for the slots::

    +------------------------------ header, 40 bytes ------------------------------+
    | 0 beginTimestamp 8 | 8 endTimestamp 8 | 16 beginPhyOffset 8 | 24 endPhyOffset 8 |
    | 32 hashSlotCount 4 | 36 indexCount 4 (starts at 1; entry 0 is never used)       |
    +------------------------ slots: N x 4 bytes, little-endian ----------------------+
    | slot[h % N] = number of the newest entry for that bucket, 0 = empty              |
    +---------------------------- entries: M x 20 bytes -----------------------------+
    | keyHash 4 | commit-log offset 8 | seconds since beginTimestamp 4 | prev entry 4  |
    +---------------------------------------------------------------------------------+

Entry *i* sits at ``40 + 4 * N + 20 * i``; ``prev`` chains entries of one bucket, newest
first.  keyHash is :func:`evq.domain.hashing.index_key_hash` (CRC-32 where RocketMQ uses the
Java string hash; see there why).  The header is rewritten with every put, in the same
mapping, after the entries and the slots; recovery re-dispatch skips offsets below
endPhyOffset.  Entries past ``indexCount`` are zero, except those a process killed in the
middle of a put wrote: opening the file points their slots back at counted entries.

A file's header and slots are allocated when it is created, its entries a chunk ahead of the
writer (:meth:`~evq.backends.mmapfile.mapped_file.MappedFile.reserve`).

Slots are little-endian where RocketMQ's are big-endian: every put reads and writes two of
them at random places, and a native ``int`` view of the slot area does that in half the time
``struct`` calls take (the index is evq's own: its hash already differs from RocketMQ's).
"""

from __future__ import annotations

import mmap
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

from evq import durable_fs
from evq.backends.mmapfile.mapped_file import Allocator, MappedFile, prefault
from evq.domain.hashing import index_key_hash

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
SLOT_SIZE = 4
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 20
MAX_TIME_DIFF = 0x7FFFFFFF

if sys.byteorder != "little":  # pragma: no cover - the slot view is native
    raise ImportError("evq's IndexFile reads its little-endian slots through a native view")


def index_file_size(slots: int, max_entries: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE + max_entries * ENTRY_SIZE


def index_file_name(ms: int) -> str:
    t = time.localtime(ms / 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


PutEntries = Callable[
    [mmap.mmap, memoryview, int, int, list[tuple[tuple[int, ...], int]], int, int, int, int,
     int],
    tuple[int, int, int]]
"""The signature of :func:`put_entries` and of its compiled twin."""


def put_entries(
    mm: mmap.mmap, slot: memoryview, slots: int, base: int,
    items: list[tuple[tuple[int, ...], int]], done: int, count: int, used: int, limit: int,
    diff: int,
) -> tuple[int, int, int]:
    """Write the entries of ``items[done:]`` from entry ``count`` on while an item's entries
    all fit below entry ``limit`` (the file's end, or the end of its allocated blocks); returns
    ``(done, count, used)`` moved past what was written: items, entries, slots newly in use.

    The reference of ``put_entries`` in store_kernels.pyx: :meth:`IndexFile.put` runs one or
    the other, and takes the allocation where it stops.  ``slot``: the slot table, a native
    ``int`` view of the mapping.
    """
    pack_entry = ENTRY.pack_into
    for hashes, phys in items[done:]:
        if count + len(hashes) > limit:
            break
        for h in hashes:
            s = h % slots
            head = slot[s]  # always a counted entry (see _drop_uncounted), 0 for none
            if not head:
                used += 1
            pack_entry(mm, base + count * ENTRY_SIZE, h, phys, diff, head)
            slot[s] = count
            count += 1
        done += 1
    return done, count, used


class IndexFile:
    __slots__ = (
        "base", "begin_phys", "begin_ts", "count", "end_phys", "end_ts", "file", "max_entries",
        "slot", "slots", "slots_used",
    )

    def __init__(
        self, path: Path, slots: int, max_entries: int, *, create: bool,
        file: MappedFile | None = None,
    ):
        """``file``: the mapped file at ``path`` if it is already open (pre-built)."""
        self.slots = slots
        self.max_entries = max_entries
        self.base = HEADER_SIZE + slots * SLOT_SIZE  # where entry 0 sits
        size = index_file_size(slots, max_entries)
        if file is None:
            file = MappedFile(path, 0, size, create=create, allocate=self.base if create else 0)
        self.file = file
        self.file.advise_random()
        self.slot = memoryview(self.file.mm)[HEADER_SIZE : self.base].cast("i")
        self.begin_ts = self.end_ts = self.begin_phys = self.end_phys = 0
        self.slots_used, self.count = 0, 1
        if create:
            self.file.reserve(self.base)
            prefault(self.file.mm, self.base)  # slots are written at random
            self._write_header()
        elif self.file.allocated < HEADER_SIZE:
            pass  # never set up (no space for it): empty; its first put allocates and writes
        else:
            (self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.slots_used,
             self.count) = HEADER.unpack_from(self.file.mm, 0)
            self.count = max(1, min(self.count, max_entries))
            self._drop_uncounted()
        self.file.wrote = size

    @property
    def path(self) -> Path:
        return self.file.path

    def _write_header(self) -> None:
        HEADER.pack_into(
            self.file.mm, 0, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys,
            self.slots_used, self.count,
        )

    def _head(self, slot_value: int) -> int:
        """A slot's chain head if it names a counted entry.  A slot may name an entry past
        ``count`` (written after the header last reached disk); follow its chain down."""
        mm = self.file.mm
        base = self.base
        while slot_value >= self.count:
            slot_value = ENTRY.unpack_from(mm, base + slot_value * ENTRY_SIZE)[3]
        return max(slot_value, 0)

    def _drop_uncounted(self) -> None:
        """Forget entries a killed process wrote past ``count``.  Their slots name them: the
        next puts would overwrite those entries and hang each such bucket's older chain off an
        unrelated one, so the slots go back to their counted heads and the entries to zero."""
        mm, slot = self.file.mm, self.slot
        end = self.count
        readable = (self.file.allocated - self.base) // ENTRY_SIZE  # never read a hole
        while end < min(self.max_entries, readable):
            entry = ENTRY.unpack_from(mm, self.base + end * ENTRY_SIZE)
            if not any(entry):
                break
            s = entry[0] % self.slots
            if slot[s] >= self.count:
                slot[s] = self._head(slot[s])
            end += 1
        self._zero_entries(self.count, end)

    def _zero_entries(self, start: int, end: int) -> None:
        at = self.base + start * ENTRY_SIZE
        self.file.mm[at : at + (end - start) * ENTRY_SIZE] = bytes((end - start) * ENTRY_SIZE)

    def put(self, items: list[tuple[tuple[int, ...], int]], store_ts: int,
            put_entries: PutEntries = put_entries) -> int:
        """Index ``(key hashes, log offset)`` items stored at ``store_ts``; returns how many
        items were indexed completely (the caller moves the rest to a new file).

        This runs on the append path for two keys a message (UNIQ_KEY and KEYS), once per
        appended batch.  Each entry is written before the slot that names it and the header
        counts them last: a process killed anywhere leaves every chain reachable.  An item's
        entries are allocated before any is written (a chunk ahead); when the disk has no room
        this raises ``OSError`` (ENOSPC), the items before it indexed and counted.

        ``put_entries``: the loop that writes entries while they need no allocation
        (:func:`put_entries` or its compiled twin); the allocation between is taken here.
        """
        file, base, max_entries = self.file, self.base, self.max_entries
        count = self.count
        if count == 1:
            self.begin_ts, self.begin_phys = store_ts, items[0][1]
        diff = (store_ts - self.begin_ts) // 1000
        if not 0 <= diff <= MAX_TIME_DIFF:
            diff = 0 if diff < 0 else MAX_TIME_DIFF
        done = used = 0
        try:
            while done < len(items):
                allocated = (file.allocated - base) // ENTRY_SIZE  # entries whose blocks exist
                done, count, used = put_entries(file.mm, self.slot, self.slots, base, items,
                                                done, count, used, min(max_entries, allocated),
                                                diff)
                if done == len(items):
                    break
                end = count + len(items[done][0])
                if end > max_entries:  # the file is full: the rest go to the next one
                    break
                file.reserve(base + end * ENTRY_SIZE)
        finally:
            if done:
                self.count = count
                self.slots_used += used
                self.end_ts = store_ts
                self.end_phys = items[done - 1][1]
                self._write_header()
        return done

    def lookup(self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Log offsets under ``topic#key`` whose coarse (whole-second) store time may lie in
        the range, newest first; the caller checks the records themselves."""
        if self.count <= 1 or self.end_ts < begin_ms - 1000 or self.begin_ts > end_ms + 1000:
            return []
        mm = self.file.mm
        base = self.base
        h = index_key_hash(topic, key)
        i = self._head(self.slot[h % self.slots])
        out: list[int] = []
        seen = 0
        while 0 < i < self.count and len(out) < limit and seen < self.max_entries:
            eh, phys, diff, prev = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)
            t = self.begin_ts + diff * 1000
            if eh == h and begin_ms - 1000 <= t <= end_ms:
                out.append(phys)
            if prev >= i:  # chains only point backwards; anything else is damage
                break
            i = prev
            seen += 1
        return out

    def truncate(self, log_end: int) -> None:
        """Forget the entries for log offsets at or past ``log_end`` (entries are written in
        log order, so they are a suffix) and unhook them from their slots."""
        mm = self.file.mm
        base = self.base
        old = count = self.count
        while count > 1 and ENTRY.unpack_from(mm, base + (count - 1) * ENTRY_SIZE)[1] >= log_end:
            count -= 1
        if count == old:
            return
        self.count = count  # _head now follows chains below the new count
        for i in range(count, old):
            s = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)[0] % self.slots
            if self.slot[s] >= count:
                head = self.slot[s] = self._head(self.slot[s])
                if head == 0:
                    self.slots_used -= 1
        self._zero_entries(count, old)
        if count > 1:
            _, self.end_phys, diff, _ = ENTRY.unpack_from(mm, base + (count - 1) * ENTRY_SIZE)
            self.end_ts = self.begin_ts + diff * 1000  # whole seconds: never later than it was
        else:
            self.begin_ts = self.end_ts = self.begin_phys = self.end_phys = 0
        self._write_header()

    def flush(self) -> None:
        # Slots are written anywhere in the file, so there is no "written up to" to track:
        # flush it all (msync writes only the dirty pages).
        self.file.flushed = 0
        self.file.flush()

    def close(self) -> None:
        self.slot.release()  # the mapping cannot close while a view of it is exported
        self.file.close()

    def destroy(self) -> None:
        self.slot.release()
        self.file.destroy()


SPARE_AT = 0.75
"""Share of the current file's entries in use when the next file is pre-built."""


class IndexService:
    """The index directory: files filled in creation order, searched newest first.

    With an :class:`Allocator`, the next file is built in the background before it is needed:
    creating one and faulting its slot table in (20 MB at RocketMQ's 5 million slots) takes
    about 0.1 s, which would otherwise stall every writer at the first append and at each
    roll-over.
    """

    def __init__(
        self, directory: Path, slots: int, max_entries: int, allocator: Allocator | None = None,
        put_entries: PutEntries = put_entries,
    ):
        """``put_entries``: the entry-writing loop :meth:`IndexFile.put` runs (the pure one
        or its compiled twin)."""
        self.directory = directory
        self._put_entries = put_entries
        self.slots = slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self._allocator = allocator
        self._spare: Path | None = None  # the pre-built (or being built) next file
        self._spare_at = max(1, int(max_entries * SPARE_AT))

    def load(self) -> None:
        if self.directory.is_dir():
            for p in sorted(self.directory.iterdir()):
                if p.name.isdigit():
                    self.files.append(IndexFile(p, self.slots, self.max_entries, create=False))

    @property
    def end_phys(self) -> int:
        """Log offset of the newest indexed record; re-dispatch skips what lies below."""
        return self.files[-1].end_phys if self.files and self.files[-1].count > 1 else -1

    def put(self, items: list[tuple[tuple[int, ...], int]], store_ts: int) -> None:
        """Index a batch of ``(key hashes, log offset)``, all stored at ``store_ts``; the
        hashes are :func:`evq.domain.hashing.index_key_hash` values, computed by the caller
        (outside the put lock on the append path)."""
        if not items:
            return
        f = self.files[-1] if self.files else self._new_file(store_ts)
        while True:
            done = f.put(items, store_ts, self._put_entries)
            if done == len(items):
                if f.count >= self._spare_at:
                    self.prepare(store_ts)
                return
            if done:
                items = items[done:]
            elif f.count == 1:  # more keys than a whole (fresh) file holds: split them
                hashes, phys = items[0]
                room = f.max_entries - f.count
                items = [(hashes[:room], phys), (hashes[room:], phys), *items[1:]]
            else:
                f = self._new_file(store_ts)

    def prepare(self, now_ms: int) -> None:
        """Have the next file built if none is yet and the current one is (nearly) full."""
        if self._allocator is None or self._spare is not None:
            return
        if self.files and self.files[-1].count < self._spare_at:
            return
        self._spare = self._free_path(now_ms)
        head = HEADER_SIZE + self.slots * SLOT_SIZE
        self._allocator.build(self._spare, 0, index_file_size(self.slots, self.max_entries),
                              warm=head, allocate=head)

    def _free_path(self, ms: int) -> Path:
        """A file name after every existing one (names are creation times)."""
        durable_fs.make_dirs(self.directory)
        while (self.directory / index_file_name(ms)).exists():
            ms += 1
        return self.directory / index_file_name(ms)

    def _new_file(self, now_ms: int) -> IndexFile:
        path, self._spare = self._spare or self._free_path(now_ms), None
        mf = None
        if self._allocator is not None:
            size = index_file_size(self.slots, self.max_entries)
            mf = self._allocator.take(path, 0, size, successor=False,
                                      allocate=HEADER_SIZE + self.slots * SLOT_SIZE)
        f = IndexFile(path, self.slots, self.max_entries, create=True, file=mf)
        self.files.append(f)
        return f

    def lookup(self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        out: list[int] = []
        for f in reversed(self.files):
            out += f.lookup(topic, key, begin_ms, end_ms, limit - len(out))
            if len(out) >= limit:
                break
        return out

    @property
    def last_update(self) -> tuple[int, int]:
        """(timestamp, log offset) of the newest indexed record, as QUERY_MESSAGE reports."""
        if not self.files:
            return 0, 0
        f = self.files[-1]
        return f.end_ts, f.end_phys

    def truncate(self, log_end: int) -> None:
        """Drop the files that start at or beyond the log end, and the entries of the last
        kept file that point there: records later written at those offsets must be indexed
        again (re-dispatch skips offsets up to ``end_phys``), and only once."""
        while self.files and (self.files[-1].begin_phys >= log_end or self.files[-1].count <= 1):
            self.files.pop().destroy()
        if self.files:
            self.files[-1].truncate(log_end)

    def delete_expired(self, log_min: int) -> int:
        count = 0
        while len(self.files) > 1 and self.files[0].end_phys < log_min:
            self.files.pop(0).destroy()
            count += 1
        return count

    def flush(self) -> None:
        for f in self.files[-2:]:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
