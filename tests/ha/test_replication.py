"""Master and slave services on loopback, in one process, over real stores and sockets."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import attrs
import pytest

from evq.backends.registry import open_log
from evq.domain.clock import ManualClock
from evq.domain.log import MessageLog, PutStatus
from evq.domain.message import new_message
from evq.domain.record import put_record
from evq.ha.log_window import LogWindow
from evq.ha.master import HAMaster
from evq.ha.slave import Backoff, HASlave
from tests.conftest import SMALL

WAIT_S = 20.0


def fill(log: MessageLog, n: int, letter: bytes, size: int = 500) -> int:
    results = log.append([
        put_record(attrs.evolve(new_message("T", letter * size, keys=f"{letter!r}{i}",
                                            compress_over=None), queue_id=i % 4))
        for i in range(n)])
    return results[-1].end_offset


def raw(log: MessageLog) -> bytes:
    return LogWindow(log).read(log.min_physical_offset, log.max_physical_offset)


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body in a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not cond():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("slave_backend", ["mmap", "memory"])
@in_loop
async def test_empty_slave_follows_a_master_whose_first_segments_expired(
    tmp_path: Path, slave_backend: str
) -> None:
    clock = ManualClock()
    master_log = open_log("mmap", tmp_path / "m", SMALL, clock=clock, background=False)
    slave_log = open_log(slave_backend, tmp_path / "s", SMALL, clock=clock, background=False)
    fill(master_log, 300, b"a")
    master_log.expire(force=True)
    assert master_log.min_physical_offset > 0
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    slave = HASlave(slave_log, lambda: master.address)
    slave.start()
    try:
        await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
        assert slave_log.min_physical_offset == master_log.min_physical_offset
        assert raw(slave_log) == raw(master_log)
        end = fill(master_log, 20, b"b")
        assert await master.wait_replicated(end, WAIT_S) is PutStatus.PUT_OK
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()


@pytest.mark.parametrize("slave_backend", ["mmap", "lmdb", "memory"])
@in_loop
async def test_slave_on_any_backend_follows_the_master_and_acknowledges(
    tmp_path: Path, slave_backend: str
) -> None:
    clock = ManualClock()
    master_log = open_log("mmap", tmp_path / "m", SMALL, clock=clock, background=False)
    slave_log = open_log(slave_backend, tmp_path / "s", SMALL, clock=clock, background=False)
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    assert await master.wait_replicated(0, 1.0) is PutStatus.SLAVE_NOT_AVAILABLE
    fill(master_log, 300, b"a")  # several segments before the slave connects
    slave = HASlave(slave_log, lambda: master.address)
    slave.start()
    try:
        await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
        end = fill(master_log, 50, b"b")
        assert await master.wait_replicated(end, WAIT_S) is PutStatus.PUT_OK
        assert slave_log.max_physical_offset >= end
        assert raw(slave_log) == raw(master_log)
        assert slave_log.queues() == master_log.queues()
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()


@in_loop
async def test_sync_wait_times_out_when_the_slave_is_gone(tmp_path: Path) -> None:
    clock = ManualClock()
    master_log = open_log("memory", tmp_path / "m", SMALL, clock=clock, background=False)
    slave_log = open_log("memory", tmp_path / "s", SMALL, clock=clock, background=False)
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    slave = HASlave(slave_log, lambda: master.address)
    slave.start()
    try:
        await until(lambda: bool(master.slave_offsets))
        await slave.shutdown()
        await until(lambda: not master.slave_offsets)
        end = fill(master_log, 1, b"x")
        assert await master.wait_replicated(end, 0.2) is PutStatus.SLAVE_NOT_AVAILABLE
    finally:
        await master.shutdown()
        slave_log.close()
        master_log.close()


@in_loop
async def test_divergent_slave_is_cut_to_the_common_prefix_on_connect(tmp_path: Path) -> None:
    """The slave kept bytes its master lost and the master wrote other records there."""
    clock = ManualClock()
    master_log = open_log("mmap", tmp_path / "m", SMALL, clock=clock, background=False)
    slave_log = open_log("mmap", tmp_path / "s", SMALL, clock=clock, background=False)
    fill(master_log, 200, b"p")
    fill(slave_log, 200, b"p")
    common = master_log.max_physical_offset
    fill(slave_log, 30, b"s", size=700)
    fill(master_log, 10, b"m", size=300)
    assert slave_log.max_physical_offset > master_log.max_physical_offset
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    slave = HASlave(slave_log, lambda: master.address, backoff=Backoff(first=0.01))
    slave.start()
    try:
        await until(lambda: slave.streaming
                    and slave_log.max_physical_offset == master_log.max_physical_offset)
        assert raw(slave_log) == raw(master_log)
        assert raw(slave_log)[:common] == raw(master_log)[:common]
        assert slave_log.query_keys("T", "b's'3", 10, 0, 2**62).records == []
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()


@in_loop
async def test_slave_reconnects_after_the_master_restarts(tmp_path: Path) -> None:
    clock = ManualClock()
    master_log = open_log("mmap", tmp_path / "m", SMALL, clock=clock, background=False)
    slave_log = open_log("memory", tmp_path / "s", SMALL, clock=clock, background=False)
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    port = master.port
    slave = HASlave(slave_log, lambda: f"127.0.0.1:{port}", backoff=Backoff(first=0.01))
    slave.start()
    try:
        fill(master_log, 20, b"a")
        await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
        await master.shutdown()
        fill(master_log, 20, b"b")
        master = HAMaster(master_log, "127.0.0.1", port)
        await master.start()
        await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
        assert raw(slave_log) == raw(master_log)
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()


class CountingMaster(HAMaster):
    """A master that counts the store's calls of its dispatch listener."""

    calls = 0

    def _on_dispatch(self, batch: object) -> None:
        self.calls += 1
        super()._on_dispatch(batch)


@in_loop
async def test_the_master_hears_the_store_only_while_a_slave_is_connected(
    tmp_path: Path
) -> None:
    """With no slave, an append costs the master no call; with one, each append wakes its
    writer (the heartbeat is far off here: only the wake-up can bring the bytes), also an
    append from another thread; once the slave is gone, no call again."""
    master_log = open_log("mmap", tmp_path / "m", SMALL, background=False)
    slave_log = open_log("mmap", tmp_path / "s", SMALL, background=False)
    master = CountingMaster(master_log, "127.0.0.1", 0, heartbeat_s=600.0)
    await master.start()
    slave = HASlave(slave_log, lambda: master.address)
    try:
        fill(master_log, 10, b"a")
        assert master.calls == 0
        slave.start()
        await until(lambda: master.slave_offsets == [master_log.max_physical_offset])
        for letter in (b"b", b"c"):
            calls = master.calls
            end = await asyncio.to_thread(fill, master_log, 5, letter)
            async with asyncio.timeout(5.0):
                while slave_log.max_physical_offset < end:
                    await asyncio.sleep(0.01)
            assert master.calls == calls + 1
        await slave.shutdown()
        await until(lambda: not master.slave_offsets)
        calls = master.calls
        fill(master_log, 5, b"d")
        assert master.calls == calls
        assert raw(slave_log) == raw(master_log)[: slave_log.max_physical_offset]
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()
