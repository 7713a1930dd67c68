"""Offline reads of a store directory: a store a broker still holds is waited for aloud, and
one that does not hold what the driver planned fails the read."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.backends.registry import open_log
from evq.spark import access
from evq.spark.access import StoreAccess


def test_a_locked_store_is_waited_for_aloud_then_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "LOCK_WAIT_NOTICE_S", 0.1)
    held = open_log("mmap", tmp_path / "store", background=False)  # as a running broker holds it
    try:
        with capture_logs() as logs, pytest.raises(OSError, match="a running broker holds it"):
            StoreAccess(str(tmp_path / "store"), "mmap", "broker-a", lock_wait_s=0.35)
    finally:
        held.close()
    notices = [e for e in logs if e["event"] == "waiting for a locked store"]
    assert len(notices) >= 2  # at once, then again while it goes on
    assert notices[0]["path"] == str(tmp_path / "store") and notices[0]["waited_s"] == 0


def test_a_store_that_ends_before_the_planned_offsets_fails_the_read(tmp_path: Path) -> None:
    """An executor that opens another store than the driver planned from (an empty directory
    at the same path on its machine) once returned no rows and no error."""
    open_log("mmap", tmp_path / "store", background=False).close()
    store = StoreAccess(str(tmp_path / "store"), "mmap", "broker-a", lock_wait_s=1)
    try:
        with pytest.raises(OSError, match=r"holds T:0 only up to offset 0, but the read was "
                                          r"planned up to 5; .* every machine"):
            list(store.read_blocks(("T", "broker-a", 0), 0, 5))
    finally:
        store.close()
