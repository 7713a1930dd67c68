"""A full disk, for real: a 64 MiB tmpfs (mounted as root, skipped otherwise) filled with the
store's own messages and with a filler file.

Before the disk guard the mmap broker died of SIGBUS writing a page the file system could
not allocate (in-flight sends unanswered), and again at every restart until space was freed.
Here, on every backend that can promise it: puts are refused (SERVICE_NOT_AVAILABLE) with a
reason naming the disk, nothing acknowledged is lost, reads go on, puts resume once the
filler is deleted (no restart), and a store or broker restarted on the full disk opens and
serves reads.  Two ways to fill it: past the warning level (the ratio refuses puts), and to
the last block with the warning level at 100% (only an allocation that finds no space stops
the writes, which before were SIGBUS).

The mmap store with the transient store pool is filled to the last block too, and has a
commit find no space (its reserved blocks taken back): the acknowledged records wait in the
pool buffer and are committed before puts resume.

RocksDB is filled only past the warning level: once its write-ahead log has met ENOSPC it
refuses every write until it is reopened ("Writer has previous error"), which the watermark
exists to prevent.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import gc
import json
import mmap
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

import evq
from evq.backends.config import StoreConfig
from evq.backends.registry import open_log
from evq.domain import topics as tp
from evq.domain.broker import Broker as BrokerCore
from evq.domain.broker_config import BrokerConfig
from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.log import FlushMode, MessageLog, PutStatus
from evq.domain.message import Message, Prop, new_message
from evq.domain.metadata import MemoryMetadataStore
from evq.domain.record import iter_records, put_record
from evq.embedded import Broker as EmbeddedBroker
from evq.net.codes import RequestCode
from evq.net.transport import RemotingClient
from tests.net.test_broker_server import call, send_fields
from tests.processes import running_broker, running_namesrv
from tests.waiting import wait_for

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
        gc.collect()  # a view of a closed store's mapping (in a traceback) keeps it mapped
        if subprocess.run(["umount", str(mnt)], check=False).returncode:
            # Still busy: a failed test's traceback holds a view.  Detach it all the same.
            subprocess.run(["umount", "--lazy", str(mnt)], check=True)


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


wait_until = functools.partial(wait_for, within=WAIT_S, every=0.02)


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


# --- the mmap store with the transient store pool ---------------------------------------------

# ASYNC_FLUSH (the pool's rule); commits and flushes only when a test calls flush(), or when the
# two buffers are both waiting (so what lies in a buffer at a given moment is the test's choice).
POOLED = attrs.evolve(
    TO_THE_LAST_BLOCK, flush=FlushMode.ASYNC_FLUSH, transient_store_pool_enable=True,
    transient_store_pool_size=2, commit_interval_ms=3_600_000,
    commit_thorough_interval_ms=3_600_000, flush_interval_ms=3_600_000,
    flush_thorough_interval_ms=3_600_000,
)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2


def punch_hole(path: Path, start: int, end: int) -> None:
    """Give the file system back the blocks of ``path``'s ``[start, end)``, as a file system
    that takes blocks for its own bookkeeping on write needs some after all."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(path, os.O_RDWR)
    try:
        rc = libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start)
        assert rc == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)


def test_with_the_transient_store_pool_a_full_disk_refuses_puts_and_loses_nothing_acknowledged(
    small_fs: Path,
) -> None:
    """Blocks are reserved before a record goes into a pool buffer, so at the last block the
    put is refused and everything acknowledged commits; a restart on the full disk serves it
    and takes puts once there is room."""
    root = small_fs / "store"
    log = open_log("mmap", root, POOLED)
    try:
        assert log._pool is not None  # type: ignore[attr-defined]
        filler = fill(small_fs, leave=6 * MIB)
        acked = put_until_refused(log)
        assert len(acked) > 100
        assert "no space" in log.disk_status.refused
        assert put(log, 10**6)[0] is PutStatus.SERVICE_NOT_AVAILABLE
        log.flush()  # the commit lands on the blocks reserved for it
        assert bodies(log) == acked
    finally:
        log.close()
    fill(small_fs)
    log = open_log("mmap", root, POOLED)
    try:
        assert bodies(log) == acked
        assert put(log, 10**6 + 1)[0] is PutStatus.SERVICE_NOT_AVAILABLE
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        status, body, qo = put(log, 10**6 + 2)
        assert status is PutStatus.PUT_OK
        log.flush()
        assert bodies(log) == {**acked, qo: body}
    finally:
        log.close()


