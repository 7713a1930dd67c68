"""PULL_MESSAGE (11) with long polling and commit-on-pull."""

from __future__ import annotations

from evq.domain.broker import PullResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.filters import FilterError, Subscription, parse_subscription
from evq.net.broker.context import BrokerContext
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

FLAG_COMMIT_OFFSET = 1
FLAG_SUSPEND = 2
FLAG_SUBSCRIPTION = 4
MAX_SUSPEND_S = 25.0  # both clients time a pull out at 30 s


def subscription_of(ctx: BrokerContext, cmd: RemotingCommand, group: str, topic: str
                    ) -> Subscription:
    """The request's own expression when it carries one (both stock clients do), else the
    one the group's heartbeat registered."""
    if cmd.get_int("sysFlag", 0) & FLAG_SUBSCRIPTION:
        try:
            return parse_subscription(topic, cmd.get_str("subscription", "*"),
                                      cmd.get_str("expressionType", "TAG") or "TAG",
                                      cmd.get_long("subVersion", 0))
        except FilterError as exc:
            raise BrokerError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None
    registered = ctx.membership.subscription(group, topic)
    if not isinstance(registered, Subscription):
        raise BrokerError(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                          f"the consumer's subscription not exist, group: {group}")
    return registered


def answer(ctx: BrokerContext, cmd: RemotingCommand, r: PullResult) -> RemotingCommand:
    stats = ctx.stats
    if r.records:
        stats.messages_got += len(r.records)
        stats.pulls_found += 1
    else:
        stats.pulls_missed += 1
    return cmd.response(r.code, r.status.value, {  # strings already: no coercion per field
        "suggestWhichBrokerId": str(r.suggest_which_broker_id),
        "nextBeginOffset": str(r.next_begin_offset),
        "minOffset": str(r.min_offset), "maxOffset": str(r.max_offset),
    }, b"".join(r.records))


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    async def pull(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, topic = cmd.get_str("consumerGroup"), cmd.get_str("topic")
        queue_id, offset = cmd.get_int("queueId"), cmd.get_long("queueOffset")
        flags = cmd.get_int("sysFlag", 0)
        max_count = max(1, min(cmd.get_int("maxMsgNums", 32), 1024))
        sub = subscription_of(ctx, cmd, group, topic)
        commit = cmd.get_long("commitOffset", -1) if flags & FLAG_COMMIT_OFFSET else None
        if ctx.core.pull_writes_metadata(group):  # a new group is recorded: off the loop
            await ctx.blocking(ctx.core.ensure_group, group)
            await conn.writable()
        r = ctx.core.pull(group, topic, queue_id, offset, max_count=max_count,
                          subscription=sub, commit_offset=commit)
        if r.code is not ResponseCode.PULL_NOT_FOUND or not flags & FLAG_SUSPEND:
            return answer(ctx, cmd, r)
        timeout = min(cmd.get_long("suspendTimeoutMillis", 15_000) / 1000, MAX_SUSPEND_S)

        def arrived() -> bool:
            return ctx.core.log.bounds(topic, queue_id)[1] > offset

        await ctx.holds.wait(topic, queue_id, offset, timeout, sub.tag_filter, recheck=arrived)
        await conn.writable()  # many parked pulls wake at once: read for one answer at a time
        return answer(ctx, cmd, ctx.core.pull(group, topic, queue_id, offset,
                                              max_count=max_count, subscription=sub))

    return {RequestCode.PULL_MESSAGE: pull}
