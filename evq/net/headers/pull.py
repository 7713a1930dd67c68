"""PULL_MESSAGE (11): ``PullMessageRequestHeader`` and ``PullMessageResponseHeader``."""

from __future__ import annotations

from typing import Final

from evq.net.headers import INT, LONG, Header, header, wire

# PullSysFlag: what a pull asks of the broker besides messages.
FLAG_COMMIT_OFFSET: Final = 1
"""Commit ``commit_offset`` for the group with this pull."""
FLAG_SUSPEND: Final = 2
"""Hold the pull (long polling) when nothing is there yet."""
FLAG_SUBSCRIPTION: Final = 4
"""Filter by the expression this request carries, not the one the heartbeat registered."""


@header
class PullRequest(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId", INT)
    queue_offset: int = wire("queueOffset", LONG)
    max_msg_nums: int = wire("maxMsgNums", INT, default=32)
    sys_flag: int = wire("sysFlag", INT, default=0)
    commit_offset: int = wire("commitOffset", LONG, default=-1)
    """Read only under :data:`FLAG_COMMIT_OFFSET`; below 0, nothing to commit."""
    suspend_timeout_millis: int = wire("suspendTimeoutMillis", LONG, default=15_000)
    subscription: str = wire("subscription", default="*")
    sub_version: int = wire("subVersion", LONG, default=0)
    expression_type: str = wire("expressionType", default="TAG")


@header
class PullResponse(Header):
    next_begin_offset: int = wire("nextBeginOffset", LONG)
    min_offset: int = wire("minOffset", LONG, default=0)
    max_offset: int = wire("maxOffset", LONG, default=0)
    suggest_which_broker_id: int = wire("suggestWhichBrokerId", LONG, default=0)
