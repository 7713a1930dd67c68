"""What every ``evq bench`` shares: the backend check, the scratch directory it removes, its
progress bars (stderr, so ``--json`` output stays one clean line), and what the machine charges
for a fresh page (:func:`populated_mapping`).

A fresh page is the figure that moves a store's append rate between machines and days more than
any code: the kernel allocates and zeroes every page-cache page a growing log is written to,
and under a hypervisor that lazily backs guest memory (and takes freed memory back, as a
virtio balloon's free page reporting does) the first touch of a page it took back traps to
the host: measured here at 3 to 7.5 us a 4 KiB page, against 0.6 to 1.1 us right after the
guest had written and freed 14 GB (and 3 us again 20 s later, once the balloon had reported
it).  A store pays it wherever its pages are first written (the allocator thread that
pre-faults them, the writer when that lags); a benchmark floor with a pre-populated mapping
never does.  So the store and embedded benchmarks report it from the same run.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evq.backends import registry
from evq.backends.config import StoreConfig


def check_backend(name: str) -> None:
    """Refuse an unknown backend before anything is created, naming the valid ones."""
    if name not in registry.BACKENDS:
        known = ", ".join(sorted(registry.BACKENDS))
        raise registry.UnknownBackend(f"unknown backend {name!r}; choose one of: {known}")


def store_config(segment_size: int | None, **settings: Any) -> StoreConfig:
    """A benchmark store's config: the defaults and ``settings``, and its CommitLog segment
    size when one was asked for (small segments make small runs cross segment ends)."""
    if segment_size is not None:
        settings["commitlog_segment_size"] = segment_size
    return StoreConfig(**settings)


@contextlib.contextmanager
def scratch(parent: Path | None, prefix: str = "evq-bench-") -> Iterator[Path]:
    """A fresh directory under ``parent`` (the system's temp dir if None), removed after."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def progress(enabled: bool, desc: str, total: int) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit="msg", unit_scale=True, file=sys.stderr,
                disable=not enabled, leave=False, dynamic_ncols=True)


def free_port(host: str) -> int:
    """A port nothing listens on now (for a server that cannot pick its own with port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


FRESH_PAGES_PROBE = 64 * 1024 * 1024
"""Bytes of new file :func:`fresh_page_us` brings in: enough pages to average out the
hypervisor's larger backing blocks, little enough to take tens of milliseconds."""


def populated_mapping(fd: int, size: int) -> tuple[mmap.mmap, float]:
    """A shared mapping of the first ``size`` bytes of the new, empty file ``fd``, every page
    brought in (MAP_POPULATE: allocated and zeroed in the page cache, mapped), and the
    microseconds that took a 4 KiB page."""
    os.ftruncate(fd, size)
    t0 = time.perf_counter()
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    return mm, (time.perf_counter() - t0) * 1e6 / max(1, size // mmap.PAGESIZE)


def fresh_page_us(directory: Path) -> float:
    """What this machine charges now for a fresh page-cache page (see the module docstring),
    in microseconds a 4 KiB page, measured on a scratch file in ``directory``."""
    path = directory / "fresh-pages.probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        mm, us = populated_mapping(fd, FRESH_PAGES_PROBE)
        mm.close()
    finally:
        os.close(fd)
        path.unlink()
    return us
