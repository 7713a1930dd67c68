"""``evq admin COMMAND``: mqadmin's commands and flags over :class:`evq.admin.operations.Admin`.

Each command is one coroutine from parsed arguments to an :class:`~evq.admin.render.Output`;
the runner prints it as a table or, with ``--json``, as one JSON document.  Failures raise, and
``evq``'s entry point turns them into one line on stderr and a non-zero status.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import attrs
from tqdm import tqdm

from evq.admin.operations import Admin, AdminError, BrokerRow
from evq.admin.render import Output, show, table
from evq.admin.timestamps import format_timestamp, parse_timestamp
from evq.client.scripts import message_json
from evq.client.security_flags import add_security_flags, client_security
from evq.domain import topics as tp
from evq.domain.config_json import to_json
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.message import Message
from evq.domain.record import offset_msg_id
from evq.net.transport import run

DEFAULT_NAMESRV: Final = "127.0.0.1:9876"


def add_namesrv_flag(parser: argparse.ArgumentParser) -> None:
    """``-n/--namesrv`` as every client command takes it (admin, produce, consume): the
    name servers, else ``$NAMESRV_ADDR`` as RocketMQ's tools read it, else the default."""
    parser.add_argument("-n", "--namesrv", default=os.environ.get("NAMESRV_ADDR",
                                                                  DEFAULT_NAMESRV),
                        metavar="H:P;H:P", help="name servers (default: $NAMESRV_ADDR or "
                                                f"{DEFAULT_NAMESRV})")
BODY_PREVIEW: Final = 40

Command = Callable[[Admin, argparse.Namespace], Awaitable[Output]]
_COMMANDS: dict[str, Command] = {}


def _command(name: str) -> Callable[[Command], Command]:
    """Register a command under mqadmin's name for it."""

    def register(fn: Command) -> Command:
        _COMMANDS[name] = fn
        return fn

    return register


def _progress(items: Iterable[Any], what: str) -> Iterable[Any]:
    """A bar on stderr for loops over brokers or queues, only when someone watches."""
    return tqdm(items, desc=what, file=sys.stderr, leave=False, disable=not sys.stderr.isatty())


def _brokers(rows: list[BrokerRow]) -> Output:
    doc = [attrs.asdict(r) for r in rows]
    return Output({"brokers": doc}, [{**d, "result": "OK"} for d in doc],
                  ["cluster", "broker_name", "broker_id", "addr", "result"])


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


# -- brokers and clusters -----------------------------------------------------------------------


@_command("clusterList")
async def cluster_list(admin: Admin, args: argparse.Namespace) -> Output:
    rows = [attrs.asdict(r) for r in await admin.cluster_list()]
    return Output({"brokers": rows}, rows, ["cluster", "broker_name", "broker_id", "addr"])


@_command("brokerStatus")
async def broker_status(admin: Admin, args: argparse.Namespace) -> Output:
    table = await admin.broker_status(args.broker)
    rows = [{"key": k, "value": v} for k, v in sorted(table.items())]
    return Output(table, rows, ["key", "value"])


# -- topics ---------------------------------------------------------------------------------------


@_command("topicList")
async def topic_list(admin: Admin, args: argparse.Namespace) -> Output:
    topics = await admin.topic_list()
    return Output({"topics": topics}, text="\n".join(topics))


@_command("topicRoute")
async def topic_route(admin: Admin, args: argparse.Namespace) -> Output:
    route = await admin.topic_route(args.topic)
    brokers = [{"broker_name": n, "broker_id": i, "addr": a}
               for n, ids in sorted(route.brokers.items()) for i, a in sorted(ids.items())]
    queues = [attrs.asdict(q) for q in route.queue_datas]
    by_name = {q["broker_name"]: q for q in queues}
    rows = [{**b, **{k: v for k, v in by_name.get(b["broker_name"], {}).items()
                     if k != "broker_name"}} for b in brokers]
    return Output({"topic": route.topic, "brokers": brokers, "queues": queues}, rows,
                  ["broker_name", "broker_id", "addr", "read_queue_nums", "write_queue_nums",
                   "perm"])


@_command("topicStatus")
async def topic_status(admin: Admin, args: argparse.Namespace) -> Output:
    queues = [attrs.asdict(q) for q in await admin.topic_status(args.topic)]
    rows = [{**q, "last_update": format_timestamp(q["last_update_ms"])} for q in queues]
    return Output({"topic": args.topic, "queues": queues}, rows,
                  ["broker_name", "queue_id", "min_offset", "max_offset", "last_update"])


