"""PULL_MESSAGE requests and answers, shared by the push and pull consumers.

The answer's body is the stored records back to back (:func:`evq.domain.record.decode_records`);
the client filters them by tag again (the broker matches tag hash codes, which may collide) and
gives a retried message back its real topic, so a listener never sees ``%RETRY%<group>``.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from evq.client.errors import BrokerRefused, ClientError
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.filters import TAG_SEPARATOR
from evq.domain.message import Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.record import RecordError, decode_records
from evq.net.codes import RequestCode
from evq.net.headers.pull import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    PullRequest,
    PullResponse,
)
from evq.net.protocol import HeaderFieldError, RemotingCommand, serialization_for

SUSPEND_MS: Final = 15_000
LONG_POLL_TIMEOUT_S: Final = 30.0
"""Socket timeout of a parked pull: well above the broker's hold (at most 25 s)."""


class PullStatus(enum.Enum):
    FOUND = ResponseCode.SUCCESS
    NO_NEW_MSG = ResponseCode.PULL_NOT_FOUND
    NO_MATCHED_MSG = ResponseCode.PULL_RETRY_IMMEDIATELY
    OFFSET_ILLEGAL = ResponseCode.PULL_OFFSET_MOVED


STATUS_OF_CODE: Final = {s.value: s for s in PullStatus}
"""A dict lookup per pull instead of an enum call."""


@attrs.frozen(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[Message]
    suggest_which_broker_id: int = 0


@attrs.frozen(slots=True)
class Subscription:
    topic: str
    expression: str = "*"
    expression_type: str = "TAG"
    version: int = 0

    def tags(self) -> frozenset[str] | None:
        """The tags a TAG expression accepts; None for ``*`` or an SQL92 expression."""
        if self.expression_type != "TAG" or self.expression.strip() in ("", "*"):
            return None
        return frozenset(t.strip() for t in self.expression.split(TAG_SEPARATOR) if t.strip())


def pull_request(group: str, queue: MessageQueue, offset: int, sub: Subscription, *,
                 max_nums: int = 32, commit_offset: int = -1, suspend_ms: int = SUSPEND_MS
                 ) -> RemotingCommand:
    """The PULL_MESSAGE of ``queue`` from ``offset``, its header in the serialization
    :func:`serialization_for` picks (a consumer's most frequent request, like a send)."""
    flags = FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend_ms > 0 else 0)
    if commit_offset > 0:
        flags |= FLAG_COMMIT_OFFSET
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, PullRequest.write(
        consumer_group=group, topic=queue.topic, queue_id=queue.queue_id, queue_offset=offset,
        max_msg_nums=max_nums, sys_flag=flags, commit_offset=max(commit_offset, 0),
        suspend_timeout_millis=suspend_ms, subscription=sub.expression,
        sub_version=sub.version, expression_type=sub.expression_type))
    cmd.serialize_type = serialization_for(cmd.ext_fields)
    return cmd


def restore_topic(msg: Message) -> Message:
    """A message from ``%RETRY%<group>`` under the topic it was first sent to."""
    real = msg.properties.get(Prop.RETRY_TOPIC)
    if real and msg.topic.startswith(tp.RETRY_PREFIX):
        msg.topic = real
    return msg


def parse_pull(answer: RemotingCommand, sub: Subscription) -> PullResult:
    """The answer as a :class:`PullResult`; other codes raise :class:`BrokerRefused`."""
    status = STATUS_OF_CODE.get(answer.code)
    if status is None:
        raise BrokerRefused(answer.code, answer.remark, "pull")
    try:
        h = PullResponse.read(answer.ext_fields)
        found = decode_records(answer.body) if status is PullStatus.FOUND else []
    except (HeaderFieldError, RecordError) as exc:
        raise ClientError(f"unreadable pull answer: {exc}") from None
    return PullResult(status, h.next_begin_offset, h.min_offset, h.max_offset,
                      restored(matching(found, sub.tags())), h.suggest_which_broker_id)


def restored(msgs: list[Message]) -> list[Message]:
    """:func:`restore_topic` of each message, looked at only when a retry topic is there."""
    # A set of the topics first: an answer's records share one topic (one str object, when
    # the compiled codec decodes them), so this is one hash per message and one startswith.
    if not any(topic.startswith(tp.RETRY_PREFIX) for topic in {m.topic for m in msgs}):
        return msgs
    return [restore_topic(m) for m in msgs]


def matching(msgs: list[Message], tags: frozenset[str] | None) -> list[Message]:
    return msgs if tags is None else [m for m in msgs if m.tags in tags]
