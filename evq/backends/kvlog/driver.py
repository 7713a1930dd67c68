"""What :class:`~evq.backends.kvlog.store.KeyedMessageLog` needs from an ordered key-value store.

Five tables (:class:`~evq.backends.kvlog.layout.Table`) of byte keys in byte order, atomic
multi-table batches, point and bounded range reads, and an explicit sync.  That is all the
message log asks, so LMDB, RocksDB and the in-memory reference run the very same log code and
differ only in these few methods.  A driver translates its library's errors into
:class:`DriverError` (a :class:`~evq.domain.log.LogError`) at this boundary.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from evq.backends.kvlog.layout import Table
from evq.domain.log import LogError

Row = tuple[bytes, bytes]


class DriverError(LogError):
    """The key-value library failed (I/O error, full map, closed database)."""


class Reader(abc.ABC):
    """A consistent view for the length of one ``with driver.reader()`` block."""

    @abc.abstractmethod
    def get(self, table: Table, key: bytes) -> bytes | None: ...

    def get_many(self, table: Table, keys: Iterable[bytes]) -> list[bytes | None]:
        """``get`` of each key, in order; a library that reads many keys in one call faster
        (RocksDB's MultiGet) answers them together."""
        return [self.get(table, key) for key in keys]

    @abc.abstractmethod
    def scan(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        """Up to ``limit`` rows with ``start <= key < stop``, ascending."""

    @abc.abstractmethod
    def scan_back(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        """Up to ``limit`` rows with ``start <= key < stop``, descending from ``stop``."""


class Batch(abc.ABC):
    """Writes applied all together by :meth:`Driver.write`, or not at all."""

    @abc.abstractmethod
    def put(self, table: Table, key: bytes, value: bytes | bytearray) -> None: ...

    def append(self, table: Table, key: bytes, value: bytes | bytearray) -> None:
        """Put a key known to sort after every key of ``table`` (log rows): a B-tree can fill
        its pages instead of splitting them half-empty."""
        self.put(table, key, value)

    @abc.abstractmethod
    def delete(self, table: Table, key: bytes) -> None: ...

    @abc.abstractmethod
    def delete_range(self, table: Table, start: bytes, stop: bytes) -> None:
        """Delete every key with ``start <= key < stop``."""


class Driver(abc.ABC):
    persistent: bool = True
    """Whether what was written survives the process (the memory driver's does not)."""

    @classmethod
    @abc.abstractmethod
    def open(cls, root: Path) -> Driver:
        """Open (creating if needed) the driver's files under the store directory ``root``;
        the caller holds the directory's lock."""

    @abc.abstractmethod
    def reader(self) -> contextlib.AbstractContextManager[Reader]: ...

    @abc.abstractmethod
    def batch(self) -> Batch: ...

    @abc.abstractmethod
    def write(self, batch: Batch) -> None:
        """Apply ``batch`` atomically; durable against a process crash once it returns, and
        against a power loss once a later :meth:`sync` returns."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make every write so far durable on disk (fsync)."""

    @abc.abstractmethod
    def close(self) -> None: ...


@contextlib.contextmanager
def translated(library_error: type[BaseException] | tuple[type[BaseException], ...],
               what: str) -> Iterator[None]:
    """Re-raise a library's error as :class:`DriverError` naming the backend."""
    try:
        yield
    except library_error as exc:
        raise DriverError(f"{what}: {exc}") from exc