@_command("updateTopic")
async def update_topic(admin: Admin, args: argparse.Namespace) -> Output:
    config = tp.TopicConfig(topic_name=args.topic, read_queue_nums=args.read_queues,
                            write_queue_nums=args.write_queues, perm=args.perm,
                            order=args.order)
    return _brokers(await admin.update_topic(config, cluster=args.cluster, broker=args.broker))


@_command("deleteTopic")
async def delete_topic(admin: Admin, args: argparse.Namespace) -> Output:
    return _brokers(await admin.delete_topic(args.topic, cluster=args.cluster))


# -- groups and consumers -------------------------------------------------------------------------


@_command("updateSubGroup")
async def update_sub_group(admin: Admin, args: argparse.Namespace) -> Output:
    config = SubscriptionGroupConfig(
        group_name=args.group, consume_enable=args.consume_enable,
        consume_broadcast_enable=args.broadcast_enable, retry_queue_nums=args.retry_queues,
        retry_max_times=args.retry_max_times, broker_id=args.broker_id,
        which_broker_when_consume_slowly=args.which_broker_when_slow)
    return _brokers(await admin.update_sub_group(config, cluster=args.cluster,
                                                 broker=args.broker))


@_command("getConsumerConfig")
async def get_consumer_config(admin: Admin, args: argparse.Namespace) -> Output:
    rows = [{"broker_name": row.broker_name, "addr": row.addr, **to_json(config)}
            for row, config in await admin.sub_group_config(args.group)]
    return Output({"configs": rows}, rows, [
        "broker_name", "addr", "consumeEnable", "consumeBroadcastEnable", "retryQueueNums",
        "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"])


@_command("deleteSubGroup")
async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> Output:
    return _brokers(await admin.delete_sub_group(args.group, cluster=args.cluster,
                                                 broker=args.broker))


@_command("consumerProgress")
async def consumer_progress(admin: Admin, args: argparse.Namespace) -> Output:
    queues = await admin.consumer_progress(args.group, args.topic)
    rows = [{**attrs.asdict(q), "lag": q.lag, "last_time": format_timestamp(q.last_timestamp)}
            for q in queues]
    total = sum(q.lag for q in queues)
    text = table(rows, ["topic", "broker_name", "queue_id", "broker_offset", "consumer_offset",
                        "lag", "last_time"]) + f"\n\nDiff Total: {total}"
    return Output({"group": args.group, "queues": rows, "total_lag": total}, text=text)


@_command("consumerConnection")
async def consumer_connection(admin: Admin, args: argparse.Namespace) -> Output:
    info = await admin.consumer_connection(args.group)
    rows = [{"client_id": c.get("clientId"), "client_addr": c.get("clientAddr"),
             "language": c.get("language"), "version": c.get("version")}
            for c in info.get("connectionSet", [])]
    return Output(info, rows, ["client_id", "client_addr", "language", "version"])


