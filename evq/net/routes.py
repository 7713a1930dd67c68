"""The name server's tables (RocketMQ ``RouteInfoManager``), pure: no sockets, no clock.

Brokers register every 30 s with their topic configs; the tables answer route lookups in the
JSON shape the clients parse (§2.3.1).  Callers pass the time in, so expiry (120 s without a
registration, scanned every 10 s) is tested by moving a number.

    cluster ──< broker name ──< broker id -> "ip:port"          (BrokerData)
    topic   ──< broker name -> read/write queue nums, perm       (QueueData, master's view)
    "ip:port" -> last registration time, HA address, channel     (BrokerLive)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from evq import logs
from evq.domain.topics import TopicConfig

log = logs.get_logger(__name__)

MASTER_ID: Final = 0
BROKER_EXPIRED_MS = 120_000  # BROKER_CHANNEL_EXPIRED_TIME
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


@attrs.define(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    addrs: dict[int, str] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}


@attrs.frozen(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, object]:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}


@attrs.define(slots=True)
class BrokerLive:
    last_update_ms: int
    ha_server_addr: str
    channel: object
    data_version: object = None


@attrs.frozen(slots=True)
class Registration:
    """What REGISTER_BROKER answers: a slave learns its master's address and HA address."""

    master_addr: str | None
    ha_server_addr: str | None
    order_topic_config: dict[str, str]


class RouteTable:
    def __init__(self) -> None:
        self.brokers: dict[str, BrokerData] = {}  # broker name ->
        self.clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self.topics: dict[str, dict[str, QueueData]] = {}  # topic -> broker name ->
        self.live: dict[str, BrokerLive] = {}  # broker addr ->
        self.kv: dict[str, dict[str, str]] = {}  # namespace -> key -> value

    # --- brokers --------------------------------------------------------------------------

    def register(
        self, *, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
        ha_server_addr: str, topics: Iterable[TopicConfig], now_ms: int,
        channel: object = None,
    ) -> Registration:
        self.clusters.setdefault(cluster, set()).add(broker_name)
        data = self.brokers.setdefault(broker_name, BrokerData(cluster, broker_name))
        for other_id, addr in list(data.addrs.items()):
            if addr == broker_addr and other_id != broker_id:  # a slave became master (or back)
                del data.addrs[other_id]
        first = broker_addr not in self.live
        data.addrs[broker_id] = broker_addr
        if broker_id == MASTER_ID:
            for t in topics:
                self.topics.setdefault(t.topic_name, {})[broker_name] = QueueData(
                    broker_name, t.read_queue_nums, t.write_queue_nums, t.perm,
                    t.topic_sys_flag)
        self.live[broker_addr] = BrokerLive(now_ms, ha_server_addr, channel)
        if first:
            log.info("broker_registered", cluster=cluster, broker=broker_name, id=broker_id,
                     addr=broker_addr)
        master = data.addrs.get(MASTER_ID)
        if broker_id != MASTER_ID and master is not None and master in self.live:
            return Registration(master, self.live[master].ha_server_addr, self.order_topics())
        return Registration(None, None, self.order_topics())

    def unregister(self, *, cluster: str, broker_name: str, broker_addr: str,
                   broker_id: int) -> None:
        self.live.pop(broker_addr, None)
        data = self.brokers.get(broker_name)
        if data is None or data.addrs.get(broker_id) != broker_addr:
            return
        self._drop(broker_name, broker_id)
        log.info("broker_unregistered", broker=broker_name, id=broker_id, addr=broker_addr)

    def expire(self, now_ms: int, max_silence_ms: int = BROKER_EXPIRED_MS) -> list[str]:
        """Drop brokers whose last registration is older than ``max_silence_ms``."""
        gone = [a for a, live in self.live.items() if now_ms - live.last_update_ms > max_silence_ms]
        for addr in gone:
            self._drop_addr(addr)
            log.warning("broker_expired", addr=addr)
        return gone

    def channel_closed(self, channel: object) -> list[str]:
        gone = [a for a, live in self.live.items() if live.channel is channel]
        for addr in gone:
            self._drop_addr(addr)
        return gone

    def _drop_addr(self, addr: str) -> None:
        self.live.pop(addr, None)
        for data in list(self.brokers.values()):
            for broker_id, a in list(data.addrs.items()):
                if a == addr:
                    self._drop(data.broker_name, broker_id)

    def _drop(self, broker_name: str, broker_id: int) -> None:
        """Remove one address; a broker name left without addresses takes its queue data,
        the topics left without queue data, and a cluster left empty with it."""
        data = self.brokers[broker_name]
        data.addrs.pop(broker_id, None)
        if data.addrs:
            return
        del self.brokers[broker_name]
        names = self.clusters.get(data.cluster, set())
        names.discard(broker_name)
        if not names:
            self.clusters.pop(data.cluster, None)
        for topic in list(self.topics):
            self.topics[topic].pop(broker_name, None)
            if not self.topics[topic]:
                del self.topics[topic]

    # --- lookups ----------------------------------------------------------------------------

    def route(self, topic: str) -> dict[str, object] | None:
        """TopicRouteData for ``topic``; None unless it has queue data and a broker."""
        queues = self.topics.get(topic)
        if not queues:
            return None
        brokers = [self.brokers[name] for name in sorted(queues) if name in self.brokers]
        if not brokers:
            return None
        route: dict[str, object] = {
            "brokerDatas": [b.to_json() for b in brokers],
            "filterServerTable": {},
            "queueDatas": [queues[name].to_json() for name in sorted(queues)],
        }
        order_conf = self.kv.get(ORDER_TOPIC_CONFIG, {}).get(topic)
        if order_conf:
            route["orderTopicConf"] = order_conf
        return route

    def cluster_info(self) -> dict[str, object]:
        return {
            "brokerAddrTable": {n: b.to_json() for n, b in sorted(self.brokers.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.clusters.items())},
        }

    def topic_list(self) -> list[str]:
        return sorted(self.topics)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """Topics with queues on a broker of ``cluster`` (none for an unknown cluster)."""
        names = self.clusters.get(cluster, set())
        return sorted(t for t, queues in self.topics.items() if not names.isdisjoint(queues))

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        if cluster is None:
            self.topics.pop(topic, None)
            return
        for name in self.clusters.get(cluster, set()):
            self.topics.get(topic, {}).pop(name, None)
        if not self.topics.get(topic, True):
            del self.topics[topic]

    # --- KV config ----------------------------------------------------------------------------

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        self.kv.setdefault(namespace, {})[key] = value

    def get_kv(self, namespace: str, key: str) -> str | None:
        return self.kv.get(namespace, {}).get(key)

    def delete_kv(self, namespace: str, key: str) -> None:
        self.kv.get(namespace, {}).pop(key, None)

    def kv_list(self, namespace: str) -> Mapping[str, str] | None:
        return self.kv.get(namespace)

    def order_topics(self) -> dict[str, str]:
        return dict(self.kv.get(ORDER_TOPIC_CONFIG, {}))
