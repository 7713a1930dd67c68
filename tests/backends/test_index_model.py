"""The mmap store's key index against a plain model, driven by Hypothesis.

The index keeps the head (header and slots) of the files it writes in memory and writes it to
the files only at a flush (see :mod:`evq.backends.mmapfile.index_file`), so what a process
killed between flushes leaves differs from what it held: the entries put since are there, the
heads naming them are not.  The machine puts batches of keyed records, flushes, cuts the log
back (as recovery and an HA slave do) and kills the process at any point (closing every file
without a flush: the page cache keeps what was written, as after SIGKILL), then reopens the
directory and indexes again what the store's recovery would (every record past the index's
``end_phys``).  A round between write-backs puts the entries on disk and keeps what
``sync_entries`` returned, as the store's checkpoint does (until a flush or a cut, which the
store clears it at), and the reopen links those entries in again.  After each step every key
must be found at every offset the model holds for it, newest first, and nowhere else.  Seven
slots for four keys and twenty entries a file make chains share buckets and files roll often.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evq.backends.mmapfile.index_file import IndexService
from evq.domain.hashing import index_key_hash

KEYS = ["a", "b", "c", "d"]
SLOTS, ENTRIES = 7, 20
TS = 1_700_000_000_000
STEP = 100  # log bytes a record


def _items(records: list[tuple[int, tuple[str, ...]]]) -> list[tuple[tuple[int, ...], int]]:
    return [(tuple(index_key_hash("T", k) for k in keys), phys) for phys, keys in records]


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(prefix="evq-index-model-")
        self.root = Path(self._dir.name) / "index"
        self.log: list[tuple[int, tuple[str, ...]]] = []  # (log offset, keys), in log order
        self.next_phys = 0
        self.service = IndexService(self.root, SLOTS, ENTRIES)
        self.synced = (0, 0)  # the checkpoint's last two fields

    @rule(batch=st.lists(st.lists(st.sampled_from(KEYS), max_size=3).map(tuple), min_size=1,
                         max_size=6))
    def put(self, batch: list[tuple[str, ...]]) -> None:
        records = []
        for keys in batch:
            records.append((self.next_phys, keys))
            self.next_phys += STEP
        self.log += records
        self.service.put(_items([r for r in records if r[1]]), TS)

    @rule()
    def flush(self) -> None:
        self.service.flush()
        self.synced = (0, 0)

    @rule()
    def sync_entries(self) -> None:
        """A projection round between write-backs of the heads (a full one when it must)."""
        synced = self.service.sync_entries()
        if synced is None:
            self.flush()
        else:
            self.synced = synced

    @precondition(lambda self: bool(self.log))
    @rule(data=st.data())
    def cut_back(self, data: st.DataObject) -> None:
        """The log ends earlier from now on: what was indexed past the end goes."""
        keep = data.draw(st.integers(0, len(self.log) - 1), label="records kept")
        end = self.log[keep][0]
        self.log = self.log[:keep]
        self.next_phys = end
        self.service.truncate(end)
        self.synced = (0, 0)

    @rule()
    def kill(self) -> None:
        """SIGKILL: nothing more reaches the files; reopen and index what recovery would."""
        for f in self.service.files:
            f._mapped.release()
            f.file.close()
        self.service = IndexService(self.root, SLOTS, ENTRIES)
        self.service.load(self.synced)
        end = self.service.end_phys
        self.service.put(_items([r for r in self.log if r[0] > end and r[1]]), TS)

    @invariant()
    def every_key_is_found_where_the_log_has_it(self) -> None:
        for key in KEYS:
            expected = [phys for phys, keys in reversed(self.log) for k in keys if k == key]
            assert self.service.lookup("T", key, 0, TS + 1000, 10_000) == expected, key

    def teardown(self) -> None:
        self.service.close()
        self._dir.cleanup()


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
TestIndex = IndexMachine.TestCase
