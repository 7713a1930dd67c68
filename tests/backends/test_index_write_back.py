"""The index head's own write-back interval, and what a SIGKILL between write-backs leaves.

A projection round writes consume queues and the checkpoint back every
``flush_consume_queue_interval_ms``, but the live index file's head only every
``flush_index_interval_ms`` (issue 18: its 20 MB slot table, rewritten every second, took the
broker's time slices).  :mod:`tests.backends.index_child` appends keyed messages, flushes
everything, appends more and is SIGKILLed once a projection round has covered the late
records: with a long interval the index file on disk still counts only the early entries and
the checkpoint keeps the index's older time, and the reopen re-indexes the late records from
the log (saying how far it got as it goes); with none it counts them all.  Either way the
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
from evq.backends.mmapfile.index_file import HEADER
from evq.backends.mmapfile.store import MmapMessageLog
from tests.backends import index_child as child
from tests.processes import REPO_ROOT, python_env
from tests.waiting import wait_for

ALL_TIME = (0, 2**62)


def _checkpoint(path: Path) -> tuple[int, int, int, int]:
    return CHECKPOINT.unpack_from((path / "checkpoint").read_bytes(), 0)


def _index_count_on_disk(path: Path) -> int:
    (index,) = (path / "index").iterdir()
    return HEADER.unpack_from(index.read_bytes(), 0)[5]


@pytest.mark.parametrize("interval_ms", [0, 3_600_000])
def test_a_kill_between_index_write_backs_loses_no_key(
    tmp_path: Path, interval_ms: int, monkeypatch: pytest.MonkeyPatch,
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
        wait_for("a projection round covering the late records",
                 lambda: _checkpoint(store)[1] >= last_late, within=30)
        _physic_ts, logics_ts, index_ts, _offset = _checkpoint(store)
        entries = 2 * (child.EARLY + child.LATE) if interval_ms == 0 else 2 * child.EARLY
        assert _index_count_on_disk(store) == 1 + entries  # entry 0 is never used
        if interval_ms == 0:
            assert index_ts == logics_ts
        else:
            assert index_ts < last_late <= logics_ts
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert (store / "abort").exists()  # the reopen below recovers from a crash
    # Every record re-dispatched is reported (the broker says so every 2 s).
    monkeypatch.setattr(store_module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(store_module, "_PROGRESS_CHECK", 1)
    with capture_logs() as logs:
        log = MmapMessageLog.open(store, child.config(interval_ms))
    progress = [e for e in logs if e["event"] == "store_redispatch_progress"]
    if interval_ms:  # the late records' index entries came from the log again
        assert progress and progress[-1]["records"] >= child.LATE
    try:
        for name, count in (("early", child.EARLY), ("late", child.LATE)):
            for i in range(count):
                key = f"{name}-{i}"
                found = [log.query_keys(child.TOPIC, k, 8, *ALL_TIME).physical_offsets
                         for k in (key, "U" + key)]
                assert found[0] == found[1] and len(found[0]) == 1, f"{key}: {found}"
    finally:
        log.close()
