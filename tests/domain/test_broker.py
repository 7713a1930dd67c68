"""The broker domain over a real store and a real SQLite projection, with a manual clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.broker_config import BrokerRole
from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.log import GetStatus, PutStatus
from evq.domain.message import MAX_PROPERTIES_BYTES, Prop
from evq.domain.metadata import Table
from evq.domain.queues import MessageQueue
from evq.domain.topics import TopicConfig
from evq.meta.sql import SqlMetadataStore
from tests.domain.conftest import OpenBroker, close, msg, topic

# --- topics and groups ---------------------------------------------------------------------


def test_system_topics_exist_from_the_start(broker: Broker) -> None:
    topics = broker.topics()
    assert topics[tp.AUTO_CREATE_TOPIC].perm == tp.PERM_RW | tp.PERM_INHERIT
    assert topics[tp.AUTO_CREATE_TOPIC].write_queue_nums == 8
    assert topics[tp.SCHEDULE_TOPIC].read_queue_nums == 18
    assert {tp.TRANS_HALF_TOPIC, tp.TRANS_OP_HALF_TOPIC} <= topics.keys()


@pytest.mark.parametrize("name", ["", " ", "a b", "x" * 128, "t/1", "中文"])
def test_bad_topic_names_are_refused(broker: Broker, name: str) -> None:
    with pytest.raises(BrokerError) as e:
        topic(broker, name)
    assert e.value.code is ResponseCode.SYSTEM_ERROR


def test_topic_names_may_use_every_allowed_character(broker: Broker) -> None:
    assert topic(broker, "%|aZ09_-" + "x" * 119).topic_name.startswith("%|")


def test_system_topics_cannot_be_created_or_sent_to(broker: Broker) -> None:
    with pytest.raises(BrokerError):
        topic(broker, tp.SCHEDULE_TOPIC)
    for name in (tp.SCHEDULE_TOPIC, tp.TRANS_HALF_TOPIC, tp.META_TOPIC):
        with pytest.raises(BrokerError) as e:
            broker.put([msg(name)])
        assert e.value.code is ResponseCode.NO_PERMISSION
        assert "forbidden" in e.value.remark


def test_unknown_topic_is_auto_created_from_tbw102(broker: Broker) -> None:
    r = broker.put([msg("NEW", queue_id=-1)], default_topic_queue_nums=4)
    assert r.ok
    created = broker.topic("NEW")
    assert created is not None
    assert (created.write_queue_nums, created.perm) == (4, tp.PERM_RW)


def test_auto_create_off_answers_topic_not_exist(open_broker: OpenBroker) -> None:
    b = open_broker(auto_create_topic_enable=False)
    with pytest.raises(BrokerError) as e:
        b.put([msg("NEW")])
    assert e.value.code is ResponseCode.TOPIC_NOT_EXIST


def test_delete_topic(broker: Broker) -> None:
    topic(broker)
    broker.put([msg("T")])
    broker.commit_offset("g", "T", 0, 1)
    broker.snapshot_offsets()
    broker.delete_topic("T")
    assert broker.topic("T") is None
    with pytest.raises(BrokerError) as e:
        broker.delete_topic("T")
    assert e.value.code is ResponseCode.TOPIC_NOT_EXIST


def test_group_config_round_trips_and_auto_creates(broker: Broker) -> None:
    cfg = SubscriptionGroupConfig(group_name="G", retry_max_times=3, broker_id=1,
                                  which_broker_when_consume_slowly=2)
    broker.create_group(cfg)
    assert broker.group("G") == cfg
    assert broker.ensure_group("other").retry_max_times == 16
    broker.delete_group("G")
    assert broker.group("G") is None


# --- put -----------------------------------------------------------------------------------


def test_put_answers_offsets_and_msg_ids(broker: Broker) -> None:
    topic(broker)
    r1 = broker.put([msg("T", queue_id=2)])
    r2 = broker.put([msg("T", queue_id=2)])
    assert (r1.queue_id, r1.queue_offset, r2.queue_offset) == (2, 0, 1)
    assert len(r1.msg_id) == 32
    stored = broker.view_by_offset(r1.appended[0].physical_offset)
    assert stored.properties[Prop.CLUSTER] == "DefaultCluster"


def test_batch_put_takes_consecutive_offsets(broker: Broker) -> None:
    topic(broker)
    r = broker.put([msg("T", bytes([i])) for i in range(5)])
    assert [a.queue_offset for a in r.appended] == [0, 1, 2, 3, 4]
    assert r.msg_id.count(",") == 4
    with pytest.raises(BrokerError) as e:
        broker.put([msg("T"), msg("T", DELAY="2")])
    assert e.value.code is ResponseCode.MESSAGE_ILLEGAL


def test_oversize_body_and_bad_queue_are_refused(open_broker: OpenBroker) -> None:
    b = open_broker(max_message_size=100)
    topic(b)
    with pytest.raises(BrokerError) as e:
        b.put([msg("T", b"x" * 101)])
    assert e.value.code is ResponseCode.MESSAGE_ILLEGAL
    with pytest.raises(BrokerError) as e:
        b.put([msg("T", queue_id=4)])
    assert e.value.code is ResponseCode.SYSTEM_ERROR
    assert b.put([msg("T", b"x" * 100)]).ok


def test_properties_are_measured_as_stored_with_what_routing_adds(broker: Broker) -> None:
    """The limit applies to the stored properties: ones that fit only until the broker adds
    CLUSTER are refused as MESSAGE_ILLEGAL, as oversize ones are, and nothing is stored (a
    record error escaped the put before)."""
    topic(broker)
    cluster = f"{Prop.CLUSTER}\x01{broker.config.broker_cluster_name}\x02"
    room = MAX_PROPERTIES_BYTES - len("k\x01\x02")
    fits = msg("T", k="v" * (room - len(cluster)))
    assert broker.put([fits]).ok
    just_over = msg("T", k="v" * (room - len(cluster) + 1))
    for batch in ([just_over], [msg("T"), just_over], [msg("T", k="v" * (room + 1))]):
        with pytest.raises(BrokerError) as e:
            broker.put(batch)
        assert e.value.code is ResponseCode.MESSAGE_ILLEGAL
        assert "properties exceed" in e.value.remark
    assert broker.log.bounds("T", 0) == (0, 1)


def test_write_permission_of_topic_and_broker(open_broker: OpenBroker) -> None:
    b = open_broker()
    b.create_topic(TopicConfig(topic_name="RO", read_queue_nums=1, write_queue_nums=1,
                               perm=tp.PERM_READ))
    with pytest.raises(BrokerError) as e:
        b.put([msg("RO")])
    assert e.value.code is ResponseCode.NO_PERMISSION
    close(b)
    b = open_broker(broker_permission=tp.PERM_READ)
    with pytest.raises(BrokerError) as e:
        b.put([msg("RO")])
    assert e.value.code is ResponseCode.NO_PERMISSION


def test_a_slave_refuses_sends(open_broker: OpenBroker) -> None:
    close(open_broker())  # the master created the system topics
    b = open_broker(broker_role=BrokerRole.SLAVE)
    with pytest.raises(BrokerError) as e:
        b.put([msg("T")])
    assert e.value.code is ResponseCode.SERVICE_NOT_AVAILABLE


# --- pull ----------------------------------------------------------------------------------


def test_pull_statuses_codes_and_next_offsets(broker: Broker) -> None:
    topic(broker)
    r = broker.pull("g", "T", 0, 0)
    assert (r.code, r.status, r.next_begin_offset) == (
        ResponseCode.PULL_NOT_FOUND, GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    r = broker.pull("g", "T", 0, 5)
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_OFFSET_MOVED, 0)
    broker.put([msg("T", bytes([i])) for i in range(3)])
    r = broker.pull("g", "T", 0, 0, max_count=2)
    assert (r.code, r.next_begin_offset, r.min_offset, r.max_offset) == (
        ResponseCode.SUCCESS, 2, 0, 3)
    assert [m.body for m in r.messages()] == [b"\0", b"\1"]
    r = broker.pull("g", "T", 0, 3)
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_NOT_FOUND, 3)
    r = broker.pull("g", "T", 0, 9)  # RocketMQ: back to the min offset while it is still 0
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_OFFSET_MOVED, 0)


def test_pull_prechecks(broker: Broker) -> None:
    with pytest.raises(BrokerError) as e:
        broker.pull("g", "NOPE", 0, 0)
    assert e.value.code is ResponseCode.TOPIC_NOT_EXIST
    topic(broker)
    with pytest.raises(BrokerError) as e:
        broker.pull("g", "T", 4, 0)
    assert e.value.code is ResponseCode.SYSTEM_ERROR
    broker.create_group(SubscriptionGroupConfig(group_name="off", consume_enable=False))
    with pytest.raises(BrokerError) as e:
        broker.pull("off", "T", 0, 0)
    assert e.value.code is ResponseCode.NO_PERMISSION


def test_pull_commits_the_offset_it_carries(broker: Broker) -> None:
    topic(broker)
    broker.put([msg("T")])
    broker.pull("g", "T", 0, 1, commit_offset=1)
    assert broker.query_offset("g", "T", 0) == 1
    assert broker.query_offset("g", "T", 1) == -1


def test_suggest_broker_follows_seed_000(open_broker: OpenBroker) -> None:
    b = open_broker(slave_read_enable=True, total_memory_bytes=1000,
                    access_message_in_memory_max_ratio=40)
    topic(b)
    b.create_group(SubscriptionGroupConfig(group_name="g", broker_id=0,
                                           which_broker_when_consume_slowly=1))
    for _ in range(10):
        b.put([msg("T", b"x" * 100)])
    behind = b.pull("g", "T", 0, 0, max_count=1)
    assert behind.suggest_which_broker_id == 1  # > 400 bytes of log after the pulled message
    close_enough = b.pull("g", "T", 0, 9)
    assert close_enough.suggest_which_broker_id == 0


def test_slave_without_slave_read_asks_to_retry_on_master(open_broker: OpenBroker) -> None:
    b = open_broker()
    topic(b)
    b.put([msg("T")])
    close(b)
    slave = open_broker(broker_role=BrokerRole.SLAVE)
    r = slave.pull("g", "T", 0, 0)
    assert (r.code, r.suggest_which_broker_id, r.records) == (
        ResponseCode.PULL_RETRY_IMMEDIATELY, 0, [])
    close(slave)
    readable = open_broker(broker_role=BrokerRole.SLAVE, slave_read_enable=True)
    assert readable.pull("g", "T", 0, 0).code is ResponseCode.SUCCESS


# --- offsets -------------------------------------------------------------------------------


def test_reset_by_time_moves_offsets_and_the_next_pull(broker: Broker, clock: ManualClock
                                                       ) -> None:
    topic(broker, queues=2)
    for i in range(6):
        broker.put([msg("T", bytes([i]), queue_id=i % 2)])
        clock.advance(10)
    t_mid = clock.now_ms() - 30_000  # messages 3, 4, 5 were stored at or after this
    broker.commit_offset("g", "T", 0, 3)
    broker.commit_offset("g", "T", 1, 3)
    moved = broker.reset_offset_by_time("g", "T", t_mid)
    assert moved == {0: 2, 1: 1}
    assert broker.query_offset("g", "T", 1) == 1
    stale = broker.pull("g", "T", 1, 3)  # a consumer that has not heard of the reset
    assert (stale.code, stale.next_begin_offset) == (ResponseCode.PULL_OFFSET_MOVED, 1)
    assert broker.pull("g", "T", 1, 1).code is ResponseCode.SUCCESS
    assert broker.pull("g", "T", 1, 3).code is ResponseCode.PULL_NOT_FOUND  # marker consumed


def test_reset_without_force_only_moves_back(broker: Broker, clock: ManualClock) -> None:
    topic(broker, queues=1)
    for _ in range(4):
        broker.put([msg("T")])
        clock.advance(1)
    broker.commit_offset("g", "T", 0, 1)
    assert broker.reset_offset_by_time("g", "T", clock.now_ms(), force=False) == {}
    assert broker.reset_offset_by_time("g", "T", 0, force=False) == {0: 0}


def test_consume_stats_report_lag(broker: Broker, clock: ManualClock) -> None:
    topic(broker, queues=2)
    for i in range(5):
        broker.put([msg("T", queue_id=i % 2)])
    broker.commit_offset("g", "T", 0, 1)
    broker.commit_offset("g", "T", 1, 2)
    stats = {s.queue_id: s for s in broker.consume_stats("g")}
    assert (stats[0].broker_offset, stats[0].lag) == (3, 2)
    assert (stats[1].lag, stats[1].last_timestamp) == (0, clock.now_ms())


def test_consume_stats_count_queues_never_committed_on(broker: Broker) -> None:
    topic(broker, queues=4)
    topic(broker, "Subscribed", queues=2)
    for i in range(8):
        broker.put([msg("T", queue_id=i % 4)])
    broker.commit_offset("g", "T", 0, 1)
    stats = broker.consume_stats("g", subscribed=["Subscribed"])
    assert [(s.topic, s.queue_id, s.consumer_offset) for s in stats] == [
        ("Subscribed", 0, 0), ("Subscribed", 1, 0),
        ("T", 0, 1), ("T", 1, 0), ("T", 2, 0), ("T", 3, 0)]
    assert sum(s.lag for s in stats) == 7


# --- event-sourced metadata ------------------------------------------------------------------


def test_config_and_offsets_survive_reopen(open_broker: OpenBroker) -> None:
    b = open_broker()
    topic(b, "KEEP", queues=3)
    b.create_group(SubscriptionGroupConfig(group_name="G", retry_max_times=5))
    b.commit_offset("G", "KEEP", 2, 7)
    close(b)
    b = open_broker()
    assert b.topic("KEEP") == TopicConfig(topic_name="KEEP", read_queue_nums=3,
                                          write_queue_nums=3)
    assert b.group("G").retry_max_times == 5  # type: ignore[union-attr]
    assert b.query_offset("G", "KEEP", 2) == 7


def test_projection_is_rebuilt_from_the_log(open_broker: OpenBroker, tmp_path: Path) -> None:
    b = open_broker()
    topic(b, "A")
    b.delete_topic("A")
    topic(b, "B", queues=2)
    b.commit_offset("g", "B", 1, 4)
    close(b)
    (tmp_path / "config" / "meta.sqlite").unlink()  # the projection is only a cache
    b = open_broker()
    assert b.topic("A") is None
    assert b.topic("B") is not None
    assert b.query_offset("g", "B", 1) == 4


def test_truncating_the_log_rolls_the_metadata_back(open_broker: OpenBroker,
                                                     tmp_path: Path) -> None:
    b = open_broker()
    topic(b, "KEPT")
    b.commit_offset("g", "KEPT", 0, 2)
    b.snapshot_offsets()
    common = b.log.max_physical_offset
    topic(b, "CUT")
    b.create_group(SubscriptionGroupConfig(group_name="CUT_GROUP"))
    b.commit_offset("g", "KEPT", 0, 9)
    b.snapshot_offsets()
    b.truncate_log(common)
    assert b.topic("CUT") is None and b.group("CUT_GROUP") is None
    assert b.topic("KEPT") is not None and b.query_offset("g", "KEPT", 0) == 2
    topic(b, "AFTER")  # events appended at the cut offsets are applied, not skipped
    assert b.topic("AFTER") is not None
    rows, _w = SqlMetadataStore.in_dir(tmp_path / "config").load()
    assert {r.key[0] for r in rows if r.table is Table.TOPICS} == set(b.topics())


def test_offsets_snapshot_on_the_clock(broker: Broker, clock: ManualClock, tmp_path: Path
                                       ) -> None:
    topic(broker)
    broker.commit_offset("g", "T", 0, 3)
    broker.tick()
    rows, _w = SqlMetadataStore.in_dir(tmp_path / "config").load()
    assert not [r for r in rows if r.key == ("g", "T", 0)]
    clock.advance(5)
    broker.tick()
    rows, _w = SqlMetadataStore.in_dir(tmp_path / "config").load()
    assert [r.value for r in rows if r.key == ("g", "T", 0)] == [3]


def test_applying_an_own_snapshot_never_moves_a_newer_commit_back(broker: Broker) -> None:
    topic(broker)
    broker.commit_offset("g", "T", 0, 3)
    broker.snapshot_offsets()
    broker.commit_offset("g", "T", 0, 9)
    broker.catch_up()
    assert broker.query_offset("g", "T", 0) == 9


# --- delay, timers, retry, DLQ: see test_schedule.py and test_retry.py ------------------------


def test_delayed_message_is_parked_in_the_schedule_topic(broker: Broker) -> None:
    topic(broker)
    r = broker.put([msg("T", DELAY="3")])
    assert (r.topic, r.queue_id) == (tp.SCHEDULE_TOPIC, 2)
    stored = broker.view_by_offset(r.appended[0].physical_offset)
    assert stored.properties[Prop.REAL_TOPIC] == "T"
    assert stored.properties[Prop.REAL_QID] == "0"
    assert broker.pull("g", "T", 0, 0).code is ResponseCode.PULL_NOT_FOUND


def test_delay_level_above_the_last_is_clamped(broker: Broker) -> None:
    topic(broker)
    assert broker.put([msg("T", DELAY="99")]).queue_id == 17


def test_send_reports_flush_timeouts_as_stored(broker: Broker) -> None:
    topic(broker)
    r = broker.send(msg("T"))
    assert r.status is PutStatus.PUT_OK and r.code is ResponseCode.SUCCESS


def test_orderly_queue_locks_expire_on_the_broker_clock(broker: Broker, clock: ManualClock
                                                        ) -> None:
    q = MessageQueue("T", "broker-a", 0)
    assert broker.locks.lock_batch("g", [q], "c1") == {q}
    assert broker.locks.lock_batch("g", [q], "c2") == set()
    clock.advance(61)
    assert broker.locks.lock_batch("g", [q], "c2") == {q}
