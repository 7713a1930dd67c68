"""Fixed-size mapped segment files and the ordered queues of them.

A segment's name is its first byte's offset in the logical file, zero-padded to 20 digits
(``00000000001073741824``), so a directory listing is the segment table.  Writers copy into
the mapping and advance ``wrote``; flushers make ``[flushed, wrote)`` durable with msync.

A fresh page costs about 8 us on first write (allocation, zeroing, a write fault), and a page
the kernel has written back costs a write fault again.  The :class:`Allocator` creates the
next segment ahead of need and pre-faults pages writable :data:`WARM_AHEAD` chunks ahead of
the writer with ``madvise(MADV_POPULATE_WRITE)`` called through ctypes, which runs without
the GIL: the append path then writes into pages that are already there, as RocketMQ's
allocate-and-warm service arranges for its CommitLog.  Tens of megabytes ahead, because the
warming thread lags: it waits for the GIL to start and to finish each request (a switch
interval, 5 ms, each while the writer holds it), and on a busy machine for a core, while a
compiled append loop fills a 4 MiB chunk in a few milliseconds; whatever the warming has not
reached, the writer faults in itself, holding the GIL (on this VM zeroing a fresh page ran at
about 1 GB/s: a microsecond a 1 KiB message).  Not a whole segment: the kernel writes dirty
pages back within ``dirty_expire`` (30 s) or as soon as they pile up past the background
ratio, so most of a gigabyte warmed at once would be written to disk as zeros and be cold
again before the writer got there.

msync goes through ctypes too: CPython's ``mmap.flush`` holds the GIL for the whole system
call (hundreds of microseconds to milliseconds on a real disk), which would stop every
appending thread for the length of each group commit.

Nothing is written through a mapping where the file system has yet to allocate blocks: on a
full disk such a write is SIGBUS (see :mod:`evq.backends.disk`).  Every file is allocated a
chunk ahead of its writer (:meth:`MappedFile.reserve`), before anything is written there, so
that a full disk is an ``OSError`` before a write, never a fault during one; a CommitLog
segment's blocks are allocated further ahead by the :class:`Allocator`, with the pages it
warms, and its writer's reserve finds them there.  Nor is anything
read where blocks are missing: on tmpfs a read fault on a hole allocates a page too, and is
SIGBUS on a full one, so a file opened from disk counts as allocated (and readable) only up
to its first hole (``SEEK_HOLE``), and recovery reads no further.  Not a whole
segment at once: a 1 GiB segment (and the next one, built ahead) would take its gigabytes
from the disk the moment it is created, also for a store that holds a few messages.

A file the :class:`Allocator` makes (the next segment, the next index file) is built under a
temporary name beside its own (:func:`building_path`) and renamed into place once it has its
size and its first blocks: a directory listing never shows a file under its final name empty
or half-sized, and a process killed mid-build leaves only the temporary name, which the next
load removes (:func:`finished_files`).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from evq import durable_fs, logs
from evq.backends import disk
from evq.domain.log import LogError

if TYPE_CHECKING:
    from evq.backends.mmapfile.transient_pool import TransientStorePool

log = logs.get_logger(__name__)

NAME_DIGITS = 20
WARM_CHUNK = 4 * 1024 * 1024  # pre-faulted ahead of the writer: ~1 ms to fault, ~10 ms to fill
WARM_AHEAD = 8  # chunks kept warm past the writer's own (see the module docstring)
MADV_POPULATE_WRITE = 23  # Linux >= 5.14; absent from Python's mmap constants on 3.11
MS_SYNC = 4  # Linux; Python's mmap module does not export the msync flags
ALLOCATION_CHUNK = 1024 * 1024  # how far ahead of its writer a file is allocated (reserve)

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _libc.madvise.restype = ctypes.c_int
    _libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _libc.msync.restype = ctypes.c_int
    _libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.mlock.restype = ctypes.c_int
    _libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.munlock.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - non-Linux
    _libc = None


BUILDING_SUFFIX = ".building"


def segment_name(start: int) -> str:
    return f"{start:0{NAME_DIGITS}d}"


def building_path(path: Path) -> Path:
    """Where the allocator builds the file that becomes ``path``: beside it (a rename within
    one directory is atomic), under a name no segment or index file has (theirs are digits
    only), so that nothing listing the directory takes it for one."""
    return path.with_name(path.name + BUILDING_SUFFIX)


def finished_files(directory: Path) -> list[Path]:
    """The entries of ``directory``, sorted, once the files a build left unfinished (a
    process killed while its allocator built one, see :func:`building_path`) are removed:
    never handed to a writer, they hold nothing of the log."""
    out = []
    for p in sorted(directory.iterdir()):
        if p.name.endswith(BUILDING_SUFFIX):
            log.warning("unfinished_file_removed", path=str(p))
            p.unlink()
        else:
            out.append(p)
    return out


def _address(mm: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # release the buffer export so the mapping can be closed later


def prefault(mm: mmap.mmap, size: int, offset: int = 0) -> bool:
    """Fault the pages of ``mm[offset:offset + size]`` in writable, without holding the GIL;
    False if unsupported."""
    if _libc is None or size <= 0:
        return False
    start = offset - offset % mmap.PAGESIZE
    return _libc.madvise(_address(mm) + start, size + offset - start, MADV_POPULATE_WRITE) == 0


def msync(mm: mmap.mmap, start: int, length: int) -> None:
    """``mm.flush(start, length)`` without holding the GIL (``start`` page-aligned)."""
    if _libc is None:  # pragma: no cover - non-Linux
        mm.flush(start, length)
        return
    if mm.closed:
        raise ValueError("mmap closed or invalid")
    if _libc.msync(_address(mm) + start, length, MS_SYNC) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def mlock(mm: mmap.mmap) -> str:
    """Lock ``mm``'s pages in memory (faulting them all in); returns why it could not, or ""."""
    if _libc is None:  # pragma: no cover - non-Linux
        return "mlock is not available"
    if _libc.mlock(_address(mm), len(mm)) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def munlock(mm: mmap.mmap) -> None:
    if _libc is not None and not mm.closed:
        _libc.munlock(_address(mm), len(mm))


