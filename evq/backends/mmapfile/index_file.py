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
Java string hash; see there why).

Entries are written through the mapping as they are put.  The head (header and slots) of the
file being written lives in memory, and reaches the file only at a flush, after the entries it
names are on disk (:meth:`IndexFile.flush`): the kernel writes a mapping's dirty pages back in
any order, and a slot that reached the disk before the entry it names would, after a power cut,
name zeros and hide its bucket's older entries.  So on disk, whatever a power cut or a SIGKILL
left, every slot names an entry that is there and the header counts only entries that are;
entries past ``indexCount`` are leftovers of a put after the last flush, which opening the file
zeroes (after pointing back any slot that names one) and recovery indexes again from the
header's endPhyOffset.  Writing the slots in memory also spares the appending thread a write
fault on each slot page the last flush cleaned.

Writing the head back is the dear part (under unique keys a second of sends changes nearly
every page of a 20 MB slot table), so the store does it only every few seconds; the entries,
20 bytes a key and written in order, reach the disk at every projection round
(:meth:`IndexFile.sync_entries`), and the store's checkpoint then records how many of the last
file's entries are on disk.  Opening the file with that count (``relink_to``) links those
entries into the slots again, in entry order (``slot[hash % N] = i``: each entry's ``prev``
already names the bucket's head as it was when it was put), so a crash re-indexes from the
log only what came after the last round, not after the last write-back of the head.

A file's header and slots are allocated when it is created, its entries a chunk ahead of the
writer (:meth:`~evq.backends.mmapfile.mapped_file.MappedFile.reserve`).

Slots are little-endian where RocketMQ's are big-endian: every put reads and writes two of
them at random places, and a native ``int`` view of the slot area does that in half the time
``struct`` calls take (the index is evq's own: its hash already differs from RocketMQ's).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from evq import durable_fs, logs
from evq.backends.mmapfile.mapped_file import Allocator, MappedFile, finished_files
from evq.domain.hashing import index_key_hash

log = logs.get_logger(__name__)

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


def index_file_ms(name: str) -> int:
    """The creation time :func:`index_file_name` wrote into ``name``."""
    return int(time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))) * 1000 + int(name[14:])


HEAD_CHUNK = 4096
"""The unit in which a flush writes the head back: a change to a slot marks the chunk of the
file holding it (:func:`head_chunk`); chunks are page-aligned where pages are 4 KiB."""

PutEntries = Callable[
    [mmap.mmap, memoryview, bytearray, int, int, list[tuple[tuple[int, ...], int]], int, int,
     int, int, int],
    tuple[int, int, int]]
"""The signature of :func:`put_entries` and of its compiled twin."""


COPY_CHUNKS = 16
"""The most head chunks (64 KiB) the pure flush copies in one step while holding the GIL.
A run of dirty chunks can be the whole 20 MB slot table (a second of sends with unique keys
touches nearly every chunk), and copied in one step it stopped every other thread for 25 ms a
flush on this VM, the broker's event loop included: that was most of batch produce's 99th
percentile (issue 18).  The compiled copy (:data:`CopyRuns`) holds no GIL and takes runs of
any length."""

CopyRuns = Callable[[mmap.mmap, list[tuple[int, int]]], list[tuple[int, bytes]]]
"""The signature of :func:`copy_runs` and of its compiled twin: copies of ``image`` over each
byte range ``[start, end)``, as ``(start, bytes)``."""

WriteRuns = Callable[[int, list[tuple[int, "bytes | mmap.mmap"]], int], None]
"""The signature of :func:`write_runs` and of its compiled twin: each ``(at, data)`` written
at file offset ``at`` of descriptor ``fd``, less what lies below offset ``skip_below``."""


def head_chunk(slot: int) -> int:
    """The head chunk holding slot number ``slot``."""
    return (HEADER_SIZE + SLOT_SIZE * slot) // HEAD_CHUNK


