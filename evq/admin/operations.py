"""The operator's requests, as one asyncio API: what ``evq admin`` runs and scripts can call.

Each operation is mqadmin's: it finds its brokers the way mqadmin does (a cluster's or a topic's
masters from the name server, or one ``-b`` address), sends the broker's admin request, and
returns plain attrs rows that :mod:`evq.admin.render` turns into tables or JSON.  Any refusal
raises :class:`AdminError` carrying the RocketMQ code and remark, so the CLI can say in one
line why it failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from evq.client.errors import BrokerRefused, ClientError, RouteNotFound
from evq.client.pulling import Subscription, parse_pull, pull_request
from evq.client.routes import BrokerPool, Routes, TopicRoute
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.config_json import from_json, to_json
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from evq.domain.record import decode, iter_records, parse_offset_msg_id
from evq.net import fastjson
from evq.net.codes import RequestCode
from evq.net.headers.admin import (
    CreateTopicRequest,
    DeleteSubscriptionGroupRequest,
    DeleteTopicRequest,
    GetConsumerConnectionListRequest,
    GetConsumeStatsRequest,
    GetTopicStatsInfoRequest,
    ResetOffsetRequest,
)
from evq.net.headers.namesrv import DeleteTopicFromNamesrvRequest
from evq.net.headers.queries import QueryMessageRequest, ViewMessageRequest
from evq.net.protocol import RemotingCommand
from evq.net.routes import MASTER_ID
from evq.net.security import ClientSecurity
from evq.net.transport import TransportError

TOOLS_GROUP: Final = "TOOLS_CONSUMER"
"""The group mqadmin pulls with when it only looks (it never commits)."""

Progress = Callable[[Iterable[Any], str], Iterable[Any]]
"""Wraps a loop over brokers or queues to show how far a long operation got."""


def _quiet(items: Iterable[Any], what: str) -> Iterable[Any]:
    return items


class AdminError(ClientError):
    """An admin operation that cannot be done: unknown topic, no broker, a broker's refusal."""


@attrs.frozen(slots=True, order=True)
class BrokerRow:
    """One broker as the name servers list it; rows sort by cluster, name, then id."""

    cluster: str
    broker_name: str
    broker_id: int
    addr: str


@attrs.frozen(slots=True)
class QueueStatus:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int


@attrs.frozen(slots=True)
class QueueProgress:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@attrs.frozen(slots=True)
class ResetRow:
    broker_name: str
    queue_id: int
    offset: int


