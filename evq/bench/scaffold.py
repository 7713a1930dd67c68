"""What every ``evq bench`` shares: the backend check, the scratch directory it removes, and
its progress bars (stderr, so ``--json`` output stays one clean line)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import tempfile
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
