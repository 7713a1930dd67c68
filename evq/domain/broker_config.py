"""Broker settings, under RocketMQ's ``BrokerConfig`` names where one exists."""

from __future__ import annotations

import enum

import attrs

from evq.domain.delay import DEFAULT_DELAY_LEVELS
from evq.domain.message import Host
from evq.domain.topics import PERM_RW


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


@attrs.frozen(slots=True, kw_only=True)
class BrokerConfig:
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    broker_permission: int = PERM_RW
    store_host: Host = ("127.0.0.1", 10911)
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize: body limit
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    reject_transaction_message: bool = False
    transaction_timeout_ms: int = 6000  # transactionTimeOut
    transaction_check_max: int = 15  # transactionCheckMax
    transaction_check_interval_ms: int = 60_000  # transactionCheckInterval
    file_reserved_hours: float = 72  # halves older than this are dropped by the checker
    slave_read_enable: bool = False
    access_message_in_memory_max_ratio: int = 40
    total_memory_bytes: int = 8 * 1024**3  # `evq broker` sets the machine's physical memory
    offset_snapshot_interval_ms: int = 5000  # flushConsumerOffsetInterval
    delay_poll_interval_ms: int = 100
    lock_max_live_ms: int = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime
    sync_flush_timeout_ms: int = 5000

    @property
    def is_slave(self) -> bool:
        return self.broker_role is BrokerRole.SLAVE
