"""The checkpoint file: how far each part of the store was known to be on disk.

A 4096-byte file, big-endian longs::

    0  physicMsgTimestamp   store time of the last record flushed in the CommitLog
    8  logicsMsgTimestamp   store time of the last record flushed in the ConsumeQueues
   16  indexMsgTimestamp    store time of the last record flushed in the IndexFiles
   24  physicOffset         (evq) log offset the CommitLog was flushed to
   32  indexFileName        (evq) the name (17 digits) of the IndexFile being written when
   40  indexSyncedCount     (evq) this many of its entries were on disk, its head's count
                            perhaps lower (0: none to count again)

Abnormal recovery replays the log from the last segment whose first record is no newer than
the smallest of the three timestamps, as RocketMQ does.  A checkpoint written before the last
two fields existed holds zeros there: the index then counts what its heads say.
"""

from __future__ import annotations

import struct
from pathlib import Path

from evq.backends.mmapfile.mapped_file import MappedFile

FIELDS = struct.Struct(">qqqqqq")
FILE_SIZE = 4096


class Checkpoint:
    def __init__(self, path: Path):
        self._file = MappedFile(path, 0, FILE_SIZE, create=True, allocate=FILE_SIZE)
        (self.physic_ts, self.logics_ts, self.index_ts, self.physic_offset, self.index_file,
         self.index_synced) = FIELDS.unpack_from(self._file.mm, 0)

    @property
    def min_timestamp(self) -> int:
        return min(self.physic_ts, self.logics_ts, self.index_ts)

    def save(self) -> None:
        FIELDS.pack_into(self._file.mm, 0, self.physic_ts, self.logics_ts, self.index_ts,
                         self.physic_offset, self.index_file, self.index_synced)
        self._file.wrote = FILE_SIZE
        self._file.flushed = 0
        self._file.flush()

    def close(self) -> None:
        self._file.close()
