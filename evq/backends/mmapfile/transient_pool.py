"""RocketMQ's transient store pool: locked memory the CommitLog's writer appends into.

With ``transientStorePoolEnable`` a CommitLog segment that becomes the write segment borrows
one of these buffers (an anonymous mapping as large as a segment) and appends copy records
into it instead of into the file's mapping; the commit service
(:class:`~evq.backends.mmapfile.commit.CommitService`) writes the new bytes to the file with
``pwrite`` in large batches and the flusher syncs them.  The writer then never touches a page
of the file: no fresh-page fault, and no write-protect fault on a page the kernel has written
back (a shared file mapping's pages are made read-only again at every write-back, so even a
warmed segment faults once per page after it; an anonymous buffer's pages stay writable).

The buffers are made once, when the store opens, and locked in memory (``mlock``) so that
they are never paged out; that also faults every page in at once.  A process whose
``RLIMIT_MEMLOCK`` is too small for them (``ulimit -l``; 8 MiB is a common default against
5 x 1 GiB) gets one warning and unlocked buffers, which the allocator then faults in a chunk
ahead of the writer as it does the file mappings.  Either way the pool holds ``size`` x
``segment size`` bytes of memory once the buffers have been written: that is its price.

A segment gives its buffer back once it is full and committed.  Only the write segment
writes, so at most one buffer is being filled; the others wait for their last commit.  Should
every buffer be waiting (segments filling faster than a commit interval, or a pool of one),
the writer commits the waiting segments itself before it takes the freed buffer: a bounded
wait (one commit of at most ``size`` segments) rather than RocketMQ's fall-back to writing the
file's mapping, which would make bytes of a later segment readable before those of an
earlier one.
"""

from __future__ import annotations

import collections
import mmap
import threading

from evq import logs
from evq.backends.mmapfile.mapped_file import mlock, munlock

log = logs.get_logger(__name__)


class TransientStorePool:
    """``size`` buffers of ``buffer_size`` bytes; see the module docstring."""

    def __init__(self, size: int, buffer_size: int):
        if size < 1:
            raise ValueError("a transient store pool holds at least one buffer")
        self.buffer_size = buffer_size
        self._all: list[mmap.mmap] = []
        self._free: collections.deque[mmap.mmap] = collections.deque()
        self._lock = threading.Lock()
        self.locked = True
        try:
            for _ in range(size):
                buf = mmap.mmap(-1, buffer_size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                self._all.append(buf)
                self._free.append(buf)
                if self.locked:
                    why = mlock(buf)
                    if why:
                        self.locked = False
                        log.warning(
                            "transient_store_pool_unlocked", buffers=size,
                            buffer_bytes=buffer_size, error=why,
                            hint="raise RLIMIT_MEMLOCK (ulimit -l) to lock the pool in memory; "
                                 "it works unlocked, its pages may be swapped out",
                        )
        except BaseException:
            self.close()
            raise

    @property
    def available(self) -> int:
        return len(self._free)

    def borrow(self) -> mmap.mmap | None:
        """A free buffer, or None when every one is lent out."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def give_back(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._free.append(buf)

    def close(self) -> None:
        """Unlock and unmap every buffer, lent out or not (the store has committed them)."""
        with self._lock:
            for buf in self._all:
                if self.locked:
                    munlock(buf)
                buf.close()
            self._all.clear()
            self._free.clear()
