"""A slave whose log forked from its master's, in real processes: the copy of a master's
store that went on taking sends (and metadata: a topic, a group's offsets) on its own is
started as the master's slave, and ends up with the master's log byte for byte (its own tail
cut off at the common prefix) and the master's metadata (the fork's forgotten)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tests.ha.group import (
    broker_group,
    commit_offset,
    produce_numbered,
    read_store,
    same_admin_answers,
    until,
    wait_caught_up,
)
from tests.processes import running_evq, wait_registered

TOPIC = "HaFork"
FORK_ONLY = "HaForkOnly"
READERS = "ha-fork-readers"


async def produce(namesrv: str, prefix: str, n: int, topic: str = TOPIC) -> None:
    await produce_numbered(namesrv, topic, prefix, n, repeat=20)


@pytest.mark.slow
def test_forked_slave_is_cut_back_and_follows_its_master(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        asyncio.run(produce(group.namesrv, "common", 100))
        asyncio.run(commit_offset(group.master_addr, READERS, TOPIC, 0, 5))
        assert group.master is not None and group.master.stop() == 0
        shutil.copytree(tmp_path / "master", tmp_path / "slave")
        # The copy takes sends and metadata of its own as a master of another group...
        with running_evq("--log-level", "warning", "broker", "--config", str(group.config),
                         "--port", "0", "--namesrv", group.namesrv, "--broker-name", "fork",
                         "--data", str(tmp_path / "slave"), servers=1) as fork:
            fork_addr = fork.addresses["broker"]
            wait_registered(group.namesrv, fork_addr)
            asyncio.run(produce(group.namesrv, "fork", 150))
            asyncio.run(produce(group.namesrv, "fork-only", 5, FORK_ONLY))
            asyncio.run(commit_offset(fork_addr, READERS, TOPIC, 0, 20))
            asyncio.run(commit_offset(fork_addr, READERS, FORK_ONLY, 0, 3))
            assert fork.stop() == 0
        # ...while the real master takes others at the same offsets.
        group.start_master("ASYNC_MASTER")
        asyncio.run(produce(group.namesrv, "master", 60))
        asyncio.run(commit_offset(group.master_addr, READERS, TOPIC, 1, 7))
        forked = read_store(tmp_path / "slave", TOPIC)
        group.start_slave()
        wait_caught_up(group)
        asyncio.run(until(lambda: same_admin_answers(group, f"{TOPIC}@{READERS}"),
                          "the slave to answer the master's metadata"))
        assert group.master.stop() == 0
        assert group.slave is not None and group.slave.stop() == 0, group.slave_log()
    master = read_store(tmp_path / "master", TOPIC)
    slave = read_store(tmp_path / "slave", TOPIC)
    assert len(forked.raw) > len(master.raw)  # the slave had bytes to drop, not only to add
    assert slave.raw == master.raw
    assert slave.queues == master.queues