def test_with_the_transient_store_pool_a_commit_that_finds_no_space_is_retried_once_freed(
    small_fs: Path,
) -> None:
    """Acknowledged records wait in a pool buffer when their commit finds the disk full (their
    reserved blocks taken back here): puts are refused with the reason, what was committed
    stays readable, and once there is room the commit is retried before puts resume; a
    restart finds every acknowledged record."""
    root = small_fs / "store"
    log = open_log("mmap", root, POOLED)
    try:
        committed = {qo: body for status, body, qo in (put(log, i) for i in range(10))
                     if status is PutStatus.PUT_OK}
        log.flush()
        waiting = {qo: body for status, body, qo in (put(log, i) for i in range(10, 20))
                   if status is PutStatus.PUT_OK}
        assert len(committed) == len(waiting) == 10
        segment = log._log.files[-1]  # type: ignore[attr-defined]
        hole_from = segment.committed - segment.committed % mmap.PAGESIZE + mmap.PAGESIZE
        punch_hole(segment.path, hole_from, segment.allocated)
        filler = fill(small_fs)
        log.flush()  # the commit finds no space: nothing raised, the bytes stay buffered
        assert "no space" in log.disk_status.refused
        assert put(log, 20)[0] is PutStatus.SERVICE_NOT_AVAILABLE
        assert bodies(log) == committed
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        assert bodies(log) == {**committed, **waiting}  # committed before puts resumed
        status, body, qo = put(log, 21)
        assert status is PutStatus.PUT_OK
        acked = {**committed, **waiting, qo: body}
    finally:
        log.close()
    log = open_log("mmap", root, POOLED)
    try:
        assert bodies(log) == acked
    finally:
        log.close()


# --- the broker -------------------------------------------------------------------------------