def take_runs(dirty: bytearray, most: int) -> list[tuple[int, int]]:
    """The byte ranges of the head's dirty chunks (``dirty[c]`` set: chunk ``c``), each of at
    most ``most`` contiguous chunks, with every flag cleared: a put after this marks its chunk
    again, for the next flush, whether or not the copy that follows sees its slot.

    Called holding the GIL (the scan and the clearing are C steps of ``bytearray``), so no put
    is half done as the flags are taken; the copy that follows need not hold it."""
    runs: list[tuple[int, int]] = []
    chunk = dirty.find(1)
    while chunk >= 0:
        end = dirty.find(0, chunk, chunk + most)
        end = min(len(dirty), chunk + most) if end < 0 else end
        dirty[chunk:end] = bytes(end - chunk)
        runs.append((chunk * HEAD_CHUNK, end * HEAD_CHUNK))
        chunk = dirty.find(1, end)
    return runs


def copy_runs(image: mmap.mmap, runs: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    """Copies of ``image`` over each of ``runs``, the GIL given up between them: each copy is
    one step the GIL keeps whole, so the broker's loop waits at most one run's copy at a time.
    The reference of ``copy_runs`` in store_kernels.pyx, which copies them all without
    holding the GIL."""
    copies: list[tuple[int, bytes]] = []
    for start, end in runs:
        copies.append((start, image[start:end]))
        time.sleep(0)  # the GIL, given up between copies: appends go on meanwhile
    return copies


def write_runs(fd: int, runs: list[tuple[int, bytes | mmap.mmap]], skip_below: int) -> None:
    """Write each ``(at, data)`` of ``runs`` at offset ``at`` of ``fd``, less its bytes below
    ``skip_below`` (the header, written last on its own).  ``pwrite`` gives the GIL up for
    each write and takes it back after: the reference of ``write_runs`` in store_kernels.pyx,
    which writes them all in one stretch without it (a thousand runs were a thousand GIL
    hand-overs, and the broker's loop waited through one a request)."""
    for at, data in runs:
        with memoryview(data) as view:
            done = max(0, skip_below - at)
            while done < len(view):
                done += os.pwrite(fd, view[done:], at + done)


def put_entries(
    mm: mmap.mmap, slot: memoryview, dirty: bytearray, slots: int, base: int,
    items: list[tuple[tuple[int, ...], int]], done: int, count: int, used: int, limit: int,
    diff: int,
) -> tuple[int, int, int]:
    """Write the entries of ``items[done:]`` from entry ``count`` on while an item's entries
    all fit below entry ``limit`` (the file's end, or the end of its allocated blocks); returns
    ``(done, count, used)`` moved past what was written: items, entries, slots newly in use.

    The reference of ``put_entries`` in store_kernels.pyx: :meth:`IndexFile.put` runs one or
    the other, and takes the allocation where it stops.  ``slot``: the slot table, a native
    ``int`` view of the in-memory head; ``dirty``: a flag a head chunk, set for each chunk a
    slot changed in, after the slot (a flush clears a flag before it copies the chunk).
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
            dirty[head_chunk(s)] = 1
            count += 1
        done += 1
    return done, count, used


def counted_head(mm: mmap.mmap, base: int, slot_value: int, count: int) -> int:
    """A slot's chain head if it names a counted entry (0: none).  A slot may name an entry
    past ``count`` (a power cut kept a newer slot page than the header): its chain is followed
    down.  A chain that does not go down there is damage, not a chain: no head (it would
    otherwise be followed forever)."""
    while slot_value >= count:
        prev = ENTRY.unpack_from(mm, base + slot_value * ENTRY_SIZE)[3]
        if prev >= slot_value:
            return 0
        slot_value = prev
    return max(slot_value, 0)


def chain_offsets(
    mm: mmap.mmap, base: int, count: int, max_entries: int, slot_value: int, h: int,
    begin_ts: int, begin_ms: int, end_ms: int, limit: int,
) -> list[int]:
    """The log offsets of the entries of hash ``h`` in the chain of a slot holding
    ``slot_value`` whose coarse store time (``begin_ts`` plus the entry's whole seconds) may
    lie in ``[begin_ms, end_ms]``, newest first, at most ``limit``.

    The reference of ``chain_offsets`` in store_kernels.pyx.  A full file's chains hold four
    entries a slot on average (RocketMQ's 20 million entries over 5 million slots), each a
    random read of a 400 MB file: walked in Python they were what made a key lookup dearer
    as the store grew (issue 18)."""
    i = counted_head(mm, base, slot_value, count)
    out: list[int] = []
    seen = 0
    while 0 < i < count and len(out) < limit and seen < max_entries:
        eh, phys, diff, prev = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)
        t = begin_ts + diff * 1000
        if eh == h and begin_ms - 1000 <= t <= end_ms:
            out.append(phys)
        if prev >= i:  # chains only point backwards; anything else is damage
            break
        i = prev
        seen += 1
    return out


ChainOffsets = Callable[[mmap.mmap, int, int, int, int, int, int, int, int, int], list[int]]
"""The signature of :func:`chain_offsets` and of its compiled twin."""


class IndexFile:
    """One index file.  While it is written its head lives in memory (``_image``): puts
    change it under the store's put lock, and :meth:`flush` (the projection flusher's thread)
    writes it back.  Locks: ``put_lock`` (the store's) is never taken while ``_write_lock`` is
    held, and ``_flush_lock`` (one flush at a time) never while either is."""

    __slots__ = (
        "_closed", "_cuts", "_dirty", "_durable_count", "_flush_lock", "_image", "_mapped",
        "_synced", "_write_lock",
        "base", "begin_phys", "begin_ts", "count", "end_phys", "end_ts", "file", "max_entries",
        "slot", "slots", "slots_used",
    )

    def __init__(
        self, path: Path, slots: int, max_entries: int, *, create: bool,
        file: MappedFile | None = None, relink_to: int = 0,
    ):
        """``file``: the mapped file at ``path`` if it is already open (pre-built).
        ``relink_to``: how many entries the store's checkpoint says are on disk (see
        :meth:`_relink`), 0 when it names none of this file's."""
        self.slots = slots
        self.max_entries = max_entries
        self.base = HEADER_SIZE + slots * SLOT_SIZE  # where entry 0 sits
        size = index_file_size(slots, max_entries)
        if file is None:
            file = MappedFile(path, 0, size, create=create, allocate=self.base if create else 0)
        self.file = file
        self.file.advise_random()
        self._mapped = memoryview(self.file.mm)[HEADER_SIZE : self.base].cast("i")
        self.slot = self._mapped  # the slots lookups read: the image's while there is one
        self._image: mmap.mmap | None = None
        self._dirty = bytearray()
        self._cuts = 0  # truncations so far: a flush across one writes nothing
        self._write_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._closed = False  # under _write_lock: no write through a descriptor closed since
        self.begin_ts = self.end_ts = self.begin_phys = self.end_phys = 0
        self.slots_used, self.count = 0, 1
        self._synced = 1  # entries below it are on disk
        self._durable_count = 1  # the count of the head on disk
        if create:
            self.file.reserve(self.base)
            self.take_head(copy=False)
        elif self.file.allocated < HEADER_SIZE:
            pass  # never set up (no space for it): empty; its first put allocates and writes
        else:
            (self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.slots_used,
             self.count) = HEADER.unpack_from(self.file.mm, 0)
            self.count = max(1, min(self.count, max_entries))
            self._synced = self._durable_count = self.count
            if relink_to > self.count > 1:  # a header written once: begin_ts is known
                self._relink(min(relink_to, max_entries))  # writes the head: both move on
            self._drop_uncounted()
        self.file.wrote = size

    @property
    def path(self) -> Path:
        return self.file.path

    def take_head(self, *, copy: bool = True) -> None:
        """Move the head into memory before this file is written to: anonymous memory, so
        that a new file's (20 MB at RocketMQ's 5 million slots; ``copy=False``) costs no
        zeroing up front, only a fault a page as puts first touch it, unless
        :meth:`warm_head` has the pages faulted in first."""
        if self._image is not None:
            return
        image = mmap.mmap(-1, self.base)
        if copy:
            with memoryview(self.file.mm) as mm:
                image[:] = mm[: self.base]
        self._dirty = bytearray(-(-self.base // HEAD_CHUNK))
        self.slot = memoryview(image)[HEADER_SIZE:].cast("i")
        self._image = image

    def warm_head(self, fault_in: Callable[[mmap.mmap, int, int], None]) -> None:
        """Hand a new head's memory to ``fault_in`` (:meth:`Allocator.fault_in`), which zeroes
        its pages off the put path: puts hash keys to slots all over it, and each page's first
        touch was a fault on the loop's thread (one every two sends over the first 10,000 to
        a new file at 5 million slots: two keys a message, 4,883 slot pages)."""
        if self._image is not None:
            fault_in(self._image, 0, self.base)

    def _header(self) -> bytes:
        return HEADER.pack(self.begin_ts, self.end_ts, self.begin_phys, self.end_phys,
                           self.slots_used, self.count)

    def _head(self, slot_value: int) -> int:
        return counted_head(self.file.mm, self.base, slot_value, self.count)

    def _readable_entries(self) -> int:
        """Entries up to the first hole past the head: reading a hole could allocate (see
        :mod:`~evq.backends.mmapfile.mapped_file`).  Not ``allocated``, the first hole from
        the file's start: on ext4 that is usually in the slots, whose blocks are reserved
        but written only where a write-back changed them."""
        return (self.file.data_end(self.base) - self.base) // ENTRY_SIZE

    def _relink(self, end: int) -> None:
        """Count entries up to ``end`` (the checkpoint's: synced before it was written) and
        link each into its slot, in memory; the head then goes to the file, before
        :meth:`_drop_uncounted` zeroes what lies past them.

        Stops early at anything a put could not have written (zeros, a log offset going
        back, a chain pointing forward), and then also leaves out the entries of the last
        record taken, which may be only some of its keys: the store re-indexes from the log
        every record past the last entry counted (``end_phys``), each with all its keys."""
        start = self.count
        end = min(end, self._readable_entries())
        if end <= start:
            return
        mm, base = self.file.mm, self.base
        stop, floor = start, self.end_phys
        with memoryview(mm) as view, view[base + start * ENTRY_SIZE : base + end * ENTRY_SIZE
                                          ] as entries:
            for entry in ENTRY.iter_unpack(entries):
                _, phys, _, prev = entry
                if not any(entry) or phys < floor or not 0 <= prev < stop:
                    break
                stop, floor = stop + 1, phys
        if stop < end:
            while stop > start and ENTRY.unpack_from(mm, base + (stop - 1) * ENTRY_SIZE)[1] \
                    == floor:
                stop -= 1
        if stop == start:
            return
        log.info("index_relinking", path=str(self.path), entries=stop - start)
        self.take_head()
        slot, slots, dirty = self.slot, self.slots, self._dirty
        with memoryview(mm) as view, view[base + start * ENTRY_SIZE : base + stop * ENTRY_SIZE
                                          ] as entries:
            for i, (h, _, _, prev) in enumerate(ENTRY.iter_unpack(entries), start):
                s = h % slots
                slot[s] = i
                dirty[head_chunk(s)] = 1
                self.slots_used += prev == 0  # as put_entries counts a slot newly in use
        _, self.end_phys, diff, _ = ENTRY.unpack_from(mm, base + (stop - 1) * ENTRY_SIZE)
        self.end_ts = self.begin_ts + diff * 1000  # whole seconds: never later than it was
        log.info("index_relinked", path=str(self.path), entries=stop - start,
                 of=end - start, end_phys=self.end_phys)
        self.count = self._synced = stop
        self.write_head()

    def _drop_uncounted(self) -> None:
        """Forget entries past ``count`` (put after the last flush).  A slot may name one (a
        power cut kept a slot page newer than the header): the next puts would overwrite
        those entries and hang each such bucket's older chain off an unrelated one, so the
        slots go back to their counted heads, on disk before the entries become zeros."""
        mm, slot = self.file.mm, self.slot
        end = self.count
        readable = self._readable_entries()
        moved = False
        while end < min(self.max_entries, readable):
            entry = ENTRY.unpack_from(mm, self.base + end * ENTRY_SIZE)
            if not any(entry):
                break
            s = entry[0] % self.slots
            if slot[s] >= self.count:
                slot[s] = self._head(slot[s])
                moved = True
            end += 1
        if moved:
            if self._image is not None:  # relinked: the head is in memory
                self.write_head()
            else:
                self.file.sync_range(0, self.base)
        self._zero_entries(self.count, end)

    def _zero_entries(self, start: int, end: int) -> None:
        at = self.base + start * ENTRY_SIZE
        self.file.mm[at : at + (end - start) * ENTRY_SIZE] = bytes((end - start) * ENTRY_SIZE)

    def put(self, items: list[tuple[tuple[int, ...], int]], store_ts: int,
            put_entries: PutEntries = put_entries) -> int:
        """Index ``(key hashes, log offset)`` items stored at ``store_ts``; returns how many
        items were indexed completely (the caller moves the rest to a new file).

        This runs on the append path, under the store's put lock, for two keys a message
        (UNIQ_KEY and KEYS), once per appended batch.  An item's entries are allocated before
        any is written (a chunk ahead); when the disk has no room this raises ``OSError``
        (ENOSPC), the items before it indexed and counted.

        ``put_entries``: the loop that writes entries while they need no allocation
        (:func:`put_entries` or its compiled twin); the allocation between is taken here.
        """
        if self._image is None:
            self.take_head()
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
                done, count, used = put_entries(file.mm, self.slot, self._dirty, self.slots,
                                                base, items, done, count, used,
                                                min(max_entries, allocated), diff)
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
        return done

    def lookup(self, h: int, begin_ms: int, end_ms: int, limit: int,
               chain_offsets: ChainOffsets = chain_offsets) -> list[int]:
        """Log offsets under the key of hash ``h`` (:func:`index_key_hash` of ``topic#key``)
        whose coarse (whole-second) store time may lie in the range, newest first; the caller
        checks the records themselves.  ``chain_offsets``: :func:`chain_offsets` or its
        compiled twin."""
        if self.count <= 1 or self.end_ts < begin_ms - 1000 or self.begin_ts > end_ms + 1000:
            return []
        return chain_offsets(self.file.mm, self.base, self.count, self.max_entries,
                             self.slot[h % self.slots], h, self.begin_ts, begin_ms, end_ms, limit)

    def truncate(self, log_end: int) -> None:
        """Forget the entries for log offsets at or past ``log_end`` (entries are written in
        log order, so they are a suffix) and unhook them from their slots.  Runs under the
        store's put lock; the head is on disk before the entries become zeros."""
        mm = self.file.mm
        base = self.base
        old = count = self.count
        while count > 1 and ENTRY.unpack_from(mm, base + (count - 1) * ENTRY_SIZE)[1] >= log_end:
            count -= 1
        if count == old:
            return
        self.take_head()
        self._cuts += 1  # a flush under way now writes nothing: write_head writes it whole
        self.count = count  # _head now follows chains below the new count
        with self._write_lock:  # after the count: a sync_entries under way sees the cut
            self._synced = min(self._synced, count)
        for i in range(count, old):
            s = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)[0] % self.slots
            if self.slot[s] >= count:
                head = self.slot[s] = self._head(self.slot[s])
                if head == 0:
                    self.slots_used -= 1
        if count > 1:
            _, self.end_phys, diff, _ = ENTRY.unpack_from(mm, base + (count - 1) * ENTRY_SIZE)
            self.end_ts = self.begin_ts + diff * 1000  # whole seconds: never later than it was
        else:
            self.begin_ts = self.end_ts = self.begin_phys = self.end_phys = 0
        self.write_head()
        self._zero_entries(count, old)

    def write_head(self) -> None:
        """Write the whole head to the file now, after the entries it names (under the
        store's put lock; a flush under way writes none of it)."""
        if self._image is None:
            return  # the file holds it already
        self._cuts += 1
        self._dirty[:] = bytes(len(self._dirty))
        with self._write_lock:
            self._write_head([(0, self._image)], self._header(), self.count)

    def flush(self, put_lock: AbstractContextManager[object], copy: CopyRuns = copy_runs,
              write: WriteRuns = write_runs) -> None:
        """Put the entries written since the last flush on disk, then the head (as it was
        once they were written), so that no slot on disk ever names an entry that is not.

        Runs on the projection flusher's thread (or a caller of the store's ``flush``), while
        puts go on: the changed chunks' flags are taken (:func:`take_runs`) and the chunks
        copied (``copy``: :func:`copy_runs` or its compiled twin), then the header is taken
        under ``put_lock``, so its count covers every entry those copies name (a put writes
        an entry before its slot, and the slot before it lets the lock go); only that much is
        synced before the head is written back (``write``: :func:`write_runs` or its twin).
        A truncation meanwhile writes the head itself, and this round writes none of it.
        """
        with self._flush_lock:
            cuts, image, dirty = self._cuts, self._image, self._dirty
            if image is None:
                return  # not written in this process since it was opened (or since it filled)
            runs = copy(image, take_runs(dirty, COPY_CHUNKS))
            with put_lock:
                if self._cuts != cuts or (not runs and self.count == self._durable_count):
                    return
                header, count = self._header(), self.count
            with self._write_lock:
                if self._cuts != cuts or self._closed:
                    return
                self._write_head(runs, header, count, write)

    def sync_entries(self, put_lock: AbstractContextManager[object]) -> int | None:
        """Put the entries written since the last sync on disk, without the head (a
        projection round between write-backs: see the module docstring); returns how many
        entries the file then has on disk, or None when the head must be written back
        instead: it never was (the file's begin time is not on disk yet), or a truncation
        or a write-back came between.  Runs where :meth:`flush` runs."""
        with self._flush_lock:
            with put_lock:
                if self._durable_count <= 1:
                    return None
                count, cuts = self.count, self._cuts
            with self._write_lock:
                if self._closed or self._cuts != cuts:
                    return None
                if count > self._synced:
                    self.file.sync_range(self.base + self._synced * ENTRY_SIZE,
                                         self.base + count * ENTRY_SIZE)
                    self._synced = count
            return count

    def _write_head(self, runs: list[tuple[int, bytes | mmap.mmap]], header: bytes, count: int,
                    write: WriteRuns = write_runs) -> None:
        """Put entries up to ``count`` on disk, then the head's changed chunks ``runs`` (the
        header bytes in them left out), then ``header``, each before the next: a header on
        disk vouches for every slot page, so a power cut that kept a new header and an old
        slot page cannot hide the entries that slot's newer value names."""
        at = self.base + min(self._synced, count) * ENTRY_SIZE
        self.file.sync_range(at, self.base + count * ENTRY_SIZE)
        self._synced = count
        write(self.file.fd, runs, HEADER_SIZE)
        os.fdatasync(self.file.fd)  # written through the descriptor: synced through it
        self.file.write_at(header, 0)
        os.fdatasync(self.file.fd)
        self._durable_count = count

    @property
    def in_memory(self) -> bool:
        """Whether the head is kept in memory (the file was written to since it opened)."""
        return self._image is not None

    def settled(self) -> bool:
        """Whether the head on disk is the one in memory and nothing is left to flush (under
        the store's put lock: no put or truncation under way)."""
        return self._durable_count == self.count and self._dirty.find(1) < 0

    def release_image(self) -> None:
        """Read the head from the file again (a full file, once :meth:`settled`)."""
        self.slot = self._mapped
        self._image = None
        self._dirty = bytearray()

    def close(self) -> None:
        with self._write_lock:
            self._closed = True
            self._mapped.release()  # the mapping cannot close while a view of it is exported
            self.file.close()

    def destroy(self) -> None:
        with self._write_lock:
            self._closed = True
            self._mapped.release()
            self.file.destroy()


SPARE_AT = 0.75
"""Share of the current file's entries in use when the next file is pre-built."""


class IndexService:
    """The index directory: files filled in creation order, searched newest first.

    With an :class:`Allocator`, the next file is created and its head's blocks allocated in
    the background before it is needed (20 MB at RocketMQ's 5 million slots), which would
    otherwise stall every writer at the first append and at each roll-over.
    """

    def __init__(
        self, directory: Path, slots: int, max_entries: int, allocator: Allocator | None = None,
        put_entries: PutEntries = put_entries,
        put_lock: AbstractContextManager[object] | None = None,
        chain_offsets: ChainOffsets = chain_offsets,
        copy_runs: CopyRuns = copy_runs, write_runs: WriteRuns = write_runs,
    ):
        """``put_entries``: the entry-writing loop :meth:`IndexFile.put` runs (the pure one
        or its compiled twin); ``chain_offsets``: the chain walk :meth:`IndexFile.lookup`
        runs; ``copy_runs`` and ``write_runs``: how :meth:`IndexFile.flush` copies the head's
        changed chunks and writes them back.  ``put_lock``: the lock every put, truncation
        and expiry runs under (the store's); :meth:`flush` takes it for moments."""
        self.directory = directory
        self._put_lock = put_lock if put_lock is not None else threading.RLock()
        self._put_entries = put_entries
        self._chain_offsets = chain_offsets
        self._copy_runs, self._write_runs = copy_runs, write_runs
        self.slots = slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self._allocator = allocator
        self._spare: Path | None = None  # the pre-built (or being built) next file
        self._spare_at = max(1, int(max_entries * SPARE_AT))
        self._named_ms = 0  # the creation time in the newest file's name
        self.truncations = 0
        """How many times :meth:`truncate` ran (under the put lock): the store's checkpoint
        keeps no count :meth:`sync_entries` returned before one of them."""

    def load(self, synced: tuple[int, int] = (0, 0)) -> None:
        """Open the directory's files.  ``synced``: a file's name (as a number) and how many
        of its entries the store's checkpoint says are on disk (what :meth:`sync_entries`
        returned), which opening links in again.  Files at the end that count no entry were
        never flushed (their entries, if any, were put after the last flush and are
        uncounted): they go, and recovery indexes their records again, into files named after
        the rest."""
        if self.directory.is_dir():
            paths = [p for p in finished_files(self.directory)
                     if p.name.isdigit() and len(p.name) == len(index_file_name(0))]
            for p in paths:
                relink = synced[1] if int(p.name) == synced[0] else 0
                self.files.append(IndexFile(p, self.slots, self.max_entries, create=False,
                                            relink_to=relink))
        while self.files and self.files[-1].count <= 1:
            self.files.pop().destroy()
        if self.files:
            self._named_ms = index_file_ms(self.files[-1].path.name)
            self.files[-1].take_head()  # here, rather than at the first put after a restart

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
        self.put_rest(f, items, f.put(items, store_ts, self._put_entries), store_ts)

    def put_rest(self, f: IndexFile, items: list[tuple[tuple[int, ...], int]], done: int,
                 store_ts: int) -> None:
        """Go on with :meth:`put` once the last file ``f`` took ``items[:done]``: the rest go
        to new files, and the next file is built ahead when ``f`` is nearly full.  Also where
        the compiled put (``index_put`` in store_kernels.pyx) hands over when its one file
        put did not take every item or the file filled past :data:`SPARE_AT`."""
        while True:
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
            done = f.put(items, store_ts, self._put_entries)

    def prepare(self, now_ms: int) -> None:
        """Have the next file built if none is yet and the current one is (nearly) full."""
        if self._allocator is None or self._spare is not None:
            return
        if self.files and self.files[-1].count < self._spare_at:
            return
        self._spare = self._free_path(now_ms)
        head = HEADER_SIZE + self.slots * SLOT_SIZE
        self._allocator.build(self._spare, 0, index_file_size(self.slots, self.max_entries),
                              warm=0, allocate=head)  # the head is written from memory

    def _free_path(self, ms: int) -> Path:
        """A file name after every existing one (names are creation times, and the order of
        the files; recovery indexes with the records' store times, which may be older)."""
        durable_fs.make_dirs(self.directory)
        ms = max(ms, self._named_ms + 1)
        while (self.directory / index_file_name(ms)).exists():
            ms += 1
        self._named_ms = ms
        return self.directory / index_file_name(ms)

    def _new_file(self, now_ms: int) -> IndexFile:
        path, self._spare = self._spare or self._free_path(now_ms), None
        mf = None
        if self._allocator is not None:
            size = index_file_size(self.slots, self.max_entries)
            mf = self._allocator.take(path, 0, size, successor=False,
                                      allocate=HEADER_SIZE + self.slots * SLOT_SIZE)
        f = IndexFile(path, self.slots, self.max_entries, create=True, file=mf)
        if self._allocator is not None:
            f.warm_head(self._allocator.fault_in)
        self.files.append(f)
        return f

    def lookup(self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        out: list[int] = []
        h = index_key_hash(topic, key)  # once: a store of 10^8 messages has ten files
        for f in reversed(self.files):
            out += f.lookup(h, begin_ms, end_ms, limit - len(out), self._chain_offsets)
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
        self.truncations += 1
        while self.files and (self.files[-1].begin_phys >= log_end or self.files[-1].count <= 1):
            self.files.pop().destroy()
        if self.files:
            # Heads reach the files in file order: the cut file's may not be on disk while
            # an earlier one filled since the last flush is not (opening would take the earlier
            # file for one never flushed, and recovery would not index its records again).
            for f in self.files[:-1]:
                if f.in_memory and not f.settled():
                    f.write_head()
            self.files[-1].truncate(log_end)

    def sync_entries(self) -> tuple[int, int] | None:
        """A projection round between write-backs of the heads: the last file's entries put
        on disk (:meth:`IndexFile.sync_entries`); returns its name (as a number) and how many
        entries it has on disk, for the store's checkpoint (``(0, 0)``: nothing to link in
        after a crash), or None when the heads must be written back now (:meth:`flush`): the
        last file's never was, or an earlier file filled since the last write-back."""
        with self._put_lock:
            if not self.files or not self.files[-1].in_memory:
                return 0, 0  # the heads on disk are as in memory
            if any(f.in_memory for f in self.files[:-1]):
                return None
            f = self.files[-1]
        count = f.sync_entries(self._put_lock)
        return None if count is None else (int(f.path.name), count)

    def delete_expired(self, log_min: int) -> int:
        count = 0
        while len(self.files) > 1 and self.files[0].end_phys < log_min:
            self.files.pop(0).destroy()
            count += 1
        return count

    def flush(self) -> None:
        """Flush every file whose head is in memory: the one being written, and those that
        filled since the last flush.  A full file whose head is on disk as it is in memory
        reads it from the file from then on."""
        with self._put_lock:
            files = [f for f in self.files if f.in_memory]
        for f in files:
            f.flush(self._put_lock, self._copy_runs, self._write_runs)
        with self._put_lock:
            for f in files:
                if f in self.files[:-1] and f.settled():
                    f.release_image()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
