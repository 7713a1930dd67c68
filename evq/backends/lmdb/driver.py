"""The LMDB driver: the key-value log's tables in one LMDB environment.

::

    root/lmdb/data.mdb, lock.mdb        one environment, five named sub-databases
    +----------+----------------------------------------------------------------+
    | "log"    | u64 physical offset        -> stored record | BLANK header (8)   |
    | "queue"  | queue prefix + u64 offset  -> phys u64 | size i32 | tags i64 |  |
    |          |                               store time i64          (28 bytes) |
    | "index"  | len u8 + "topic#key" + store time i64 + phys u64  -> (empty)     |
    | "queues" | queue prefix (u16 len, topic, u32 queue) -> min u64 | next u64   |
    | "meta"   | "state" -> log end u64 | log min u64 | index ts i64 | index phys |
    +----------+----------------------------------------------------------------+
    (byte offsets of each field: evq.backends.kvlog.layout)

One append batch is one write transaction.  LMDB never overwrites a page a committed
transaction still uses and switches the meta page last, so a killed process leaves the last
committed transaction whole and nothing of a later one: there is no torn tail.  The
environment is opened without per-commit fsync (``sync=False``): a commit survives the
process as soon as it returns (it is in the page cache), and :meth:`LmdbDriver.sync`
(``mdb_env_sync``) is the flusher's group commit, making every earlier commit durable against
power loss.  Keys stay under LMDB's 511-byte limit (the index hashes long keys).  The map is
reserved at 1 TiB of address space; the file grows only as data arrives.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import lmdb

from evq import durable_fs, logs
from evq.backends import disk
from evq.backends.kvlog.driver import Batch, Driver, Reader, Row, translated
from evq.backends.kvlog.layout import Table

log = logs.get_logger(__name__)

MAP_SIZE = 1 << 40
MAX_READERS = 512


def _lmdb_errors() -> contextlib.AbstractContextManager[None]:
    return translated(lmdb.Error, "LMDB")


class LmdbReader(Reader):
    def __init__(self, txn: lmdb.Transaction, dbs: dict[Table, lmdb._Database]):
        self._txn = txn
        self._dbs = dbs

    def get(self, table: Table, key: bytes) -> bytes | None:
        with _lmdb_errors():
            return self._txn.get(key, db=self._dbs[table])

    def scan(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        out: list[Row] = []
        with _lmdb_errors(), self._txn.cursor(self._dbs[table]) as cur:
            if not cur.set_range(start):
                return out
            for k, v in cur.iternext():
                if k >= stop or len(out) >= limit:
                    break
                out.append((k, v))
        return out

    def scan_back(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        out: list[Row] = []
        with _lmdb_errors(), self._txn.cursor(self._dbs[table]) as cur:
            ok = cur.prev() if cur.set_range(stop) else cur.last()
            while ok and len(out) < limit:
                k = cur.key()
                if k < start:
                    break
                out.append((k, cur.value()))
                ok = cur.prev()
        return out


class LmdbBatch(Batch):
    """Operations replayed in one write transaction by :meth:`LmdbDriver.write`."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, Table, bytes, bytes | bytearray]] = []

    def put(self, table: Table, key: bytes, value: bytes | bytearray) -> None:
        self.ops.append((0, table, key, value))

    def append(self, table: Table, key: bytes, value: bytes | bytearray) -> None:
        self.ops.append((3, table, key, value))

    def delete(self, table: Table, key: bytes) -> None:
        self.ops.append((1, table, key, b""))

    def delete_range(self, table: Table, start: bytes, stop: bytes) -> None:
        self.ops.append((2, table, start, stop))


class LmdbDriver(Driver):
    def __init__(self, env: lmdb.Environment):
        self._env = env
        with _lmdb_errors():
            self._dbs = {t: env.open_db(t.label.encode()) for t in Table}

    @classmethod
    def open(cls, root: Path) -> LmdbDriver:
        """LMDB syncs its data file (``mdb_env_sync``) but never the directory naming it: a
        power cut could keep every synced page of a new environment and lose ``data.mdb``
        itself.  So the directory is created durably and synced once the files are in it."""
        directory = root / "lmdb"
        durable_fs.make_dirs(directory)
        with _lmdb_errors():
            env = lmdb.open(
                str(directory), map_size=MAP_SIZE, max_dbs=len(Table), subdir=True,
                sync=False, metasync=False, max_readers=MAX_READERS,
            )
        try:
            durable_fs.sync_path(directory)
            _allocate_lock_file(directory / "lock.mdb")
        except BaseException:
            env.close()
            raise
        return cls(env)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        with _lmdb_errors(), self._env.begin(buffers=False) as txn:
            yield LmdbReader(txn, self._dbs)

    def batch(self) -> LmdbBatch:
        return LmdbBatch()

    def write(self, batch: Batch) -> None:
        assert isinstance(batch, LmdbBatch)
        dbs = self._dbs
        with _lmdb_errors(), self._env.begin(write=True) as txn:
            put = txn.put
            for op, table, a, b in batch.ops:
                if op == 0:
                    put(a, b, db=dbs[table])
                elif op == 3:  # MDB_APPEND: full pages; refused (False) if not the last key
                    if not put(a, b, db=dbs[table], append=True):
                        put(a, b, db=dbs[table])
                elif op == 1:
                    txn.delete(a, db=dbs[table])
                else:
                    _delete_range(txn.cursor(dbs[table]), a, bytes(b))

    def sync(self) -> None:
        with _lmdb_errors():
            self._env.sync(True)

    def close(self) -> None:
        with _lmdb_errors():
            self._env.close()


def _allocate_lock_file(path: Path) -> None:
    """LMDB writes its reader table through a shared mapping of ``lock.mdb``, a sparse file:
    a reader taking a slot on a page never written before would fault (SIGBUS) on a full
    disk.  Its blocks are allocated once (a few pages), while there is room; on a full disk
    the store still opens, with a warning, as the pages in use are already there.  Its data
    file LMDB writes with ``pwrite``: a full disk fails the commit, which the store turns
    into refused puts."""
    fd = os.open(path, os.O_RDWR)
    try:
        disk.allocate_blocks(fd, 0, os.fstat(fd).st_size, path)
    except OSError as exc:
        if not disk.no_space(exc):
            raise
        log.warning("lmdb_lock_file_not_allocated", path=str(path), error=str(exc))
    finally:
        os.close(fd)


def _delete_range(cur: lmdb.Cursor, start: bytes, stop: bytes) -> None:
    if not cur.set_range(start):
        return
    while True:
        k = cur.key()
        if not k or k >= stop:  # b"": the cursor ran off the end (no key is empty here)
            return
        cur.delete()