def test_an_embedded_broker_starts_on_a_full_disk_and_takes_sends_once_it_is_freed(
    small_fs: Path,
) -> None:
    """A new broker's system topics cannot be recorded on a full disk: it starts without
    them, refuses sends with the reason, and records them once there is room."""
    filler = fill(small_fs, leave=FS_MIB * MIB // 50)  # 98% used
    with evq.Broker.open(small_fs / "data", store_config=CONFIG,
                         broker_config=BrokerConfig(auto_create_topic_enable=True)) as b:
        assert b.core.topic(tp.SCHEDULE_TOPIC) is None
        with pytest.raises(BrokerError) as refused:
            b.create_topic("T", 1)
        assert refused.value.code is ResponseCode.SERVICE_NOT_AVAILABLE
        remark = refused.value.remark
        assert "disk full" in remark and str(small_fs / "data") in remark
        filler.unlink()
        wait_until("the system topics", lambda: b.core.topic(tp.SCHEDULE_TOPIC) is not None)
        b.create_topic("T", 1)
        assert b.send("T", b"after").ok


def test_a_delivery_the_full_disk_refused_is_due_again_once_it_is_freed(small_fs: Path) -> None:
    """The delay and timer services moved their progress before storing what was due, so a
    delivery the store refused was skipped until a restart."""
    clock = ManualClock()
    log = open_log("mmap", small_fs / "store", CONFIG, clock=clock)
    b = EmbeddedBroker(BrokerCore(log, MemoryMetadataStore(), BrokerConfig(), clock=clock),
                       background=False)
    try:
        b.create_topic("T", 1)
        b.send("T", b"delayed", delay_level=1)  # 1 s
        b.send("T", b"timed", deliver_at_ms=clock.now_ms() + 1000)
        clock.advance(2)
        filler = fill(small_fs, leave=FS_MIB * MIB // 20)
        wait_until("puts refused", lambda: not log.disk_status.writable)
        for service in (b.delays, b.timers):
            with pytest.raises(BrokerError) as refused:
                service.run(clock.now_ms())
            assert refused.value.code is ResponseCode.SERVICE_NOT_AVAILABLE
        assert log.bounds("T", 0) == (0, 0)
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        clock.advance(1)
        assert b.delays.run(clock.now_ms()) == 1 and b.timers.run(clock.now_ms()) == 1
        assert sorted(body for body in bodies(log).values()) == [b"delayed", b"timed"]
    finally:
        b.close()


@attrs.define
class Producers:
    """The check-back port: the halves a producer group was asked about."""

    asked: list[int] = attrs.field(factory=list)

    def check_back(self, producer_group: str, half: Message) -> bool:
        self.asked.append(int(half.properties[Prop.TRAN_PREPARED_QUEUE_OFFSET]))
        return True


def test_a_transaction_the_full_disk_kept_from_ending_is_checked_once_it_is_freed(
    small_fs: Path,
) -> None:
    """An END_TRANSACTION whose records were refused counted as ended, and a check pass
    that could not re-put a half moved past it: either way the transaction was never
    asked about again (until a restart)."""
    clock = ManualClock()
    log = open_log("mmap", small_fs / "store", CONFIG, clock=clock)
    b = EmbeddedBroker(BrokerCore(log, MemoryMetadataStore(), BrokerConfig(), clock=clock),
                       background=False)
    producers = Producers()
    b.transactions.port = producers
    try:
        b.create_topic("T", 1)
        m = b.message("T", b"tx", properties={Prop.TRAN_MSG: "true", Prop.PGROUP: "PG"})
        (h,) = b.core.put([m]).appended
        filler = fill(small_fs, leave=FS_MIB * MIB // 20)
        wait_until("puts refused", lambda: not log.disk_status.writable)
        ended = b.transactions.end("PG", h.queue_offset, h.physical_offset, commit=True)
        assert ended is not None and ended.status is PutStatus.SERVICE_NOT_AVAILABLE
        clock.advance(3600)  # past the check immunity
        assert b.transactions.check(clock.now_ms()).waiting and producers.asked == []
        filler.unlink()
        wait_until("puts taken again", lambda: log.disk_status.writable)
        assert b.transactions.check(clock.now_ms()).checked == 1
        assert producers.asked == [h.queue_offset]
    finally:
        b.close()


async def _send_until_refused(port: int) -> tuple[dict[int, bytes], str]:
    """Acknowledged bodies by queue offset, sent until the broker refuses; and its remark."""
    acked: dict[int, bytes] = {}
    async with RemotingClient("127.0.0.1", port) as c:
        for i in range(100_000):
            body = i.to_bytes(4, "big") * (BODY // 4)
            r = await call(c, RequestCode.SEND_MESSAGE, send_fields("T", 0), body)
            if r.code != ResponseCode.SUCCESS:
                assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
                return acked, r.remark or ""
            acked[int(r.ext_fields["queueOffset"])] = body
    raise AssertionError("the disk never filled")


async def _read_back(port: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    async with RemotingClient("127.0.0.1", port) as c:
        while True:
            p = await call(c, RequestCode.PULL_MESSAGE, {
                "consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": len(out),
                "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
                "subscription": "*", "subVersion": 0})
            if p.code != ResponseCode.SUCCESS:
                return out
            out.update((m.queue_offset, m.body) for m in iter_records(p.body))


async def _refused_again(port: int) -> tuple[int, str, dict[str, str]]:
    """One more send's code and remark, and the runtime info."""
    async with RemotingClient("127.0.0.1", port) as c:
        r = await call(c, RequestCode.SEND_MESSAGE, send_fields("T", 0), b"after")
        info = await call(c, RequestCode.GET_BROKER_RUNTIME_INFO)
    return r.code, r.remark or "", json.loads(info.body)["table"]


def test_over_the_wire_a_full_disk_is_answered_service_not_available_and_the_broker_lives(
    small_fs: Path, tmp_path: Path,
) -> None:
    data = small_fs / "data"
    conf = tmp_path / "broker.toml"
    conf.write_text("\n".join([
        'flush = "SYNC_FLUSH"', "commitlog_segment_size = 1048576",
        "consume_queue_entries = 4096", "index_slots = 1009", "index_entries = 8000",
        "warm_segments = false", "disk_check_interval_s = 0.05",
        "disk_space_warning_level_ratio = 1.0",  # to the last block: no watermark to stop it
    ]) + "\n")
    with running_namesrv() as namesrv:
        with running_broker(namesrv, data, "--config", str(conf)) as broker:
            port = int(broker.addresses["broker"].rpartition(":")[2])
            filler = fill(small_fs, leave=6 * MIB)
            acked, remark = asyncio.run(_send_until_refused(port))
            assert len(acked) > 100
            assert remark.startswith("service not available now: disk full: ")
            assert str(data) in remark, remark
            assert broker.alive(), "the broker died on the full disk"
            code, remark, info = asyncio.run(_refused_again(port))
            assert code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk full" in remark
            assert info["evqPutsRefused"] == "true" and "disk full" in info["evqPutsRefusedReason"]
            assert float(info["commitLogDiskRatio"]) > 0.9
            assert asyncio.run(_read_back(port)) == acked
            assert broker.stop() == 0
        fill(small_fs)
        with running_broker(namesrv, data, "--config", str(conf)) as broker:  # on a full disk
            port = int(broker.addresses["broker"].rpartition(":")[2])
            assert asyncio.run(_read_back(port)) == acked
            code, remark, info = asyncio.run(_refused_again(port))
            assert code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk full" in remark
            filler.unlink()
            wait_until("sends taken again",
                       lambda: asyncio.run(_refused_again(port))[0] == ResponseCode.SUCCESS)
            assert broker.stop() == 0


def test_offsets_committed_on_a_full_disk_are_kept_until_they_can_be_written(
    small_fs: Path,
) -> None:
    """A snapshot the store refuses forgets nothing: the commits stay pending, are written
    once there is room, and survive a restart."""
    config = BrokerConfig(offset_snapshot_interval_ms=100)
    with evq.Broker.open(small_fs / "data", store_config=CONFIG, broker_config=config) as b:
        b.create_topic("T", 1)
        assert b.send("T", b"x").ok
        filler = fill(small_fs, leave=FS_MIB * MIB // 50)  # 98% used
        wait_until("puts refused", lambda: not b.core.log.disk_status.writable)
        b.core.commit_offset("g", "T", 0, 1)
        with pytest.raises(BrokerError) as refused:
            b.core.snapshot_offsets()
        assert refused.value.code is ResponseCode.SERVICE_NOT_AVAILABLE
        assert b.core.local_commits() == {("g", "T", 0): 1}  # still to be written
        filler.unlink()
        wait_until("the snapshot written", lambda: b.core.local_commits() == {})
    with evq.Broker.open(small_fs / "data", store_config=CONFIG, broker_config=config) as b:
        assert b.core.query_offset("g", "T", 0) == 1
