"""Which of a file's pages the kernel holds dirty: written, not yet on disk; and which pages
of a mapping are in memory at all.

A power cut loses exactly those, and no kill test can see them (the page cache survives the
process), so a test of "on disk when it returns" asks the kernel directly: it maps the file,
reads each page in (which writes nothing), looks up the page frames in ``/proc/self/pagemap``
and their flags in ``/proc/kpageflags``.  Reading page frames takes CAP_SYS_ADMIN: without it
the kernel reports frame 0, and :func:`dirty_pages` skips the calling test, saying so.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from pathlib import Path

import pytest

_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1
_KPF_DIRTY = 1 << 4
_ENTRY = struct.Struct("<Q")


def dirty_pages(path: Path, start: int, end: int) -> int:
    """How many pages of ``path`` overlapping ``[start, end)`` are dirty in the page cache."""
    first, last = start // mmap.PAGESIZE, (end - 1) // mmap.PAGESIZE
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        view = ctypes.c_char.from_buffer(mm)
        try:
            base = ctypes.addressof(view) // mmap.PAGESIZE
        finally:
            del view
        for page in range(first, last + 1):
            mm[page * mmap.PAGESIZE]  # map the page (a read: it stays as clean as it was)
        with open("/proc/self/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as kpf:
            dirty = 0
            for page in range(first, last + 1):
                pagemap.seek((base + page) * 8)
                (entry,) = _ENTRY.unpack(pagemap.read(8))
                frame = entry & _PFN_MASK
                if not entry & _PRESENT:
                    continue  # not in memory: nothing of it can be lost
                if frame == 0:
                    pytest.skip("reading page frames from /proc/self/pagemap needs root")
                kpf.seek(frame * 8)
                (flags,) = _ENTRY.unpack(kpf.read(8))
                dirty += bool(flags & _KPF_DIRTY)
        return dirty


def present_pages(view: memoryview) -> int:
    """How many pages under ``view`` (a writable view of a mapping) are in memory:
    ``/proc/self/pagemap``'s present bit, which needs no privilege."""
    anchor = ctypes.c_char.from_buffer(view)
    try:
        start = ctypes.addressof(anchor)
    finally:
        del anchor
    first, last = start // mmap.PAGESIZE, (start + view.nbytes - 1) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        raw = pagemap.read((last - first + 1) * 8)
    return sum(entry >> 63 for (entry,) in _ENTRY.iter_unpack(raw))