@_command("resetOffsetByTime")
async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> Output:
    when = parse_timestamp(args.timestamp, time.time_ns() // 1_000_000)
    rows = [attrs.asdict(r) for r in await admin.reset_offset_by_time(
        args.group, args.topic, when, force=args.force)]
    return Output({"group": args.group, "topic": args.topic, "timestamp": when,
                   "queues": rows}, rows, ["broker_name", "queue_id", "offset"])


# -- messages -------------------------------------------------------------------------------------


def _messages(msgs: list[Message]) -> Output:
    docs = [{**message_json(m), "offsetMsgId": offset_msg_id(m.store_host, m.commit_log_offset),
             "storeHost": f"{m.store_host[0]}:{m.store_host[1]}"} for m in msgs]
    rows = [{"topic": d["topic"], "queue_id": d["queueId"], "queue_offset": d["queueOffset"],
             "msg_id": d["msgId"], "tags": d["tags"], "keys": d["keys"],
             "store_time": format_timestamp(int(str(d["storeTimestamp"]))),
             "body": str(d["body"])[:BODY_PREVIEW]} for d in docs]
    return Output({"messages": docs}, rows, ["topic", "queue_id", "queue_offset", "msg_id",
                                             "tags", "keys", "store_time", "body"])


@_command("queryMsgById")
async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    return _messages(await admin.query_msg_by_id(args.msg_id, args.topic))


@_command("queryMsgByKey")
async def query_msg_by_key(admin: Admin, args: argparse.Namespace) -> Output:
    return _messages(await admin.query_msg_by_key(args.topic, args.key, args.max))


@_command("queryMsgByOffset")
async def query_msg_by_offset(admin: Admin, args: argparse.Namespace) -> Output:
    return _messages([await admin.query_msg_by_offset(args.topic, args.broker_name,
                                                      args.queue_id, args.offset)])


# -- wiring ---------------------------------------------------------------------------------------


def add_admin(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("admin", help="administer a cluster (mqadmin's commands)",
                            description="Administer topics, groups, offsets and messages of "
                                        "an evq (or RocketMQ) cluster, with mqadmin's "
                                        "command names and flags.")
    sub = p.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_)
        add_namesrv_flag(c)
        add_security_flags(c)
        c.add_argument("--json", action="store_true", help="print one JSON document")
        c.set_defaults(handler=_run, admin=_COMMANDS[name], log_level_default="error")
        return c

    def where(c: argparse.ArgumentParser) -> None:
        target = c.add_mutually_exclusive_group(required=True)
        target.add_argument("-c", "--cluster", help="every master of this cluster")
        target.add_argument("-b", "--broker", metavar="H:P", help="this broker only")

    cmd("clusterList", "brokers of every cluster")
    cmd("brokerStatus", "a broker's runtime figures").add_argument(
        "-b", "--broker", required=True, metavar="H:P")
    cmd("topicList", "every topic the name servers know")
    cmd("topicRoute", "a topic's brokers and queues").add_argument("-t", "--topic",
                                                                   required=True)
    cmd("topicStatus", "min/max offset of each queue of a topic").add_argument(
        "-t", "--topic", required=True)
    c = cmd("updateTopic", "create or update a topic")
    c.add_argument("-t", "--topic", required=True)
    where(c)
    c.add_argument("-r", "--read-queues", type=int, default=8)
    c.add_argument("-w", "--write-queues", type=int, default=8)
    c.add_argument("-p", "--perm", type=int, default=tp.PERM_RW, help="2 W, 4 R, 6 RW")
    c.add_argument("-o", "--order", type=_bool, default=False, metavar="true|false")
    c = cmd("deleteTopic", "delete a topic from a cluster and the name servers")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-c", "--cluster", required=True)
    c = cmd("updateSubGroup", "create or update a subscription group")
    c.add_argument("-g", "--group", required=True)
    where(c)
    c.add_argument("-i", "--broker-id", type=int, default=0,
                   help="brokerId consumers read from")
    c.add_argument("-w", "--which-broker-when-slow", type=int, default=1,
                   help="brokerId consumers read from when they fall behind")
    c.add_argument("-r", "--retry-queues", type=int, default=1)
    c.add_argument("-q", "--retry-max-times", type=int, default=16)
    c.add_argument("-s", "--consume-enable", type=_bool, default=True, metavar="true|false")
    c.add_argument("-d", "--broadcast-enable", type=_bool, default=True, metavar="true|false")
    cmd("getConsumerConfig", "a subscription group's stored config on each master").add_argument(
        "-g", "--group", required=True)
    c = cmd("deleteSubGroup", "delete a subscription group")
    c.add_argument("-g", "--group", required=True)
    where(c)
    c = cmd("consumerProgress", "a group's offsets and lag per queue")
    c.add_argument("-g", "--group", required=True)
    c.add_argument("-t", "--topic", default=None)
    cmd("consumerConnection", "a group's connected members").add_argument(
        "-g", "--group", required=True)
    c = cmd("resetOffsetByTime", "move a group's offsets on a topic to a time")
    c.add_argument("-g", "--group", required=True)
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-s", "--timestamp", required=True,
                   help="epoch ms, 'now', or yyyy-MM-dd#HH:mm:ss:SSS (local time)")
    c.add_argument("-f", "--force", nargs="?", type=_bool, const=True, default=True,
                   metavar="true|false", help="also move offsets backwards (default true)")
    c = cmd("queryMsgById", "a message by offset msgId (or client msgId with -t)")
    c.add_argument("-i", "--msg-id", required=True)
    c.add_argument("-t", "--topic", default=None)
    c = cmd("queryMsgByKey", "messages by key")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-k", "--key", required=True)
    c.add_argument("--max", type=int, default=32)
    c = cmd("queryMsgByOffset", "the message at a queue offset")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-b", "--broker-name", required=True)
    c.add_argument("-i", "--queue-id", type=int, required=True)
    c.add_argument("-o", "--offset", type=int, required=True)


def _run(args: argparse.Namespace) -> int:
    command: Command = args.admin
    security = client_security(args)

    async def main() -> Output:
        async with Admin(args.namesrv, progress=_progress, security=security) as admin:
            return await command(admin, args)

    try:
        out = run(main())
    except ValueError as exc:  # a bad timestamp or name: the user's argument
        raise AdminError(str(exc)) from None
    print(show(out, as_json=args.json))
    return 0
