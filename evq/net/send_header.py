"""SendMessageRequestHeaderV2's one-letter field names, and the rule for when a send uses them.

Kept apart from the send processor because the ACL verifier must read a send's topic exactly
as the processor will: a request carrying both ``topic`` and ``b`` is checked against the
topic it is stored under, never the other one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from evq.net.codes import RequestCode

# SendMessageRequestHeaderV2's one-letter names, in RocketMQ's order.
V2_NAMES: Final = dict(zip("abcdefghijklmn", (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch", "bname"), strict=True))


def is_v2(code: int, fields: Mapping[str, str]) -> bool:
    """Whether a send's header uses V2's names: SEND_MESSAGE_V2 always; batches and replies
    carry either header, and V2's when ``b`` (the topic) is there."""
    return code == RequestCode.SEND_MESSAGE_V2 or "b" in fields


def long_names(code: int, fields: Mapping[str, str]) -> dict[str, str]:
    """``fields`` with V2's short names spelled out (unchanged when they are V1's)."""
    if not is_v2(code, fields):
        return dict(fields)
    return {V2_NAMES.get(k, k): v for k, v in fields.items()}
