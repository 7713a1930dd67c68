"""Consumer offsets committed to a slave while its master was away: the slave keeps them
against older replicated values, the returned master takes those ahead of its own, and the
slave's pending commits end once the master's record of them replicates back."""

from __future__ import annotations

from pathlib import Path

from evq.backends.registry import open_log
from evq.domain.broker import Broker
from evq.domain.broker_config import BrokerConfig, BrokerRole
from evq.domain.clock import ManualClock
from evq.domain.topics import TopicConfig
from evq.meta.sql import SqlMetadataStore
from tests.conftest import SMALL

KEY = ("g", "T", 0)


def open_broker(root: Path, clock: ManualClock, role: BrokerRole) -> Broker:
    log = open_log("memory", root / "store", SMALL, clock=clock, background=False)
    config = BrokerConfig(broker_role=role, broker_id=1 if role is BrokerRole.SLAVE else 0)
    return Broker(log, SqlMetadataStore.in_dir(root / "config"), config, clock=clock)


def replicate(master: Broker, slave: Broker) -> None:
    while data := master.log.read_log(slave.log.max_physical_offset, 64 * 1024):
        slave.log.append_replicated(slave.log.max_physical_offset, data)
    slave.catch_up()


def commit(master: Broker, offset: int) -> None:
    master.commit_offset(*KEY, offset)
    master.snapshot_offsets()


def test_slave_commits_survive_older_replicated_offsets_and_reach_the_master(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    master = open_broker(tmp_path / "m", clock, BrokerRole.ASYNC_MASTER)
    slave = open_broker(tmp_path / "s", clock, BrokerRole.SLAVE)
    try:
        master.create_topic(TopicConfig(topic_name="T", read_queue_nums=1, write_queue_nums=1))
        commit(master, 5)
        replicate(master, slave)
        assert slave.query_offset(*KEY) == 5
        assert slave.local_commits() == {}

        slave.commit_offset(*KEY, 9)  # the master is down; consumers commit here
        assert slave.snapshot_offsets() == 0  # a slave records nothing itself
        commit(master, 7)  # an older commit the master made before it went down
        replicate(master, slave)
        assert slave.query_offset(*KEY) == 9
        assert slave.local_commits() == {KEY: 9}

        assert master.take_newer_offsets({KEY: 3}) == 0  # behind the master's own: ignored
        assert master.take_newer_offsets(slave.local_commits()) == 1
        master.snapshot_offsets()
        assert master.query_offset(*KEY) == 9
        replicate(master, slave)
        assert slave.local_commits() == {}

        commit(master, 12)  # from now on the slave follows the master again
        replicate(master, slave)
        assert slave.query_offset(*KEY) == 12
    finally:
        for b in (slave, master):
            b.close()
            b.log.close()
