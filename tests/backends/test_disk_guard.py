"""The disk guard: RocketMQ's disk watermarks as pure rules, and every backend refusing puts
(never raising, never storing half) while reads go on.

A real full disk is in ``test_disk_full.py`` (a small tmpfs, as root); here the warning level
is set below what the disk already uses, which every machine can do.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from evq.backends import disk, rules
from evq.backends.config import StoreConfig
from evq.domain.log import GetStatus, MessageLog, PutStatus
from evq.domain.record import put_record
from tests.backends.test_store import append, message, read_all

OpenLog = Callable[..., MessageLog]
NOW_MS = 1_700_000_000_000
NEVER = "99"  # deleteWhen at an hour that never comes: only disk use makes cleaning due


# --- the rules, pure ---------------------------------------------------------------------------


def test_puts_are_refused_strictly_above_the_warning_level() -> None:
    config = StoreConfig()
    assert config.disk_space_warning_level_ratio == 0.90
    assert disk.ratio_refusal(config, 0.5, Path("/data")) == ""
    assert disk.ratio_refusal(config, 0.90, Path("/data")) == ""
    reason = disk.ratio_refusal(config, 0.9134, Path("/data/store"))
    assert reason.startswith("disk full: ")
    assert "/data/store" in reason and "91.3%" in reason and "90%" in reason


def test_cleaning_by_disk_use_follows_rocketmqs_watermarks() -> None:
    config = StoreConfig(delete_when=NEVER)
    assert (config.disk_max_used_space_ratio, config.disk_space_clean_forcibly_ratio) == (75, 0.85)
    assert rules.clean_due(config, NOW_MS, 0.70) == (False, False)
    assert rules.clean_due(config, NOW_MS, 0.76) == (True, False)  # expired files go early
    assert rules.clean_due(config, NOW_MS, 0.86) == (True, True)  # the oldest go too
    lower = StoreConfig(delete_when=NEVER, disk_max_used_space_ratio=50)
    assert rules.clean_due(lower, NOW_MS, 0.60) == (True, False)


def test_a_write_failed_for_space_when_it_says_so_or_the_disk_is_nearly_full() -> None:
    enospc = OSError(errno.ENOSPC, "No space left on device")
    wrapped = RuntimeError("mdb_txn_commit failed")
    wrapped.__cause__ = enospc
    assert disk.no_space(enospc) and disk.no_space(wrapped)
    assert disk.no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk.no_space(OSError(errno.EIO, "Input/output error"))
    eio = RuntimeError("mdb_txn_commit: Input/output error")  # how LMDB reports ENOSPC
    assert disk.failed_for_space(eio, need=100_000, free=4096)
    assert not disk.failed_for_space(eio, need=100_000, free=1 << 30)
    assert disk.failed_for_space(wrapped, need=100_000, free=1 << 30)


@pytest.mark.parametrize("bad", [
    {"disk_max_used_space_ratio": 0}, {"disk_max_used_space_ratio": 101},
    {"disk_space_warning_level_ratio": 0.0}, {"disk_space_clean_forcibly_ratio": 1.5},
    {"disk_check_interval_s": 0.0},
])
def test_watermarks_out_of_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="disk"):
        StoreConfig(**bad)  # type: ignore[arg-type]


# --- every backend ---------------------------------------------------------------------------


def test_above_the_warning_level_every_put_is_refused_and_reads_go_on(
    open_log: OpenLog, tmp_path: Path,
) -> None:
    log = open_log()
    kept = append(log, message("T", b"before"), message("T", b"kept"))
    end = log.max_physical_offset
    assert log.disk_status.writable and 0 < log.disk_status.used_ratio < 1
    log.close()
    # Any disk holding this store uses more than a billionth of itself.
    log = open_log(disk_space_warning_level_ratio=1e-9)
    status = log.disk_status
    assert not status.writable and status.path == str(tmp_path / "store")
    assert status.refused.startswith("disk full: ") and str(tmp_path / "store") in status.refused
    results = log.append([put_record(message("T", b"refused")), put_record(message("U", b"x"))])
    assert [r.status for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2
    assert [r.physical_offset for r in results] == [-1, -1]
    assert log.max_physical_offset == end and log.bounds("U", 0) == (0, 0)
    assert [qo for qo, _ in read_all(log, "T", 0)] == [r.queue_offset for r in kept]
    assert log.read("T", 0, 2).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert log.lookup(kept[1].physical_offset) is not None