def _data_end(fd: int, size: int, start: int = 0) -> int:
    """Where the file's first hole at or past ``start`` begins (its size if it has none):
    the blocks from ``start`` to there are allocated.  A file system that cannot tell says
    the whole file is data."""
    try:
        return min(size, os.lseek(fd, start, os.SEEK_HOLE))
    except OSError:
        return size


class StoreLayoutError(LogError, ValueError):
    """Segment files that do not form the configured layout (wrong size, a gap)."""


_CHUNK = 1 << 20
_ZEROS = bytes(_CHUNK)


class MappedFile:
    """One segment: a file of ``size`` bytes mapped shared, read-write."""

    __slots__ = ("_closed", "_reserving", "allocated", "buffer", "committed", "end", "fd",
                 "flushed", "mm", "path", "size", "start", "writer", "wrote")

    def __init__(
        self, path: Path, start: int, size: int, *, create: bool, allocate: int = 0,
        pending: durable_fs.PendingSyncs | None = None,
    ):
        """A file created here (or resized) is durable, size and directory entry, before
        this returns, or once ``pending`` is synced: see :mod:`evq.durable_fs`.  msync makes
        the data durable; that alone would lose a new segment in a power cut.

        ``allocate``: bytes from the start whose blocks are allocated before the file is
        mapped (:meth:`reserve`); raises ``OSError`` (ENOSPC) when the disk has no room, and
        leaves an unallocated file behind (only a writer that reserves writes into it)."""
        self.path = path
        self.start = start
        self.size = size
        self.end = start + size  # an attribute, not a property: the append path reads it
        self.fd = durable_fs.open_sized(path, size, create=create, pending=pending)
        # Taken by reserve and close: the allocator reserves ahead of the writer from its own
        # thread, and must never allocate through an fd number closed and reused meanwhile.
        self._reserving = threading.Lock()
        self._closed = False
        try:
            # Bytes from the start known to have their blocks: written or reserved.
            self.allocated = _data_end(self.fd, size)
            self.reserve(allocate)
            self.mm = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.wrote = 0
        self.flushed = 0
        # With a transient store pool buffer (see transient_pool.py) appends go to ``writer``,
        # the buffer, and reach the file below ``committed`` only; without one ``writer`` is
        # the mapping and ``committed`` is not kept (everything written is in the file).
        self.buffer: mmap.mmap | None = None
        self.writer: mmap.mmap = self.mm
        self.committed = 0

    @property
    def read_end(self) -> int:
        """Where what readers may see ends: the bytes in the file (RocketMQ's
        ``getReadPosition``)."""
        return self.wrote if self.buffer is None else self.committed

    def attach(self, buffer: mmap.mmap) -> None:
        """Append into ``buffer`` from now on; what was written so far is in the file."""
        self.committed = self.wrote
        self.buffer = self.writer = buffer

    def detach(self, *, force: bool = False) -> mmap.mmap | None:
        """Give up the buffer if everything written into it is committed (or, with
        ``force``, whatever it holds: the segment is being cut or removed); returns it."""
        buf = self.buffer
        if buf is None or (self.committed != self.wrote and not force):
            return None
        self.buffer = None  # read_end is wrote from here on, equal to committed
        self.writer = self.mm
        return buf

    def commit(self) -> int:
        """Write the buffer's ``[committed, wrote)`` to the file; returns the new committed
        position.  ``pwrite`` releases the GIL for the copy into the page cache, and lands
        on blocks the writer reserved before it appended (:meth:`reserve`), so a full disk
        never fails it; should it fail anyway, nothing moves and the next commit retries."""
        buf = self.buffer
        if buf is None:
            return self.wrote
        target, pos = self.wrote, self.committed
        if target > pos:
            with memoryview(buf) as view:
                self.write_at(view[pos:target], pos)
            self.committed = target
        return target

    def write_at(self, data: bytes | bytearray | memoryview, pos: int) -> None:
        """Write ``data`` at ``pos`` through the file (the mapping sees it: one page cache).
        ``pwrite`` releases the GIL for the copy, where a write through the mapping holds it
        and takes a fault on each page an msync cleaned."""
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], pos + done)

    def reserve(self, end: int) -> None:
        """Make sure the blocks of the first ``end`` bytes are allocated (a whole chunk
        ahead, at most the file), so that writing there never faults.  Raises ``OSError``
        (ENOSPC, EDQUOT) when the disk has no room; nothing is allocated past ``allocated``
        then, and a retry allocates it later."""
        if end <= self.allocated:
            return
        with self._reserving:
            if end <= self.allocated:  # the allocator reserved it meanwhile
                return
            if self._closed:
                raise ValueError(f"{self.path} is closed")
            target = min(self.size, -(-end // ALLOCATION_CHUNK) * ALLOCATION_CHUNK)
            disk.allocate_blocks(self.fd, self.allocated, target - self.allocated, self.path)
            self.allocated = target

    def data_end(self, start: int) -> int:
        """Where the first hole at or past ``start`` begins: what a file whose regions are
        written apart (an index file's entries, past a head that has holes where slots were
        never written back) holds from ``start`` on, and may be read without allocating."""
        return _data_end(self.fd, self.size, start)

    def advise_random(self) -> None:
        """No read-ahead on page faults.  A fault on a hole of a sparse file otherwise reads a
        whole window ahead: about 3 ms for a ConsumeQueue's next untouched page, on the append
        path, where the fault itself costs 10 us.  For files written in small entries and read
        at random places (consume queues, index files), read-ahead buys nothing."""
        self.mm.madvise(mmap.MADV_RANDOM)

    def flush(self) -> int:
        """msync what was written (with a pool buffer: committed) since the last flush;
        returns the new flushed position.  An msync of a range syncs the file's pages there
        whoever dirtied them, the mapping or a commit's ``pwrite``.

        Only the written range: warming dirties pages ahead of the writer with zeros, and an
        fdatasync of the file would write them too, on the sync-flush path, and undo the
        warming.
        """
        target = self.read_end
        if target > self.flushed:
            start = self.flushed - self.flushed % mmap.ALLOCATIONGRANULARITY
            msync(self.mm, start, target - start)
            self.flushed = target
        return self.flushed

    def sync_range(self, start: int, end: int) -> None:
        """msync the bytes in ``[start, end)``, whatever wrote them."""
        aligned = start - start % mmap.PAGESIZE
        msync(self.mm, aligned, end - aligned)

    def zero_from(self, pos: int) -> int:
        """Zero the segment from ``pos`` on; returns how many bytes past ``pos`` held data.

        Only the file's data regions are read (``SEEK_DATA``): reading a hole through the
        mapping would fault in a zero page for each of its pages, seconds for the untouched
        rest of a 1 GiB segment, and holes are zero already.  Chunks that hold only zeros are
        not written either, so warmed pages stay unallocated on disk.
        """
        mm, size = self.mm, self.size
        start = dirty_end = pos
        while pos < size:
            try:
                pos = os.lseek(self.fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but holes from here
                break
            data_end = min(size, os.lseek(self.fd, pos, os.SEEK_HOLE))
            while pos < data_end:
                end = min(data_end, (pos // _CHUNK + 1) * _CHUNK)
                chunk = mm[pos:end]
                if chunk != _ZEROS[: end - pos]:
                    dirty_end = pos + len(chunk.rstrip(b"\0"))
                    mm[pos:end] = _ZEROS[: end - pos]
                pos = end
        return dirty_end - start

    def close(self) -> None:
        # Views handed to readers keep the mapping alive; it is unmapped when the last goes.
        with contextlib.suppress(BufferError):
            self.mm.close()
        with self._reserving:
            self._closed = True
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class Allocator:
    """Creates segments and faults their pages in from a background thread, off the append path.

    A segment it builds is durable (size and directory entry) before :meth:`take` hands it
    out, so a sync acknowledgement of a record in it waits for msync alone; it appears under
    its name only once it is whole (:meth:`_make`).  :meth:`take` returns the pre-built
    segment for a path if there is one, else builds it cold; either way it asks for the
    segment after it.  A built segment has its first chunk faulted in; the writer asks for
    each next chunk as it goes (:meth:`warm_ahead`), so steady-state appends never wait for a
    file to be created or a page to be faulted in.
    """

    def __init__(self, *, warm: bool = True, allocate_blocks: bool = False):
        """``allocate_blocks``: also write the warmed pages back once, as RocketMQ's warm-up
        does under SYNC_FLUSH.  An msync that lands on blocks the file system has yet to
        allocate commits its journal as well: here 0.4-0.6 ms (p90 3-4 ms) for a group
        commit's 19 KB, against 0.2 ms onto blocks already written.  It costs the writer a
        light fault per page (the pages are clean again) and the disk a write of zeros."""
        self._warm = warm
        self._allocate_blocks = allocate_blocks
        self._lock = threading.Condition()
        # path -> start, size, warm, allocate
        self._build: dict[Path, tuple[int, int, int, int]] = {}
        # (mapping, offset, size, the file whose blocks to allocate there first, if any)
        self._to_warm: list[tuple[mmap.mmap, int, int, MappedFile | None]] = []
        self._ready: dict[Path, MappedFile] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="evq-allocate", daemon=True)
        self._thread.start()

    def take(self, path: Path, start: int, size: int, *, successor: bool = True,
             allocate: int = ALLOCATION_CHUNK, warm: int = WARM_CHUNK) -> MappedFile:
        """The file at ``path``, pre-built if it was asked for; with ``successor`` the segment
        after it is asked for in turn, with its first ``warm`` bytes faulted in.
        ``allocate``: bytes allocated up front (see :meth:`MappedFile.reserve`); raises
        ``OSError`` (ENOSPC) when the disk has no room for them."""
        mf = self._claim(path)
        if mf is None:
            mf = self._make(path, start, size, allocate)
        if successor:
            self.prefetch(mf, warm=warm)
        return mf

    def discard(self, path: Path) -> None:
        """Remove the file built (or being built) for ``path``, if any: it will not be used."""
        mf = self._claim(path)
        if mf is not None:
            mf.destroy()

    def _claim(self, path: Path) -> MappedFile | None:
        """The file built for ``path`` (once a build of it under way is done), or None."""
        with self._lock:
            while path in self._build:  # being built right now: it is nearly there
                self._lock.wait()
            return self._ready.pop(path, None)

    @staticmethod
    def _make(path: Path, start: int, size: int, allocate: int) -> MappedFile:
        """A new file at ``path`` that appears there whole: created, sized and its first
        ``allocate`` bytes allocated under :func:`building_path`, then renamed into place.
        Made at ``path`` itself, a listing could see it there empty or short, and a process
        killed between creating and sizing it would leave an empty segment behind.  The
        rename's syncs make the file and its final name durable; the temporary name's entry
        needs none.  Raises ``OSError`` (ENOSPC) when the disk has no room, leaving no file
        behind."""
        building = building_path(path)
        try:
            mf = MappedFile(building, start, size, create=True, allocate=allocate,
                            pending=durable_fs.PendingSyncs())  # synced by the rename
        except BaseException:
            building.unlink(missing_ok=True)
            raise
        try:
            durable_fs.rename_into_place(mf.fd, building, path)
        except BaseException:
            mf.destroy()
            raise
        mf.path = path
        return mf

    def build(self, path: Path, start: int, size: int, *, warm: int = WARM_CHUNK,
              allocate: int = ALLOCATION_CHUNK) -> None:
        """Create the file at ``path`` in the background, allocating its first ``allocate``
        bytes and faulting in its first ``warm``, for a later :meth:`take`."""
        self._request(build=(path, start, size, warm, allocate))

    def warm_ahead(self, mf: MappedFile, pos: int) -> int:
        """Allocate ``mf``'s blocks and fault in the pages its writer appends into (its
        mapping, or its transient store pool buffer) from ``pos`` to :data:`WARM_AHEAD`
        chunks past the one holding ``pos``, in the background; returns the log offset at
        which to ask again (the next chunk boundary: the pages warm already are walked again
        quickly).

        The blocks too: the writer's own :meth:`MappedFile.reserve` of each next 1 MiB then
        finds them allocated.  Made there, ``fallocate`` waited for the warming thread's page
        faults in the same file (the inode's locks): 0.5-1.2 ms a call, a sixth to a third
        of an append's time at 1 KiB messages.  Should the disk be too full for the whole
        range here, the writer reserves as it goes, and is refused where it always was."""
        chunk = pos // WARM_CHUNK + 1
        end = min(mf.size, (chunk + WARM_AHEAD) * WARM_CHUNK)
        if end > pos:
            self._request(warm=(mf.writer, pos, end - pos, mf))
        return mf.start + min(mf.size, chunk * WARM_CHUNK)

    def fault_in(self, mm: mmap.mmap, offset: int, size: int) -> None:
        """Fault in ``mm[offset:offset + size]`` writable in the background (any mapping: an
        anonymous one's pages are zeroed there rather than at their writer's first touch).
        Safe while a writer is using the range: pages already there are left as they are."""
        self._request(warm=(mm, offset, size, None))

    def prefetch(self, current: MappedFile, *, warm: int = WARM_CHUNK) -> None:
        """Build the segment that will follow ``current``, its first ``warm`` bytes faulted
        in (none for a segment whose writer appends into a transient store pool buffer)."""
        nxt = current.path.parent / segment_name(current.end)
        if not nxt.exists():
            self.build(nxt, current.end, current.size, warm=warm)

    def _request(
        self,
        *,
        warm: tuple[mmap.mmap, int, int, MappedFile | None] | None = None,
        build: tuple[Path, int, int, int, int] | None = None,
    ) -> None:
        with self._lock:
            if self._closed:
                return
            if warm is not None and self._warm:
                self._to_warm.append(warm)
            # Once per file: a second build would rename a new file over the first.
            if build is not None and build[0] not in self._build and build[0] not in self._ready:
                self._build[build[0]] = build[1:]
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._build and not self._to_warm and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                warm = self._to_warm.pop(0) if self._to_warm else None
                job = next(iter(self._build.items())) if warm is None else None
            if warm is not None:
                mm, offset, size, file = warm
                if file is not None:
                    # Closed meanwhile (ValueError), or no room: the writer reserves itself.
                    with contextlib.suppress(ValueError, OSError, disk.AllocationUnsupported):
                        file.reserve(offset + size)
                with contextlib.suppress(ValueError, OSError):  # closed meanwhile
                    self._fault_in(mm, offset, size)
                continue
            assert job is not None
            path, (start, size, warm_bytes, allocate) = job
            mf_new: MappedFile | None = None
            try:
                mf_new = self._make(path, start, size, allocate)
            except (OSError, disk.AllocationUnsupported) as exc:
                log.warning("segment_preallocation_failed", path=str(path), error=str(exc))
            if mf_new is not None and self._warm and warm_bytes:
                self._fault_in(mf_new.mm, 0, min(size, warm_bytes))
            with self._lock:
                self._build.pop(path, None)
                if mf_new is not None:
                    self._ready[path] = mf_new
                self._lock.notify_all()

    def _fault_in(self, mm: mmap.mmap, offset: int, size: int) -> None:
        if prefault(mm, size, offset) and self._allocate_blocks:
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            msync(mm, start, offset + size - start)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._to_warm.clear()
            self._lock.notify_all()
        self._thread.join()
        with self._lock:
            for mf in self._ready.values():
                mf.destroy()  # never written: an empty pre-built file is not part of the log
            self._ready.clear()


class MappedFileQueue:
    """The ordered segments of one logical file (the CommitLog, or one ConsumeQueue)."""

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        allocator: Allocator | None = None,
        *,
        random_access: bool = False,
        pending: durable_fs.PendingSyncs | None = None,
        pool: TransientStorePool | None = None,
    ):
        """``random_access``: see :meth:`MappedFile.advise_random`.  ``pending``: segments
        and directories created without an allocator are made durable when it is synced
        instead of at once (see :mod:`evq.durable_fs`).  ``pool``: the write segment
        appends into one of its buffers, which :meth:`commit` writes to the file (see
        :mod:`evq.backends.mmapfile.transient_pool`)."""
        self.directory = directory
        self.segment_size = segment_size
        self.allocator = allocator
        self.random_access = random_access
        self.pending = pending
        self.pool = pool
        self.files: list[MappedFile] = []
        self.lock = threading.RLock()
        # Held by whoever commits or changes buffered segments: the commit service, a writer
        # short of a buffer, truncation.  Taken after the store's put lock, before ``lock``.
        self.commit_lock = threading.Lock()

    def load(self) -> None:
        """Map the existing segments (positions are set by recovery)."""
        if not self.directory.is_dir():
            return
        names = [p for p in finished_files(self.directory) if p.name.isdigit()]
        for p in names:
            size = p.stat().st_size
            if size != self.segment_size:
                if size == 0:
                    log.warning("empty_segment_removed", path=str(p))
                    p.unlink()
                    continue
                raise StoreLayoutError(
                    f"{p}: size {size} differs from the configured segment size "
                    f"{self.segment_size}; open the store with the size it was created with"
                )
            self.files.append(self._advised(MappedFile(p, int(p.name), size, create=False)))
        for prev, cur in zip(self.files, self.files[1:], strict=False):
            if cur.start != prev.start + self.segment_size:
                raise StoreLayoutError(
                    f"gap in segments between {prev.path.name} and {cur.path.name}"
                )

    @property
    def min_offset(self) -> int:
        return self.files[0].start if self.files else 0

    @property
    def max_offset(self) -> int:
        """Write position in the logical file."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.start + last.wrote

    @property
    def read_end(self) -> int:
        """Where what readers may see ends in the logical file: :attr:`max_offset` without a
        pool, else the committed end (only the last segments hold buffers)."""
        files = self.files
        end = files[-1].start + files[-1].wrote if files else 0
        for mf in reversed(files):
            if mf.buffer is None:
                break
            if mf.committed < mf.wrote:
                end = mf.start + mf.committed
        return end

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def warm_bytes(self) -> int:
        """How much of a new segment's mapping the allocator faults in ahead of its writer:
        nothing with a transient store pool, whose writer never touches the mapping (commits
        ``pwrite`` into the file, readers fault in what they read).  Warming it would only
        dirty page-cache pages with zeros for the kernel to write back."""
        return 0 if self.pool is not None else WARM_CHUNK

    def prefetch_after(self, mf: MappedFile) -> None:
        """Have the segment after ``mf`` built ahead (see :meth:`Allocator.prefetch`)."""
        if self.allocator is not None:
            self.allocator.prefetch(mf, warm=self.warm_bytes)

    # --- the transient store pool ---------------------------------------------------------

    def lend_buffer(self, mf: MappedFile) -> None:
        """Give the write segment ``mf`` a pool buffer (none without a pool, or once full).
        With every buffer waiting for its segment's last commit, commit those first."""
        if self.pool is None or mf.buffer is not None or mf.wrote >= mf.size:
            return
        buf = self.pool.borrow()
        if buf is None:
            self.commit()
            buf = self.pool.borrow()
        if buf is None:  # every buffer held by a segment that is not full: cannot happen
            raise RuntimeError("transient store pool exhausted by segments still written")
        mf.attach(buf)

    def commit(self) -> int:
        """Write every buffered segment's new bytes to its file and give the buffers of full,
        committed segments back; returns :attr:`read_end`."""
        if self.pool is None:
            return self.max_offset
        with self.commit_lock:
            with self.lock:
                files = [mf for mf in self.files if mf.buffer is not None]
            for mf in files:
                mf.commit()
                if mf.wrote == mf.size:  # full: nothing will be written to it again
                    self._give_back(mf)
        return self.read_end

    def _give_back(self, mf: MappedFile, *, force: bool = False) -> None:
        buf = mf.detach(force=force)
        if buf is not None and self.pool is not None:
            self.pool.give_back(buf)

    def new_segment(self, start: int) -> MappedFile:
        """Append the segment beginning at ``start`` (the end of the last one, or any offset
        aligned to the segment size for an empty queue)."""
        durable_fs.make_dirs(self.directory, self.pending)
        path = self.directory / segment_name(start)
        if self.allocator is not None:
            mf = self.allocator.take(path, start, self.segment_size, warm=self.warm_bytes)
        else:  # a file written a little at a time: its writer reserves ahead
            mf = MappedFile(path, start, self.segment_size, create=True, pending=self.pending)
        self._advised(mf)
        self.lend_buffer(mf)
        with self.lock:
            self.files.append(mf)
        return mf

    def _advised(self, mf: MappedFile) -> MappedFile:
        if self.random_access:
            mf.advise_random()
        return mf

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding logical ``offset``."""
        files = self.files
        if not files:
            return None
        first = files[0].start
        i = (offset - first) // self.segment_size
        if 0 <= i < len(files):
            mf = files[i]
            if mf.start <= offset < mf.end:
                return mf
        return None

    def truncate(self, offset: int) -> int:
        """Forget everything at and after ``offset``: later segments are deleted and the one
        holding it is zeroed from there, so no stale record can reappear behind new ones.
        Returns how many bytes of data were dropped."""
        dropped = 0
        with self.commit_lock, self.lock:
            keep: list[MappedFile] = []
            for mf in self.files:
                if mf.start > offset or (mf.start == offset and keep):
                    dropped += mf.zero_from(0)
                    self._give_back(mf, force=True)
                    mf.destroy()
                    continue
                pos = min(offset - mf.start, mf.size)
                zeroed = mf.zero_from(pos)
                if zeroed:
                    # On disk before the log goes on: a power cut must not bring back the cut
                    # records behind new ones (recovery would scan on into them).  The deleted
                    # segments need no sync: recovery cuts whatever follows this one's end.
                    mf.sync_range(pos, pos + zeroed)
                dropped += zeroed
                mf.wrote = pos
                mf.flushed = min(mf.flushed, pos)
                mf.committed = min(mf.committed, pos)
                keep.append(mf)
            self.files = keep
        if keep:
            self.lend_buffer(keep[-1])  # the write segment again, perhaps no longer full
        return dropped

    def begin_at(self, start: int) -> MappedFile:
        """Drop every segment (and the successor pre-built for the last, which would leave a
        gap before ``start`` on disk) and begin the queue at ``start``."""
        with self.commit_lock, self.lock:
            gone, self.files = self.files, []
        for mf in gone:
            self._give_back(mf, force=True)
            mf.destroy()
            if self.allocator is not None:
                self.allocator.discard(self.directory / segment_name(mf.end))
        return self.new_segment(start)

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest segments (expiry); never the last one."""
        with self.commit_lock, self.lock:
            count = min(count, max(len(self.files) - 1, 0))
            gone, self.files = self.files[:count], self.files[count:]
        for mf in gone:
            self._give_back(mf, force=True)
            mf.destroy()
        return gone

    def flush(self) -> None:
        for mf in list(self.files):
            if mf.read_end > mf.flushed:
                mf.flush()

    def close(self) -> None:
        with self.commit_lock, self.lock:
            for mf in self.files:
                self._give_back(mf, force=True)
                mf.close()
            self.files = []

