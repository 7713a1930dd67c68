"""Admin codes: topics, subscription groups, offsets, stats, connections, runtime, reset."""

from __future__ import annotations

import json
import shutil

from evq.domain import topics as tp
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.config_json import from_json, to_json
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.log import MessageLog
from evq.domain.queues import MessageQueue
from evq.domain.record import read_fields
from evq.domain.schedule import DELAY_PROGRESS
from evq.net import fastjson
from evq.net.broker.clients import json_body
from evq.net.broker.context import BrokerContext
from evq.net.codes import LanguageCode, RequestCode
from evq.net.headers.admin import (
    CreateTopicRequest,
    DeleteSubscriptionGroupRequest,
    DeleteTopicRequest,
    GetConsumerConnectionListRequest,
    GetConsumeStatsRequest,
    GetTopicStatsInfoRequest,
    ResetOffsetRequest,
)
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

BROKER_VERSION = "V4_9_7"
BROKER_VERSION_ORDINAL = 407


def _data_version(ctx: BrokerContext) -> dict[str, int]:
    return {"counter": ctx.core.log.max_physical_offset, "timestamp": ctx.core.clock.now_ms()}


def earliest_store_time(log: MessageLog) -> int:
    """The store time of the oldest record the log still holds (0 when it holds none), as
    RocketMQ's ``earliestMessageTimeStamp``."""
    view = log.lookup(log.min_physical_offset) if log.max_physical_offset > 0 else None
    return read_fields(view, 0, check_crc=False).store_timestamp if view is not None else 0


def capacity(path: str) -> str:
    """RocketMQ's ``commitLogDirCapacity``: the data disk's total and free space."""
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return f"unknown: {exc.strerror}"
    return f"Total : {usage.total / 2**30:.1f} GiB, Free : {usage.free / 2**30:.1f} GiB."


