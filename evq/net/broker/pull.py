"""PULL_MESSAGE (11) with long polling and commit-on-pull."""

from __future__ import annotations

from evq.domain.broker import PullResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.filters import FilterError, Subscription, parse_subscription
from evq.net.broker.context import BrokerContext
from evq.net.codes import RequestCode
from evq.net.headers.pull import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    PullRequest,
    PullResponse,
)
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

MAX_SUSPEND_S = 25.0  # both clients time a pull out at 30 s


def subscription_of(ctx: BrokerContext, h: PullRequest) -> Subscription:
    """The request's own expression when it carries one (both stock clients do), else the
    one the group's heartbeat registered."""
    group, topic = h.consumer_group, h.topic
    if h.sys_flag & FLAG_SUBSCRIPTION:
        try:
            return parse_subscription(topic, h.subscription, h.expression_type or "TAG",
                                      h.sub_version)
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
    return cmd.response(r.code, r.status.value, PullResponse.write(
        next_begin_offset=r.next_begin_offset, min_offset=r.min_offset,
        max_offset=r.max_offset, suggest_which_broker_id=r.suggest_which_broker_id,
    ), b"".join(r.records))


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    async def pull(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PullRequest.read(cmd.ext_fields)
        group, topic, queue_id, offset = h.consumer_group, h.topic, h.queue_id, h.queue_offset
        flags = h.sys_flag
        max_count = max(1, min(h.max_msg_nums, 1024))
        sub = subscription_of(ctx, h)
        commit = h.commit_offset if flags & FLAG_COMMIT_OFFSET else None
        if ctx.core.pull_writes_metadata(group):  # a new group is recorded: off the loop
            await ctx.blocking(ctx.core.ensure_group, group)
            await conn.writable()
        r = ctx.core.pull(group, topic, queue_id, offset, max_count=max_count,
                          subscription=sub, commit_offset=commit)
        if r.code is not ResponseCode.PULL_NOT_FOUND or not flags & FLAG_SUSPEND:
            return answer(ctx, cmd, r)
        timeout = min(h.suspend_timeout_millis / 1000, MAX_SUSPEND_S)

        def arrived() -> bool:
            return ctx.core.log.bounds(topic, queue_id)[1] > offset

        await ctx.holds.wait(topic, queue_id, offset, timeout, sub.tag_filter, recheck=arrived)
        await conn.writable()  # many parked pulls wake at once: read for one answer at a time
        return answer(ctx, cmd, ctx.core.pull(group, topic, queue_id, offset,
                                              max_count=max_count, subscription=sub))

    return {RequestCode.PULL_MESSAGE: pull}