class Admin:
    """``async with Admin("127.0.0.1:9876") as admin: await admin.topic_list()``.

    ``security`` signs every request: on an ACL-enabled cluster the admin operations need an
    admin account's credentials, and the name server's writes (topic deletion) too."""

    def __init__(self, namesrv: str, *, progress: Progress = _quiet,
                 security: ClientSecurity | None = None) -> None:
        self._routes = Routes(namesrv, security=security)
        self._pool = BrokerPool(security=security)
        self._progress = progress

    async def __aenter__(self) -> Admin:
        return self

    @property
    def pool(self) -> BrokerPool:
        """The broker connections, for callers that send their own requests."""
        return self._pool

    async def __aexit__(self, *exc_info: object) -> None:
        await self._pool.close()
        await self._routes.close()

    # -- clusters and brokers -------------------------------------------------------------------

    async def cluster_list(self) -> list[BrokerRow]:
        info = fastjson.loads((await self._namesrv(
            RequestCode.GET_BROKER_CLUSTER_INFO, {}, "cluster info")).body.decode())
        cluster_of = {name: cluster for cluster, names in
                      (info.get("clusterAddrTable") or {}).items() for name in names}
        return sorted(
            BrokerRow(str(cluster_of.get(name, b.get("cluster", ""))), str(name), int(i),
                      str(addr))
            for name, b in (info.get("brokerAddrTable") or {}).items()
            for i, addr in (b.get("brokerAddrs") or {}).items())

    async def masters(self, *, cluster: str | None = None, broker: str | None = None
                      ) -> list[BrokerRow]:
        """The brokers an update goes to: ``broker`` alone, or every master of ``cluster``."""
        if broker is not None:
            return [row for row in await self.cluster_list() if row.addr == broker] or [
                BrokerRow("", broker, MASTER_ID, broker)]
        rows = [r for r in await self.cluster_list() if r.broker_id == MASTER_ID
                and (cluster is None or r.cluster == cluster)]
        if not rows:
            raise AdminError(f"no master broker in cluster {cluster!r}" if cluster
                             else "no broker is registered with the name server")
        return rows

    async def broker_status(self, addr: str) -> dict[str, str]:
        answer = await self._broker(addr, RequestCode.GET_BROKER_RUNTIME_INFO, {}, "status")
        return {str(k): str(v) for k, v in json.loads(answer.body)["table"].items()}

    # -- topics -----------------------------------------------------------------------------------

    async def topic_list(self) -> list[str]:
        answer = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {},
                                     "topic list")
        return sorted(str(t) for t in fastjson.loads(answer.body.decode())["topicList"])

    async def topic_route(self, topic: str) -> TopicRoute:
        try:
            return await self._routes.lookup(topic)
        except RouteNotFound:
            raise AdminError(f"topic {topic!r} does not exist") from None

    async def update_topic(self, config: tp.TopicConfig, *, cluster: str | None = None,
                           broker: str | None = None) -> list[BrokerRow]:
        tp.validate_topic(config.topic_name)
        rows = await self.masters(cluster=cluster, broker=broker)
        fields = CreateTopicRequest.write(
            topic=config.topic_name, read_queue_nums=config.read_queue_nums,
            write_queue_nums=config.write_queue_nums, perm=config.perm,
            topic_filter_type=config.topic_filter_type.value,
            topic_sys_flag=config.topic_sys_flag, order=config.order)
        for row in self._progress(rows, "updateTopic"):
            await self._broker(row.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields,
                               f"update topic {config.topic_name!r}")
        return rows

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[BrokerRow]:
        rows = await self.masters(cluster=cluster)
        for row in self._progress(rows, "deleteTopic"):
            await self._broker(row.addr, RequestCode.DELETE_TOPIC_IN_BROKER,
                               DeleteTopicRequest.write(topic=topic), f"delete topic {topic!r}")
        fields = DeleteTopicFromNamesrvRequest.write(topic=topic, cluster_name=cluster)
        await self._namesrv(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields, "delete topic")
        return rows

    async def topic_status(self, topic: str) -> list[QueueStatus]:
        route = await self.topic_route(topic)
        out: list[QueueStatus] = []
        for name in self._progress(sorted(route.brokers), "topicStatus"):
            addr = route.master(name)
            if addr is None:
                continue
            answer = await self._broker(addr, RequestCode.GET_TOPIC_STATS_INFO,
                                        GetTopicStatsInfoRequest.write(topic=topic),
                                        f"status of {topic!r}")
            for mq, s in _queue_table(answer.body):
                out.append(QueueStatus(mq.broker_name, mq.queue_id, int(s["minOffset"]),
                                       int(s["maxOffset"]), int(s["lastUpdateTimestamp"])))
        return sorted(out, key=lambda q: (q.broker_name, q.queue_id))

    # -- subscription groups and consumers --------------------------------------------------------

    async def update_sub_group(self, config: SubscriptionGroupConfig, *,
                               cluster: str | None = None, broker: str | None = None
                               ) -> list[BrokerRow]:
        rows = await self.masters(cluster=cluster, broker=broker)
        body = json.dumps(to_json(config)).encode()
        for row in self._progress(rows, "updateSubGroup"):
            await self._broker(row.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                               f"update group {config.group_name!r}", body=body)
        return rows

    async def delete_sub_group(self, group: str, *, cluster: str | None = None,
                               broker: str | None = None) -> list[BrokerRow]:
        rows = await self.masters(cluster=cluster, broker=broker)
        for row in self._progress(rows, "deleteSubGroup"):
            await self._broker(row.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                               DeleteSubscriptionGroupRequest.write(group_name=group),
                               f"delete group {group!r}")
        return rows

    async def sub_group_config(self, group: str) -> list[tuple[BrokerRow, SubscriptionGroupConfig]]:
        """The group's stored config on every master that has it (mqadmin's
        getConsumerConfig): what updateSubGroup wrote, as the broker keeps it."""
        out: list[tuple[BrokerRow, SubscriptionGroupConfig]] = []
        for row in self._progress(await self.masters(), "getConsumerConfig"):
            answer = await self._broker(row.addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                                        {}, "subscription groups")
            table = fastjson.loads(answer.body.decode())["subscriptionGroupTable"]
            if group in table:
                out.append((row, from_json(SubscriptionGroupConfig, table[group])))
        if not out:
            raise AdminError(f"no broker has the subscription group {group!r}")
        return out

    async def consumer_progress(self, group: str, topic: str | None = None
                                ) -> list[QueueProgress]:
        """Lag per queue over every master (a group's offsets live where its queues do)."""
        fields = GetConsumeStatsRequest.write(consumer_group=group, topic=topic)
        out: list[QueueProgress] = []
        for row in self._progress(await self.masters(), "consumerProgress"):
            answer = await self._broker(row.addr, RequestCode.GET_CONSUME_STATS, fields,
                                        f"progress of {group!r}")
            for mq, s in _queue_table(answer.body):
                if mq.topic.startswith(tp.RETRY_PREFIX) and topic is None:
                    continue
                out.append(QueueProgress(mq.topic, mq.broker_name, mq.queue_id,
                                         int(s["brokerOffset"]), int(s["consumerOffset"]),
                                         int(s.get("lastTimestamp", 0))))
        if not out:
            raise AdminError(f"group {group!r} has no consume progress"
                             + (f" on topic {topic!r}" if topic else ""))
        return sorted(out, key=lambda q: (q.topic, q.broker_name, q.queue_id))

    async def consumer_connection(self, group: str) -> dict[str, Any]:
        """The group's members as the first master that has any sees them."""
        last: AdminError | None = None
        for row in await self.masters():
            try:
                answer = await self._broker(
                    row.addr, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                    GetConsumerConnectionListRequest.write(consumer_group=group),
                    f"members of {group!r}")
            except AdminError as exc:
                last = exc
                continue
            return dict(json.loads(answer.body))
        raise last or AdminError(f"the consumer group {group!r} is not online")

    async def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int, *,
                                   force: bool = True) -> list[ResetRow]:
        route = await self.topic_route(topic)
        fields = ResetOffsetRequest.write(topic=topic, group=group, timestamp=timestamp_ms,
                                          is_force=force)
        out: list[ResetRow] = []
        for name in self._progress(sorted(route.brokers), "resetOffsetByTime"):
            addr = route.master(name)
            if addr is None:
                continue
            answer = await self._broker(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields,
                                        f"reset {group!r} on {topic!r}")
            out += [ResetRow(mq.broker_name, mq.queue_id, int(offset))
                    for mq, offset in _queue_table(answer.body)]
        return sorted(out, key=lambda r: (r.broker_name, r.queue_id))

    # -- messages ---------------------------------------------------------------------------------

    async def query_msg_by_id(self, msg_id: str, topic: str | None = None) -> list[Message]:
        """By offset msgId (the store host and commit-log offset inside it); a UNIQ_KEY
        (client msgId) needs ``topic`` and goes through the index."""
        try:
            (ip, port), offset = parse_offset_msg_id(msg_id)
        except ValueError:
            port = 0
        if 0 < port < 65536:
            try:
                answer = await self._broker(f"{ip}:{port}", RequestCode.VIEW_MESSAGE_BY_ID,
                                            ViewMessageRequest.write(offset=offset),
                                            f"message {msg_id}")
                return [decode(answer.body)]
            except (ClientError, TransportError):
                if topic is None:
                    raise
        if topic is None:
            raise AdminError(f"{msg_id!r} is no offset msgId; give -t TOPIC to look it up "
                             "as a client msgId")
        return await self._query(topic, msg_id, 32, unique=True)

    async def query_msg_by_key(self, topic: str, key: str, max_num: int = 32) -> list[Message]:
        return await self._query(topic, key, max_num, unique=False)

    async def query_msg_by_offset(self, topic: str, broker_name: str, queue_id: int,
                                  offset: int) -> Message:
        route = await self.topic_route(topic)
        addr = route.master(broker_name)
        if addr is None:
            raise AdminError(f"broker {broker_name!r} serves no queue of {topic!r}")
        queue, sub = MessageQueue(topic, broker_name, queue_id), Subscription(topic)
        answer = await self._pool.invoke(addr, pull_request(TOOLS_GROUP, queue, offset, sub,
                                                            max_nums=1, suspend_ms=0))
        try:
            found = parse_pull(answer, sub)
        except BrokerRefused as exc:
            raise AdminError(str(exc)) from None
        if not found.messages:
            raise AdminError(f"no message at offset {offset} of {topic}:{broker_name}:"
                             f"{queue_id} (the queue holds {found.min_offset}.."
                             f"{found.max_offset - 1})")
        return found.messages[0]

    async def _query(self, topic: str, key: str, max_num: int, *, unique: bool
                     ) -> list[Message]:
        route = await self.topic_route(topic)
        found: list[Message] = []
        for name in sorted(route.brokers):
            addr = route.master(name)
            if addr is None:
                continue
            answer = await self._pool.invoke(addr, RemotingCommand.request(
                RequestCode.QUERY_MESSAGE, QueryMessageRequest.write(
                    topic=topic, key=key, max_num=max_num, unique_key_query=unique)))
            if answer.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            _check(answer, f"query {key!r} at {addr}")
            found += iter_records(answer.body)
        if not found:
            raise AdminError(f"no message of {topic!r} with key {key!r}")
        return found[:max_num]

    # -- plumbing ---------------------------------------------------------------------------------

    async def _namesrv(self, code: RequestCode, fields: dict[str, str], what: str
                       ) -> RemotingCommand:
        answer = await self._routes.ask(RemotingCommand.request(code, fields), what)
        return _check(answer, what)

    async def _broker(self, addr: str, code: RequestCode, fields: Mapping[str, object],
                      what: str, body: bytes = b"") -> RemotingCommand:
        answer = await self._pool.invoke(addr, RemotingCommand.request(code, fields, body))
        return _check(answer, f"{what} at {addr}")


def _check(answer: RemotingCommand, what: str) -> RemotingCommand:
    if answer.code != ResponseCode.SUCCESS:
        try:
            name = ResponseCode(answer.code).name
        except ValueError:
            name = str(answer.code)
        raise AdminError(f"{what}: {name} ({answer.remark or 'no remark'})")
    return answer


def _queue_table(body: bytes) -> list[tuple[MessageQueue, Any]]:
    """``offsetTable`` keyed by MessageQueue objects, in fastjson's shape or the C++ array."""
    table = fastjson.loads(body.decode())["offsetTable"]
    if isinstance(table, dict):
        return list(table.items())
    return [(MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"])),
             e.get("offset")) for e in table]
