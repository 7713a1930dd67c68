"""The index head's own write-back interval, and what a SIGKILL between write-backs leaves.

A projection round writes consume queues and the checkpoint back every
``flush_consume_queue_interval_ms``, but the live index file's head only every
``flush_index_interval_ms`` (issue 18: its 20 MB slot table, rewritten every second, took the
broker's time slices).  :mod:`tests.backends.index_child` appends keyed messages, flushes
everything, appends more and is SIGKILLed once a projection round has covered the late
records: with a long interval the index file on disk still counts only the early entries and
the checkpoint keeps the index's older time, but it also counts the late entries the round put
on disk, and the reopen links them in again; with the checkpoint's count gone (a checkpoint
from before it had one) the reopen re-indexes the late records from the log instead (saying
how far it got as it goes).  With no interval the file counts them all.  Every way the
reopened store finds every key, early and late, exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.backends.mmapfile import store as store_module
from evq.backends.mmapfile.checkpoint import FIELDS as CHECKPOINT
from evq.backends.mmapfile.index_file import HEADER, IndexService
from evq.backends.mmapfile.store import MmapMessageLog
from evq.domain.hashing import index_key_hash
from tests.backends import index_child as child
from tests.processes import REPO_ROOT, python_env
from tests.waiting import wait_for

ALL_TIME = (0, 2**62)


def _checkpoint(path: Path) -> tuple[int, ...]:
    return CHECKPOINT.unpack_from((path / "checkpoint").read_bytes(), 0)


def _forget_synced_entries(path: Path) -> None:
    """Zero the checkpoint's last two fields, as a checkpoint written before they existed."""
    data = bytearray((path / "checkpoint").read_bytes())
    data[32:48] = bytes(16)
    (path / "checkpoint").write_bytes(data)


def _index_count_on_disk(path: Path) -> int:
    (index,) = (path / "index").iterdir()
    return HEADER.unpack_from(index.read_bytes(), 0)[5]


@pytest.mark.parametrize(("interval_ms", "relink"),
                         [(0, False), (3_600_000, True), (3_600_000, False)],
                         ids=["every round", "entries linked in again", "re-indexed from the log"])
def test_a_kill_between_index_write_backs_loses_no_key(
    tmp_path: Path, interval_ms: int, relink: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.index_child", str(store), str(interval_ms)],
        cwd=REPO_ROOT, env=python_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child prints it within a second, or dies
        assert line.startswith("WRITTEN "), f"the child said {line!r} (exit {proc.poll()})"
        last_late = int(line.split()[1])
        every = 1 + 2 * (child.EARLY + child.LATE)  # entry 0 is never used
        wait_for("a projection round covering the late records",
                 lambda: _checkpoint(store)[1] >= last_late
                 and (interval_ms == 0 or _checkpoint(store)[5] == every), within=30)
        _physic_ts, logics_ts, index_ts, _offset, index_file, synced = _checkpoint(store)
        if interval_ms == 0:
            assert _index_count_on_disk(store) == every
            assert index_ts == logics_ts
            assert (index_file, synced) == (0, 0)
        else:
            assert _index_count_on_disk(store) == 1 + 2 * child.EARLY
            assert index_ts < last_late <= logics_ts
            assert index_file == int(next((store / "index").iterdir()).name)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert (store / "abort").exists()  # the reopen below recovers from a crash
    if interval_ms and not relink:
        _forget_synced_entries(store)
    # Every record re-dispatched is reported (the broker says so every 2 s).
    monkeypatch.setattr(store_module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(store_module, "_PROGRESS_CHECK", 1)
    with capture_logs() as logs:
        log = MmapMessageLog.open(store, child.config(interval_ms))
    progress = [e for e in logs if e["event"] == "store_redispatch_progress"]
    relinked = [e for e in logs if e["event"] == "index_relinked"]
    if interval_ms and not relink:  # the late records' index entries came from the log again
        assert progress and progress[-1]["records"] >= child.LATE
        assert not relinked
    elif relink:
        assert [e["entries"] for e in relinked] == [2 * child.LATE]
        assert _index_count_on_disk(store) == every  # written back before anything else
    try:
        for name, count in (("early", child.EARLY), ("late", child.LATE)):
            for i in range(count):
                key = f"{name}-{i}"
                found = [log.query_keys(child.TOPIC, k, 8, *ALL_TIME).physical_offsets
                         for k in (key, "U" + key)]
                assert found[0] == found[1] and len(found[0]) == 1, f"{key}: {found}"
    finally:
        log.close()


def _kill(service: IndexService) -> None:
    """What SIGKILL leaves: the files as the page cache holds them, nothing flushed."""
    for f in service.files:
        f._mapped.release()
        f.file.close()


@pytest.mark.parametrize("synced", [True, False], ids=["linked in again", "dropped"])
def test_entries_past_a_head_with_holes_are_read(tmp_path: Path, synced: bool) -> None:
    """A file's head is reserved when it is made but written back only where slots changed,
    so on ext4 the first hole of an index file is among its slots, before any entry.  On
    reopening, the entries past the head's count must still be read: linked in again when
    the checkpoint counts them, else zeroed (and any slot naming one pointed back), which
    reading only up to the file's first hole skipped."""
    slots, entries = 200_000, 1_000  # 800 KB of slots: 60 keys leave most of its pages holes
    root = tmp_path / "index"
    service = IndexService(root, slots, entries)
    early = [((index_key_hash("T", f"e{i}"),), 100 * i) for i in range(30)]
    late = [((index_key_hash("T", f"l{i}"),), 100 * (30 + i)) for i in range(30)]
    service.put(early, 1_700_000_000_000)
    service.flush()
    service.put(late, 1_700_000_001_000)
    mark = service.sync_entries()
    assert mark is not None and mark[1] == 61
    (path,) = root.iterdir()
    _kill(service)
    head = 40 + 4 * slots
    with path.open("rb") as f:
        first_hole = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
    if first_hole >= head:
        pytest.skip(f"this file system shows no hole among the slots (first at {first_hole})")
    service = IndexService(root, slots, entries)
    service.load(mark if synced else (0, 0))
    try:
        (f,) = service.files
        assert f.count == (61 if synced else 31)
        on_disk = path.read_bytes()[head + 31 * 20 : head + 61 * 20]
        assert (on_disk.count(0) == len(on_disk)) is not synced
        found = service.lookup("T", "l7", 0, 2**62, 10)
        assert found == ([100 * 37] if synced else [])
    finally:
        service.close()
