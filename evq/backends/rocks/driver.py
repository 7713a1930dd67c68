"""The RocksDB driver (``rocksdict``): the key-value log's tables as column families.

::

    root/rocks/                    one RocksDB database, raw byte keys and values
    +--------------------+------------------------------------------------------------+
    | column family      | key -> value (byte offsets: evq.backends.kvlog.layout)      |
    +--------------------+------------------------------------------------------------+
    | "log"              | u64 physical offset -> stored record | BLANK header (8)     |
    | "queue"            | queue prefix + u64 queue offset -> phys u64 | size i32 |    |
    |                    |                          tags code i64 | store time i64 (28) |
    | "index"            | len u8 + "topic#key" + store time i64 + phys u64 -> (empty)  |
    | "queues"           | queue prefix (u16 len, topic, u32 queue) -> min u64|next u64 |
    | "meta"             | "state" -> log end u64 | log min u64 | index ts | index phys  |
    | "default"          | unused (RocksDB always has it)                               |
    +--------------------+------------------------------------------------------------+

One append batch is one ``WriteBatch`` across the column families, atomic in the write-ahead
log: recovery replays whole, checksummed batches and drops a torn last one, so the log and its
projections are never out of step and there is no torn tail to cut.  Writes go to the WAL
without fsync (``WriteOptions.sync = False``), which a killed process cannot lose (the bytes
are in the page cache); :meth:`RocksDriver.sync` (``FlushWAL(sync=true)``) is the flusher's
group commit that makes them survive power loss.  Tables carry whole-key Bloom filters and
share one 64 MiB block cache for data blocks (:func:`_options`).  ``rocksdict`` raises plain
``Exception`` for RocksDB's statuses; they become
:class:`~evq.backends.kvlog.driver.DriverError` here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import rocksdict

from evq import durable_fs
from evq.backends.kvlog.driver import Batch, Driver, DriverError, Reader, Row
from evq.backends.kvlog.layout import Table


@contextlib.contextmanager
def _rocks_errors() -> Iterator[None]:
    """rocksdict raises a bare ``Exception`` for a RocksDB status, or DbClosedError: those
    become DriverError.  Any other exception is a bug here and propagates as it is."""
    try:
        yield
    except Exception as exc:
        if type(exc) is Exception or isinstance(exc, rocksdict.DbClosedError):
            raise DriverError(f"RocksDB: {exc}") from exc
        raise


BLOCK_CACHE_BYTES = 64 * 1024 * 1024
BLOOM_BITS_PER_KEY = 10


def _options(cache: rocksdict.Cache) -> rocksdict.Options:
    """Every look-up of the port is a point get (a record by log offset, a queue entry by
    offset) or a short scan, and stores grow to many SST files: without filters a get probes
    each level's file, so its cost grew with the store.  Whole-key Bloom filters let a get
    skip the files without its key; data blocks share one block cache across the column
    families.  Filter and index blocks stay with their table readers, outside that cache: the
    cache is split into 64 shards, and once compaction has merged a table into one large file
    its filter block (1.25 MB a million keys) outgrows a shard, so every get read and parsed
    it again (offset-for-time fell from 24,000 to 420 lookups/s on a compacted store of 10^6
    messages).  They cost memory in proportion to the data: 1.25 bytes a key for the
    filter and one index entry a 4 KiB block."""
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    table.set_block_cache(cache)
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_keep_log_file_num(2)
    opts.set_block_based_table_factory(table)
    return opts


class RocksReader(Reader):
    def __init__(self, cfs: dict[Table, rocksdict.Rdict]):
        self._cfs = cfs

    def get(self, table: Table, key: bytes) -> bytes | None:
        with _rocks_errors():
            return self._cfs[table].get(key)

    def get_many(self, table: Table, keys: Iterable[bytes]) -> list[bytes | None]:
        with _rocks_errors():
            return self._cfs[table].get(list(keys))

    def scan(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        out: list[Row] = []
        with _rocks_errors():
            it = self._cfs[table].iter()
            it.seek(start)
            while it.valid() and len(out) < limit:
                k = it.key()
                if k >= stop:
                    break
                out.append((k, it.value()))
                it.next()
        return out

    def scan_back(self, table: Table, start: bytes, stop: bytes, limit: int) -> list[Row]:
        out: list[Row] = []
        with _rocks_errors():
            it = self._cfs[table].iter()
            it.seek_for_prev(stop)
            if it.valid() and it.key() >= stop:
                it.prev()
            while it.valid() and len(out) < limit:
                k = it.key()
                if k < start:
                    break
                out.append((k, it.value()))
                it.prev()
        return out


class RocksBatch(Batch):
    def __init__(self, handles: dict[Table, rocksdict.ColumnFamily]):
        self._handles = handles
        self.batch = rocksdict.WriteBatch(raw_mode=True)

    def put(self, table: Table, key: bytes, value: bytes | bytearray) -> None:
        self.batch.put(key, bytes(value), self._handles[table])

    def delete(self, table: Table, key: bytes) -> None:
        self.batch.delete(key, self._handles[table])

    def delete_range(self, table: Table, start: bytes, stop: bytes) -> None:
        self.batch.delete_range(start, stop, self._handles[table])


class RocksDriver(Driver):
    def __init__(self, db: rocksdict.Rdict):
        self._db = db
        with _rocks_errors():
            self._handles = {t: db.get_column_family_handle(t.label) for t in Table}
            self._cfs = {t: db.get_column_family(t.label) for t in Table}
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.sync = False

    @classmethod
    def open(cls, root: Path) -> RocksDriver:
        """RocksDB syncs the directory of each file it creates in its own directory (the
        write-ahead log's on the first synced write), but not the entry of that directory in
        the store: evq creates it, durably."""
        directory = root / "rocks"
        durable_fs.make_dirs(directory)
        cache = rocksdict.Cache(BLOCK_CACHE_BYTES)
        with _rocks_errors():
            db = rocksdict.Rdict(
                str(directory), options=_options(cache),
                column_families={t.label: _options(cache) for t in Table},
            )
        return cls(db)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Reader]:
        yield RocksReader(self._cfs)

    def batch(self) -> RocksBatch:
        return RocksBatch(self._handles)

    def write(self, batch: Batch) -> None:
        assert isinstance(batch, RocksBatch)
        with _rocks_errors():
            self._db.write(batch.batch, self._write_opts)

    def sync(self) -> None:
        with _rocks_errors():
            self._db.flush_wal(True)

    def close(self) -> None:
        with _rocks_errors():
            for cf in self._cfs.values():
                cf.close()
            self._cfs.clear()
            self._db.close()
