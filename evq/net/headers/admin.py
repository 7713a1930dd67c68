"""The broker's admin requests that carry a header: UPDATE_AND_CREATE_TOPIC (17),
DELETE_TOPIC_IN_BROKER (215), DELETE_SUBSCRIPTIONGROUP (207), GET_CONSUME_STATS (208),
GET_TOPIC_STATS_INFO (202), GET_CONSUMER_CONNECTION_LIST (203), and INVOKE_BROKER_TO_RESET_OFFSET
(222) with the RESET_CONSUMER_CLIENT_OFFSET (220) notice the broker passes on to the group.

Their answers carry bodies only.  Where evq's broker is more lenient than RocketMQ's (which
requires every field of ``CreateTopicRequestHeader`` and ``isForce``), the defaults are evq's:
the broker has always taken a request that leaves them out.
"""

from __future__ import annotations

from evq.domain import topics as tp
from evq.net.headers import BOOL, INT, LONG, Header, header, wire


@header
class CreateTopicRequest(Header):
    """UPDATE_AND_CREATE_TOPIC: the topic's config, field by field."""

    topic: str = wire("topic")
    default_topic: str = wire("defaultTopic", default=tp.AUTO_CREATE_TOPIC)
    """The topic a new one is modelled on: RocketMQ's broker requires it, evq's ignores it."""
    read_queue_nums: int = wire("readQueueNums", INT, default=16)
    write_queue_nums: int = wire("writeQueueNums", INT, default=16)
    perm: int = wire("perm", INT, default=tp.PERM_RW)
    topic_filter_type: str = wire("topicFilterType", default=tp.TopicFilterType.SINGLE_TAG.value)
    """A :class:`~evq.domain.topics.TopicFilterType` name; the broker refuses any other."""
    topic_sys_flag: int = wire("topicSysFlag", INT, default=0)
    order: bool = wire("order", BOOL, default=False)


@header
class DeleteTopicRequest(Header):
    """DELETE_TOPIC_IN_BROKER."""

    topic: str = wire("topic")


@header
class DeleteSubscriptionGroupRequest(Header):
    """DELETE_SUBSCRIPTIONGROUP."""

    group_name: str = wire("groupName")


@header
class GetConsumeStatsRequest(Header):
    """GET_CONSUME_STATS: a group's progress, on one topic or on all it consumes."""

    consumer_group: str = wire("consumerGroup")
    topic: str | None = wire("topic", default=None, empty_as_absent=True)
    """``None`` (``""`` reads as absent too): every topic the group consumes."""


@header
class GetTopicStatsInfoRequest(Header):
    """GET_TOPIC_STATS_INFO."""

    topic: str = wire("topic")


@header
class GetConsumerConnectionListRequest(Header):
    """GET_CONSUMER_CONNECTION_LIST."""

    consumer_group: str = wire("consumerGroup")


@header
class ResetOffsetRequest(Header):
    """INVOKE_BROKER_TO_RESET_OFFSET, and the RESET_CONSUMER_CLIENT_OFFSET the broker then
    sends each online member of the group (RocketMQ uses the one header for both)."""

    topic: str = wire("topic")
    group: str = wire("group")
    timestamp: int = wire("timestamp", LONG)
    """Milliseconds: each queue goes to its first message stored at or after it; -1 (any
    negative) asks for the end of every queue."""
    is_force: bool = wire("isForce", BOOL, default=True)
    """Move every queue to its target; without it a queue the group has consumed only
    moves back."""
