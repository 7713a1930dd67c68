"""Keys and values of the ordered key-value backends (LMDB, RocksDB, memory).

Five tables; LMDB keeps each in its own sub-database, RocksDB in its own column family.  Every
integer is big-endian, so byte order is numeric order and a range scan walks log offsets,
queue offsets and store times in order::

    log        key   +--------------------------+
                     | 0 physical offset  u64 8 |
                     +--------------------------+
               value the stored record, byte for byte (evq.domain.record), or, for the padding
                     at a segment's end, only its 8-byte BLANK header (TOTALSIZE = bytes to the
                     segment end): read_log expands the zeros, so the raw log is mmap's

    queue      key   +-----------------+-----------+---------------+------------------+
    (one row per     | 0 topic len u16 | 2 topic   | 2+T queue u32 | 6+T queue offset |
     consumable      |               2 | T bytes   |             4 |          u64 8   |
     record)         +-----------------+-----------+---------------+------------------+
               value +--------------------+----------+---------------+----------------+
                     | 0 physical off u64 | 8 size   | 12 tags code  | 20 store time  |
                     |                  8 |  i32 4   |       i64 8   |        i64 8   |
                     +--------------------+----------+---------------+----------------+

    index      key   +------------+--------------------+-----------------+--------------+
                     | 0 len u8 1 | 1 "topic#key" UTF-8 | 1+K store time  | 9+K physical |
                     |            |   K <= 200 bytes   |        i64 8    | offset u64 8 |
                     +------------+--------------------+-----------------+--------------+
                     a longer "topic#key" is stored as len 0xFF + its 16-byte BLAKE2b digest
                     (LMDB keys are at most 511 bytes; answers are checked against the records)
               value empty

    queues     key   the queue prefix: topic len u16 | topic | queue u32
               value +-----------------+------------------+
                     | 0 min offset u64| 8 next offset u64|
                     +-----------------+------------------+

    meta       key   b"state"
               value +--------------+-----------------+----------------------+-----------------+
                     | 0 log end u64| 8 log min u64   | 16 index last ts i64 | 24 index last   |
                     |            8 |               8 |                    8 | offset i64 8    |
                     +--------------+-----------------+----------------------+-----------------+

One append batch is one atomic write of its log rows, queue rows, index rows, touched queue
rows and the meta row, so after any crash the projections are exactly in step with the log.
A key query is one backward range scan of ``index`` from ``(key, end, max)`` to
``(key, begin, 0)``; a pull is one forward scan of ``queue`` from ``(prefix, offset)``.
"""

from __future__ import annotations

import enum
import hashlib
import struct

U64 = struct.Struct(">Q")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
QUEUE_ENTRY = struct.Struct(">QiqQ")  # physical offset, size, tags code, store time
INDEX_TAIL = struct.Struct(">qQ")  # store time, physical offset
QUEUE_ROW = struct.Struct(">QQ")  # min offset, next offset
STATE = struct.Struct(">QQqq")  # log end, log min, index last store time, index last offset

STATE_KEY = b"state"
MAX_INLINE_INDEX_KEY = 200
HASHED_INDEX_KEY = 0xFF
LOG_KEY_END = b"\xff" * 9  # sorts after every 8-byte log key
MAX_TIME = 2**63 - 1


class Table(enum.IntEnum):
    """The tables; :attr:`label` names the LMDB sub-database / RocksDB column family.  An
    IntEnum because a table is a dict key on every put, and ``Enum`` hashes in Python code."""

    LOG = 0
    QUEUE = 1
    INDEX = 2
    QUEUES = 3
    META = 4

    @property
    def label(self) -> str:
        return self.name.lower()


def log_key(phys: int) -> bytes:
    return U64.pack(phys)


def queue_prefix(topic: str, queue_id: int) -> bytes:
    raw = topic.encode()
    return U16.pack(len(raw)) + raw + U32.pack(queue_id)


def queue_topic(prefix: bytes) -> tuple[str, int]:
    """Inverse of :func:`queue_prefix`."""
    (n,) = U16.unpack_from(prefix)
    return prefix[2 : 2 + n].decode(), U32.unpack_from(prefix, 2 + n)[0]


def index_prefix(topic: str, key: str) -> bytes:
    raw = f"{topic}#{key}".encode()
    if len(raw) > MAX_INLINE_INDEX_KEY:
        return bytes([HASHED_INDEX_KEY]) + hashlib.blake2b(raw, digest_size=16).digest()
    return bytes([len(raw)]) + raw


def index_key(prefix: bytes, store_ts: int, phys: int) -> bytes:
    return prefix + INDEX_TAIL.pack(store_ts, phys)


def index_bounds(prefix: bytes, begin_ms: int, end_ms: int) -> tuple[bytes, bytes]:
    """``[start, stop)`` keys of the entries stored within ``[begin_ms, end_ms]``."""
    begin = min(max(begin_ms, 0), MAX_TIME)
    stop = min(max(end_ms, -1) + 1, MAX_TIME)
    return prefix + INDEX_TAIL.pack(begin, 0), prefix + INDEX_TAIL.pack(stop, 0)


def index_phys(key: bytes) -> int:
    return U64.unpack_from(key, len(key) - 8)[0]
