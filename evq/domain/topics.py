"""Topics: their config, permissions, names RocketMQ reserves, and name validation.

A topic's config is metadata (tenet 1): changes are events in the metadata topic, and this
module only says what a valid config is.
"""

from __future__ import annotations

import enum
import functools
import re

import attrs

from evq.domain.codes import BrokerError, ResponseCode

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_RW = PERM_READ | PERM_WRITE

MAX_TOPIC_LENGTH = 127  # the stored record keeps the topic length in one byte
_TOPIC_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")  # matched whole: fullmatch, so no "\n" ends it

AUTO_CREATE_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
# evq's own system topics: metadata events (tenet 1) and deliver-at timers.
META_TOPIC = "EVQ_SYS_META"
TIMER_TOPIC = "EVQ_SYS_TIMER"

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"

# Producers may not send to these; the broker writes them itself.
NOT_ALLOWED_SEND = frozenset({
    SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
    SELF_TEST_TOPIC, OFFSET_MOVED_EVENT, META_TOPIC, TIMER_TOPIC,
})


class TopicFilterType(enum.Enum):
    SINGLE_TAG = "SINGLE_TAG"
    MULTI_TAG = "MULTI_TAG"


@attrs.frozen(slots=True, kw_only=True)
class TopicConfig:
    """RocketMQ's ``TopicConfig``; its JSON form comes from :mod:`evq.domain.config_json`."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_RW
    order: bool = False
    topic_sys_flag: int = 0
    topic_filter_type: TopicFilterType = TopicFilterType.SINGLE_TAG

    def __attrs_post_init__(self) -> None:
        validate_topic(self.topic_name)
        for n in (self.read_queue_nums, self.write_queue_nums):
            if not 0 <= n <= 1024:
                raise BrokerError(ResponseCode.SYSTEM_ERROR,
                                  f"queue count {n} of topic {self.topic_name} is outside 0..1024")
        if not 0 <= self.perm <= 15:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"perm {self.perm} is not a perm value")

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def queue_count(self) -> int:
        """Queues that exist: RocketMQ accepts queue ids below the larger of the two counts."""
        return max(self.read_queue_nums, self.write_queue_nums)


def is_legal_topic_chars(name: str) -> bool:
    """Whether every character of ``name`` is in RocketMQ's topic alphabet (and there is one)."""
    return _TOPIC_CHARS.fullmatch(name) is not None


def validate_topic(name: str) -> None:
    """RocketMQ's ``TopicValidator`` rules; a bad name is a SYSTEM_ERROR as in Java."""
    if not name or not name.strip():
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "The specified topic is blank.")
    if len(name) > MAX_TOPIC_LENGTH:
        raise BrokerError(ResponseCode.SYSTEM_ERROR,
                          "The specified topic is longer than topic max length "
                          f"{MAX_TOPIC_LENGTH}.")
    if not is_legal_topic_chars(name):
        raise BrokerError(ResponseCode.SYSTEM_ERROR,
                          f"The specified topic[{name}] contains illegal characters, "
                          "allowing only ^[%|a-zA-Z0-9_-]+$")


@functools.lru_cache(maxsize=4096)
def check_send_allowed(topic: str) -> None:
    """Raises :class:`BrokerError` for a topic no producer may send to.  Every put asks, for
    the few topics a broker has: an answer that raised is not cached, one that passed is."""
    validate_topic(topic)
    if topic in NOT_ALLOWED_SEND:
        raise BrokerError(ResponseCode.NO_PERMISSION,
                          f"Sending message to topic[{topic}] is forbidden.")


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def is_system_topic(topic: str) -> bool:
    return topic in NOT_ALLOWED_SEND or topic == AUTO_CREATE_TOPIC
