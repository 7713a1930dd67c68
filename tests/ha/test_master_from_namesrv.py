"""A slave started without ``--master-ha``, in real processes: the name server's answer to its
registration names its master's HA address, and it follows that master."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.ha.group import broker_group, produce_numbered, read_store, wait_caught_up

TOPIC = "HaLearned"


async def produce(namesrv: str, prefix: str, n: int) -> None:
    await produce_numbered(namesrv, TOPIC, prefix, n)


@pytest.mark.slow
def test_slave_finds_its_master_through_the_name_server(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        asyncio.run(produce(group.namesrv, "before", 50))
        group.start_slave(master_ha=False)
        assert wait_caught_up(group) > 0
        asyncio.run(produce(group.namesrv, "after", 50))
        wait_caught_up(group)
        assert group.master is not None and group.master.stop() == 0
        assert group.slave is not None and group.slave.stop() == 0, group.slave_log()
    assert read_store(tmp_path / "slave", TOPIC) == read_store(tmp_path / "master", TOPIC)
