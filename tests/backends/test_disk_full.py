"""A full disk, for real: a 64 MiB tmpfs (mounted as root, skipped otherwise) filled with the
store's own messages and with a filler file.

Before the disk guard the mmap broker died of SIGBUS writing a page the file system could
not allocate (in-flight sends unanswered), and again at every restart until space was freed.
Here, on every backend that can promise it: puts are refused (SERVICE_NOT_AVAILABLE) with a
reason naming the disk, nothing acknowledged is lost, reads go on, puts resume once the
filler is deleted (no restart), and a store restarted on the full disk opens and serves
reads.  Two ways to fill it: past the warning level (the ratio refuses puts), and to
the last block with the warning level at 100% (only an allocation that finds no space stops
the writes, which before were SIGBUS).

RocksDB is filled only past the warning level: once its write-ahead log has met ENOSPC it
refuses every write until it is reopened ("Writer has previous error"), which the watermark
exists to prevent.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from evq.backends.config import StoreConfig
from evq.backends.registry import open_log
from evq.domain.log import FlushMode, MessageLog, PutStatus
from evq.domain.message import new_message
from evq.domain.record import iter_records, put_record

FS_MIB = 64
MIB = 1024 * 1024
WAIT_S = 15.0
BODY = 16 * 1024
CONFIG = StoreConfig(
    commitlog_segment_size=MIB, consume_queue_entries=4096, index_slots=1009,
    index_entries=8000, warm_segments=False, flush=FlushMode.SYNC_FLUSH,
    disk_check_interval_s=0.05,
)
TO_THE_LAST_BLOCK = attrs.evolve(CONFIG, disk_space_warning_level_ratio=1.0)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 64 MiB tmpfs; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a small file system to fill is a tmpfs mounted as root; not root here")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_MIB}m", "tmpfs", str(mnt)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill(fs: Path, leave: int = 0) -> Path:
    """Grow ``fs/filler`` until at most ``leave`` bytes of ``fs`` are free."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    chunk = bytes(MIB)
    try:
        while (free := shutil.disk_usage(fs).free) > leave:
            try:
                os.write(fd, chunk[: min(MIB, free - leave)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return filler


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT_S} s for {what}")
        time.sleep(0.02)


def put(log: MessageLog, i: int) -> tuple[PutStatus, bytes, int]:
    """Append message ``i`` and wait for it to be durable: (status, body, queue offset)."""
    body = i.to_bytes(4, "big") * (BODY // 4)
    (r,) = log.append([put_record(new_message("T", body, keys=f"k{i}", compress_over=None))])
    if r.status is PutStatus.PUT_OK:
        assert log.wait_durable(r.end_offset, 5.0)
    return r.status, body, r.queue_offset


def bodies(log: MessageLog) -> dict[int, bytes]:
    """Every readable message of queue T/0, by queue offset."""
    out: dict[int, bytes] = {}
    lo, hi = log.bounds("T", 0)
    offset = lo
    while offset < hi:
        r = log.read("T", 0, offset, max_count=64, max_bytes=64 * MIB)
        out.update((qo, m.body) for qo, m in zip(r.queue_offsets, iter_records(b"".join(
            bytes(v) for v in r.records)), strict=True))
        offset = r.next_offset
    return out


def put_until_refused(log: MessageLog, start: int = 0) -> dict[int, bytes]:
    """Acknowledged bodies by queue offset, put until the store refuses one."""
    acked: dict[int, bytes] = {}
    for i in range(start, start + 100_000):
        status, body, qo = put(log, i)
        if status is not PutStatus.PUT_OK:
            assert status is PutStatus.SERVICE_NOT_AVAILABLE
            return acked
        acked[qo] = body
    raise AssertionError("the disk never filled")


# --- one store, every backend ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["mmap", "lmdb", "rocks"])
def test_puts_are_refused_above_the_warning_level_and_resume_once_space_is_freed(
    small_fs: Path, backend: str,
) -> None:
    root = small_fs / "store"
    log = open_log(backend, root, CONFIG)
    try:
        acked = {qo: body for status, body, qo in (put(log, i) for i in range(20))
                 if status is PutStatus.PUT_OK}
        assert len(acked) == 20
        filler = fill(small_fs, leave=FS_MIB * MIB // 20)  # 95% used
        wait_until("puts refused", lambda: not log.disk_status.writable)
        status = log.disk_status
        assert status.used_ratio > 0.9 and status.refused.startswith("disk full: ")
        assert str(root) in status.refused and "above the warning level of 90%" in status.refused
        assert put(log, 20)[0] is PutStatus.SERVICE_NOT_AVAILABLE
        assert bodies(log) == acked
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        status_, body, qo = put(log, 21)
        assert status_ is PutStatus.PUT_OK
        assert bodies(log) == {**acked, qo: body}
    finally:
        log.close()


@pytest.mark.parametrize("backend", ["mmap", "lmdb"])
def test_a_disk_full_to_the_last_block_refuses_puts_and_a_restart_on_it_serves_reads(
    small_fs: Path, backend: str,
) -> None:
    root = small_fs / "store"
    log = open_log(backend, root, TO_THE_LAST_BLOCK)
    try:
        filler = fill(small_fs, leave=6 * MIB)
        acked = put_until_refused(log)
        assert len(acked) > 100  # the rest of the disk held messages
        assert "no space" in log.disk_status.refused
        assert put(log, 10**6)[0] is PutStatus.SERVICE_NOT_AVAILABLE
        assert bodies(log) == acked
    finally:
        log.close()
    fill(small_fs)  # whatever close left free, too
    log = open_log(backend, root, TO_THE_LAST_BLOCK)  # a restart on the full disk
    try:
        assert bodies(log) == acked
        before = log.max_physical_offset
        status, _, _ = put(log, 10**6 + 1)
        assert status is PutStatus.SERVICE_NOT_AVAILABLE and not log.disk_status.writable
        assert log.max_physical_offset == before
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        status, body, qo = put(log, 10**6 + 2)
        assert status is PutStatus.PUT_OK
        assert bodies(log) == {**acked, qo: body}
    finally:
        log.close()
