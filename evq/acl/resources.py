"""Which topics and groups a request touches, and which codes only an admin may send.

RocketMQ's ``PlainAccessValidator.parse`` decides, per request code, which (resource, perm)
pairs an account must own; this module is that table for every code an evq broker serves.
A group ``G`` is the resource ``%RETRY%G`` in RocketMQ; here it is ``Resource(G, group=True)``
and checked against ``groupPerms``, and a topic named ``%RETRY%G`` is that same group.

=============================================  ===============================================
code                                           needs
=============================================  ===============================================
SEND_MESSAGE 10, SEND_BATCH_MESSAGE 320,        PUB on the topic (V2 headers name it ``b``); a
SEND_MESSAGE_V2 310, SEND_REPLY_MESSAGE(_V2)    retry topic ``%RETRY%G``: SUB on group G
324/325
PULL_MESSAGE 11                                 SUB on ``topic`` and on ``consumerGroup``
QUERY_MESSAGE 12                                SUB on ``topic``
HEART_BEAT 34                                   SUB on each consumer group in the body and on
                                                each topic it subscribes to
UNREGISTER_CLIENT 35,                           SUB on ``consumerGroup``
GET_CONSUMER_LIST_BY_GROUP 38,
GET_CONSUMER_CONNECTION_LIST 203
UPDATE_CONSUMER_OFFSET 15,                      SUB on ``consumerGroup`` and ``topic``
QUERY_CONSUMER_OFFSET 14
CONSUMER_SEND_MSG_BACK 36                       SUB on ``group``
LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42            SUB on the body's group and each queue's topic
GET_CONSUME_STATS 208                           SUB on ``consumerGroup``; ANY on ``topic``
GET_MAX_OFFSET 30, GET_MIN_OFFSET 31,           ANY (PUB or SUB) on ``topic``
GET_EARLIEST_MSG_STORETIME 32,
SEARCH_OFFSET_BY_TIMESTAMP 29,
GET_TOPIC_STATS_INFO 202
:data:`ADMIN_CODES`                             an admin account
anything else                                   a known account and a good signature
=============================================  ===============================================

RocketMQ checks only 10, 310, 11, 12, 34, 35, 38, 15 and 36 (and reads a retry-topic send's
group from a ``group`` field senders do not send); the rows beyond those are evq's, each the
permission a client doing that work already holds.  Admin-only codes are RocketMQ's five
(topic and group create/update/delete, UPDATE_BROKER_CONFIG) and every other code that changes
what the broker does for everyone: offset resets and clones, write-permission changes, file
deletion and clean-ups, consumer suspension, the name server's write codes, the ACL codes
50-54 (RocketMQ's 54 answers every account's secret).  VIEW_MESSAGE_BY_ID and END_TRANSACTION
name no topic in their headers and, as in RocketMQ, need only a signed known account.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

import attrs

from evq.acl.accounts import Perm
from evq.domain.topics import RETRY_PREFIX
from evq.net.codes import RequestCode as C
from evq.net.send_header import field as send_field


class UnreadableRequest(ValueError):
    """A request whose resources cannot be told (a heartbeat body that is not JSON...)."""


@attrs.frozen(slots=True)
class Resource:
    name: str
    group: bool = False

    @classmethod
    def topic(cls, name: str) -> Resource:
        """A topic; ``%RETRY%G`` is group G, as RocketMQ checks it."""
        if name.startswith(RETRY_PREFIX):
            return cls(name[len(RETRY_PREFIX):], group=True)
        return cls(name)

    def __str__(self) -> str:
        return f"group={self.name}" if self.group else f"topic={self.name}"


Need = tuple[Resource, Perm]

ADMIN_CODES: Final = frozenset({
    C.UPDATE_AND_CREATE_TOPIC, C.DELETE_TOPIC_IN_BROKER, C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    C.DELETE_SUBSCRIPTIONGROUP, C.UPDATE_BROKER_CONFIG,
    C.INVOKE_BROKER_TO_RESET_OFFSET, C.RESET_CONSUMER_OFFSET_IN_BROKER,
    C.RESET_CONSUMER_OFFSET_IN_CONSUMER, C.RESET_CONSUMER_CLIENT_OFFSET, C.CLONE_GROUP_OFFSET,
    C.WIPE_WRITE_PERM_OF_BROKER, C.ADD_WRITE_PERM_OF_BROKER, C.TRIGGER_DELETE_FILES,
    C.DELETE_EXPIRED_COMMITLOG, C.CLEAN_EXPIRED_CONSUMEQUEUE, C.CLEAN_UNUSED_TOPIC,
    C.SUSPEND_CONSUMER, C.RESUME_CONSUMER, C.ADJUST_CONSUMER_THREAD_POOL,
    C.RESUME_CHECK_HALF_MESSAGE,
    C.UPDATE_AND_CREATE_ACL_CONFIG, C.DELETE_ACL_CONFIG, C.GET_BROKER_CLUSTER_ACL_INFO,
    C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, C.GET_BROKER_CLUSTER_ACL_CONFIG,
    C.PUT_KV_CONFIG, C.DELETE_KV_CONFIG, C.DELETE_KV_CONFIG_BY_VALUE, C.REGISTER_BROKER,
    C.UNREGISTER_BROKER, C.DELETE_TOPIC_IN_NAMESRV, C.UPDATE_NAMESRV_CONFIG,
})

SEND_CODES: Final = frozenset({C.SEND_MESSAGE, C.SEND_MESSAGE_V2, C.SEND_BATCH_MESSAGE,
                               C.SEND_REPLY_MESSAGE, C.SEND_REPLY_MESSAGE_V2})
TRACE_TOPIC: Final = "RMQ_SYS_TRACE_TOPIC"

# Header fields read per code: (field, is a group, perm).
_FIELDS: Final[Mapping[int, tuple[tuple[str, bool, Perm], ...]]] = {
    C.PULL_MESSAGE: (("topic", False, Perm.SUB), ("consumerGroup", True, Perm.SUB)),
    C.QUERY_MESSAGE: (("topic", False, Perm.SUB),),
    C.UNREGISTER_CLIENT: (("consumerGroup", True, Perm.SUB),),
    C.GET_CONSUMER_LIST_BY_GROUP: (("consumerGroup", True, Perm.SUB),),
    C.GET_CONSUMER_CONNECTION_LIST: (("consumerGroup", True, Perm.SUB),),
    C.UPDATE_CONSUMER_OFFSET: (("consumerGroup", True, Perm.SUB), ("topic", False, Perm.SUB)),
    C.QUERY_CONSUMER_OFFSET: (("consumerGroup", True, Perm.SUB), ("topic", False, Perm.SUB)),
    C.CONSUMER_SEND_MSG_BACK: (("group", True, Perm.SUB),),
    C.GET_CONSUME_STATS: (("consumerGroup", True, Perm.SUB), ("topic", False, Perm.ANY)),
    C.GET_MAX_OFFSET: (("topic", False, Perm.ANY),),
    C.GET_MIN_OFFSET: (("topic", False, Perm.ANY),),
    C.GET_EARLIEST_MSG_STORETIME: (("topic", False, Perm.ANY),),
    C.SEARCH_OFFSET_BY_TIMESTAMP: (("topic", False, Perm.ANY),),
    C.GET_TOPIC_STATS_INFO: (("topic", False, Perm.ANY),),
}


def needs(code: int, fields: Mapping[str, str], body: bytes) -> list[Need]:
    """What ``code`` with these header fields and body touches; an empty field names nothing
    (the processor refuses a required one).  :class:`UnreadableRequest` when the body that
    names the resources cannot be read."""
    if code in SEND_CODES:
        return [_send_need(send_field(code, fields, "topic") or "")]
    by_body = _BODIES.get(code)
    if by_body is not None:
        return list(by_body(_json(body)))
    return [(Resource(value, group=True) if is_group else Resource.topic(value), perm)
            for name, is_group, perm in _FIELDS.get(code, ())
            if (value := fields.get(name))]


def _send_need(topic: str) -> Need:
    resource = Resource.topic(topic)
    return (resource, Perm.SUB if resource.group else Perm.PUB)


def _json(body: bytes) -> Mapping[str, object]:
    try:
        value = json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UnreadableRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UnreadableRequest("the request body is not a JSON object")
    return value


def _items(value: object, what: str) -> Iterable[Mapping[str, object]]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise UnreadableRequest(f"{what} is not a list of objects")
    return value


def _heartbeat(body: Mapping[str, object]) -> Iterator[Need]:
    for consumer in _items(body.get("consumerDataSet"), "consumerDataSet"):
        yield Resource(str(consumer.get("groupName") or ""), group=True), Perm.SUB
        for sub in _items(consumer.get("subscriptionDataSet"), "subscriptionDataSet"):
            yield Resource.topic(str(sub.get("topic") or "")), Perm.SUB


def _queue_lock(body: Mapping[str, object]) -> Iterator[Need]:
    yield Resource(str(body.get("consumerGroup") or ""), group=True), Perm.SUB
    for queue in _items(body.get("mqSet"), "mqSet"):
        yield Resource.topic(str(queue.get("topic") or "")), Perm.SUB


_BODIES: Final[Mapping[int, Callable[[Mapping[str, object]], Iterable[Need]]]] = {
    C.HEART_BEAT: _heartbeat,
    C.LOCK_BATCH_MQ: _queue_lock,
    C.UNLOCK_BATCH_MQ: _queue_lock,
}