def reset_offset_body(ctx: BrokerContext, group: str, topic: str, offsets: dict[int, int],
                      *, for_c: bool) -> bytes:
    """ResetOffsetBody: Java clients read MessageQueue-object keys, the C++ client only the
    array form Java sends when the admin request came from C++ ("ForC")."""
    name = ctx.core.config.broker_name
    if for_c:
        return json.dumps({"offsetTable": [
            {"brokerName": name, "offset": o, "queueId": q, "topic": topic}
            for q, o in sorted(offsets.items())]}).encode()
    return fastjson.dumps({"offsetTable": {
        MessageQueue(topic, name, q): o for q, o in offsets.items()}}).encode()


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    core = ctx.core

    async def update_topic(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = CreateTopicRequest.read(cmd.ext_fields)
        try:
            filter_type = tp.TopicFilterType(h.topic_filter_type)
        except ValueError:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"topicFilterType {h.topic_filter_type!r:.64} is neither "
                              "SINGLE_TAG nor MULTI_TAG") from None
        config = tp.TopicConfig(
            topic_name=h.topic, read_queue_nums=h.read_queue_nums,
            write_queue_nums=h.write_queue_nums, perm=h.perm, order=h.order,
            topic_sys_flag=h.topic_sys_flag, topic_filter_type=filter_type)
        await ctx.blocking(core.create_topic, config)
        ctx.topics_changed()
        return cmd.response()

    async def delete_topic(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await ctx.blocking(core.delete_topic, DeleteTopicRequest.read(cmd.ext_fields).topic)
        ctx.topics_changed()
        return cmd.response()

    async def update_group(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            config = from_json(SubscriptionGroupConfig, json_body(cmd))
        except (KeyError, TypeError, ValueError) as exc:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"bad subscription group: {exc}"
                              ) from None
        await ctx.blocking(core.create_group, config)
        return cmd.response()

    async def delete_group(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await ctx.blocking(core.delete_group,
                           DeleteSubscriptionGroupRequest.read(cmd.ext_fields).group_name)
        return cmd.response()

    async def all_topics(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topics = core.topics()
        if not topics:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "No topic in this broker")
        return cmd.response(body=json.dumps({
            "dataVersion": _data_version(ctx),
            "topicConfigTable": {n: to_json(c) for n, c in sorted(topics.items())},
        }).encode())

    async def all_groups(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=json.dumps({
            "dataVersion": _data_version(ctx),
            "subscriptionGroupTable": {n: to_json(c) for n, c in sorted(core.groups().items())},
        }).encode())

    async def all_offsets(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        table: dict[str, dict[int, int]] = {}
        for (group, topic, qid), offset in sorted(core.offsets().items()):
            table.setdefault(f"{topic}@{group}", {})[qid] = offset
        return cmd.response(body=fastjson.dumps({"offsetTable": table}).encode())

    async def delay_offsets(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        stored = core.progress(DELAY_PROGRESS)
        table = {int(k): int(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
        return cmd.response(body=fastjson.dumps({"offsetTable": table}).encode())

    async def consume_stats(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetConsumeStatsRequest.read(cmd.ext_fields)
        name = core.config.broker_name
        online = ctx.membership.consumer_group(h.consumer_group)
        subscribed = online.subscriptions if online is not None else {}
        table = {MessageQueue(s.topic, name, s.queue_id): {
            "brokerOffset": s.broker_offset, "consumerOffset": s.consumer_offset,
            "lastTimestamp": s.last_timestamp}
            for s in core.consume_stats(h.consumer_group, h.topic, subscribed)}
        return cmd.response(body=fastjson.dumps({"consumeTps": 0.0,
                                                 "offsetTable": table}).encode())

    async def topic_stats(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = GetTopicStatsInfoRequest.read(cmd.ext_fields).topic
        config = core.topic(topic)
        if config is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = {}
        for qid in range(config.write_queue_nums):
            lo, hi = core.log.bounds(topic, qid)
            last = core.log.store_time_at(topic, qid, hi - 1) if hi else 0
            table[MessageQueue(topic, core.config.broker_name, qid)] = {
                "lastUpdateTimestamp": max(last, 0), "maxOffset": hi, "minOffset": lo}
        return cmd.response(body=fastjson.dumps({"offsetTable": table}).encode())

    async def connections(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = GetConsumerConnectionListRequest.read(cmd.ext_fields).consumer_group
        info = ctx.membership.consumer_group(group)
        if info is None or not info.members:
            raise BrokerError(ResponseCode.CONSUMER_NOT_ONLINE,
                              f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [{"clientAddr": getattr(m.connection, "peer", ""),
                               "clientId": m.client_id,
                               "language": LanguageCode(
                                   ctx.clients.get(m.connection, (LanguageCode.OTHER, 0))[0]).name,
                               "version": ctx.clients.get(m.connection, (0, 0))[1]}
                              for m in info.members],
            "consumeFromWhere": info.consume_from_where, "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "subscriptionTable": {t: {"subString": getattr(s, "expression", "*"), "topic": t,
                                      "expressionType": getattr(
                                          getattr(s, "expression_type", None), "value", "TAG")}
                                  for t, s in info.subscriptions.items()},
        }
        return cmd.response(body=json.dumps(body).encode())

    async def runtime_info(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        log = core.log
        disk = log.disk_status
        table = {
            "brokerVersionDesc": BROKER_VERSION, "brokerVersion": BROKER_VERSION_ORDINAL,
            "commitLogMinOffset": log.min_physical_offset,
            "commitLogMaxOffset": log.max_physical_offset,
            "commitLogDiskRatio": disk.used_ratio, "brokerRole": core.config.broker_role.value,
            # Whether the store takes puts, and if not why (a full disk, with ratio and path).
            "evqPutsRefused": str(not disk.writable).lower(), "evqPutsRefusedReason": disk.refused,
            "earliestMessageTimeStamp": earliest_store_time(log),
            "evqBackend": type(log).__name__,
            # The event loop's longest stall since the broker started (evq.net.loop_lag).
            "evqLoopStallMaxMs": round(ctx.loop_lag.max_stall * 1000, 3),
            # Single sends the compiled send lane answered, and those it handed to the send
            # processor (both 0 where the lane is not built).
            "evqSendLaneTaken": 0 if ctx.send_lane is None else ctx.send_lane.taken,
            "evqSendLaneHandedOver": 0 if ctx.send_lane is None else ctx.send_lane.handed_over,
            "evqTransactionCheckPasses": ctx.engine.transactions.check_passes,
            # Connections closed on arrival at maxConnections; the read budget's bytes held
            # now and the times a connection waited for room (evq.net.read_budget).
            "evqConnectionsRefused": 0 if ctx.refusals is None else ctx.refusals.count,
            "evqReadBudgetUsed": 0 if ctx.read_budget is None else ctx.read_budget.used,
            "evqReadBudgetWaits": 0 if ctx.read_budget is None else ctx.read_budget.waits,
            "commitLogDirCapacity": capacity(disk.path),
            **ctx.stats.runtime_fields(core.clock.now_ms()),
        }
        return cmd.response(body=json.dumps(
            {"table": {k: str(v) for k, v in table.items()}}).encode())

    async def reset_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ResetOffsetRequest.read(cmd.ext_fields)
        topic, group, force = h.topic, h.group, h.is_force
        timestamp = 2**63 - 1 if h.timestamp < 0 else h.timestamp  # -1: every queue's end
        offsets = await ctx.blocking(
            lambda: core.reset_offset_by_time(group, topic, timestamp, force=force))
        for_c = cmd.language == LanguageCode.CPP
        body = reset_offset_body(ctx, group, topic, offsets, for_c=for_c)
        info = ctx.membership.consumer_group(group)
        notice = ResetOffsetRequest.write(topic=topic, group=group, timestamp=timestamp,
                                          is_force=force)
        for member in info.members if info else ():
            client = member.connection
            if isinstance(client, Connection) and not client.is_closed:
                client.send_oneway(RemotingCommand.request(
                    RequestCode.RESET_CONSUMER_CLIENT_OFFSET, notice,
                    reset_offset_body(ctx, group, topic, offsets, for_c=True)
                    if ctx.clients.get(client, (None,))[0] == LanguageCode.CPP else body,
                    oneway=True))
        return cmd.response(body=body)

    return {
        RequestCode.UPDATE_AND_CREATE_TOPIC: update_topic,
        RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: update_group,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: delete_group,
        RequestCode.GET_ALL_TOPIC_CONFIG: all_topics,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: all_groups,
        RequestCode.GET_ALL_CONSUMER_OFFSET: all_offsets,
        RequestCode.GET_ALL_DELAY_OFFSET: delay_offsets,
        RequestCode.GET_CONSUME_STATS: consume_stats,
        RequestCode.GET_TOPIC_STATS_INFO: topic_stats,
        RequestCode.GET_CONSUMER_CONNECTION_LIST: connections,
        RequestCode.GET_BROKER_RUNTIME_INFO: runtime_info,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: reset_offset,
    }
