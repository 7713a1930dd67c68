"""The in-memory key-value driver: the reference backend's storage, plain sorted tables.

Each table is a ``SortedDict`` of rows (``sortedcontainers``), so range reads walk keys in
order and an insert anywhere (index keys arrive in no order) stays cheap.  The tables of a
store directory live in a process-wide volume, so a store closed and opened again within one
process finds its data, as a disk would keep it; nothing survives the process.  A volume
belongs to its directory as files would: the directory holds a marker file naming the volume
(:data:`MARKER`), and a directory removed (or emptied) and opened again starts empty, as a new
directory would.  Every open lets go of the volumes whose directories are gone, so a process
that creates and removes many stores (tests, benchmarks) holds only the live ones.  One lock
serializes writers and readers: a reader copies the rows it asked for, so its view is
consistent for the call that made it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
from sortedcontainers import SortedDict

from evq.backends.kvlog.driver import Batch, Driver, Reader, Row
from evq.backends.kvlog.layout import Table
from evq.domain.log import LogLocked


class SortedTable:
    """Rows in key order (a ``SortedDict``: inserts anywhere cost O(log n), not a list move)."""

    def __init__(self) -> None:
        self.rows: SortedDict = SortedDict()

    def put(self, key: bytes, value: bytes) -> None:
        self.rows[key] = value

    def delete(self, key: bytes) -> None:
        self.rows.pop(key, None)

    def delete_range(self, start: bytes, stop: bytes) -> None:
        for key in list(self.rows.irange(start, stop, inclusive=(True, False))):
            del self.rows[key]

    def scan(self, start: bytes, stop: bytes, limit: int, *, back: bool) -> list[Row]:
        keys = self.rows.irange(start, stop, inclusive=(True, False), reverse=back)
        return [(k, self.rows[k]) for k in itertools.islice(keys, limit)]


MARKER = "memory.volume"
"""The file in a store directory that names its volume (a random token)."""


@attrs.define(slots=True)
class Volume:
    """One store directory's tables, and whether a log has it open."""

    token: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    tables: dict[Table, SortedTable] = attrs.field(
        factory=lambda: {t: SortedTable() for t in Table}
    )
    in_use: bool = False


_VOLUMES: dict[str, Volume] = {}
_VOLUMES_LOCK = threading.Lock()


def _marked(path: str, volume: Volume) -> bool:
    """Whether the directory at ``path`` still holds ``volume`` (its marker names it)."""
    try:
        return (Path(path) / MARKER).read_text() == volume.token
    except OSError:
        return False


class MemoryReader(Reader):
    def __init__(self, tables: dict[Table, SortedTable]):
        self._tables = tables

    def get(self, table: Table, key: bytes) -> bytes | None:
        return self._tables[table].rows.get(key)

    def scan(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        return self._tables[table].scan(start, stop, limit, back=False)

    def scan_back(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        return self._tables[table].scan(start, stop, limit, back=True)


class MemoryBatch(Batch):
    def __init__(self) -> None:
        self.ops: list[tuple[str, Table, bytes, bytes]] = []

    def put(self, table: Table, key: bytes, value: bytes | bytearray) -> None:
        self.ops.append(("put", table, key, bytes(value)))

    def delete(self, table: Table, key: bytes) -> None:
        self.ops.append(("delete", table, key, b""))

    def delete_range(self, table: Table, start: bytes, stop: bytes) -> None:
        self.ops.append(("range", table, start, stop))


class MemoryDriver(Driver):
    persistent = False

    def __init__(self, path: str, volume: Volume):
        self._path = path
        self._volume = volume
        self._lock = threading.RLock()

    @classmethod
    def open(cls, root: Path) -> MemoryDriver:
        path = str(Path(root).resolve())
        with _VOLUMES_LOCK:
            for gone in [p for p, v in _VOLUMES.items() if not v.in_use and not _marked(p, v)]:
                del _VOLUMES[gone]
            volume = _VOLUMES.get(path)
            if volume is None:
                volume = _VOLUMES[path] = Volume()
                Path(path).mkdir(parents=True, exist_ok=True)
                (Path(path) / MARKER).write_text(volume.token)
            if volume.in_use:
                raise LogLocked(f"{root} is in use by another in-memory log")
            volume.in_use = True
        return cls(path, volume)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        with self._lock:
            yield MemoryReader(self._volume.tables)

    def batch(self) -> MemoryBatch:
        return MemoryBatch()

    def write(self, batch: Batch) -> None:
        assert isinstance(batch, MemoryBatch)
        tables = self._volume.tables
        with self._lock:
            for op, table, a, b in batch.ops:
                t = tables[table]
                if op == "put":
                    t.put(a, b)
                elif op == "delete":
                    t.delete(a)
                else:
                    t.delete_range(a, b)

    def sync(self) -> None:
        """Nothing to do: memory is as durable as it gets."""

    def close(self) -> None:
        with _VOLUMES_LOCK:
            self._volume.in_use = False
