"""Subscription groups: the per-consumer-group settings the broker enforces."""

from __future__ import annotations

import re

import attrs

from evq.domain.codes import BrokerError, ResponseCode

_GROUP_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")  # matched whole: fullmatch, so no "\n" ends it
MAX_GROUP_LENGTH = 255


def validate_group(name: str) -> None:
    if not name or len(name) > MAX_GROUP_LENGTH or not _GROUP_CHARS.fullmatch(name):
        shown = repr(name) if len(name) <= 64 else f"{name[:64]!r}... ({len(name)} characters)"
        raise BrokerError(ResponseCode.SYSTEM_ERROR,
                          f"the group name {shown} is blank, longer than {MAX_GROUP_LENGTH} or "
                          "has characters outside ^[%|a-zA-Z0-9_-]+$")


@attrs.frozen(slots=True, kw_only=True)
class SubscriptionGroupConfig:
    """RocketMQ's ``SubscriptionGroupConfig`` with its defaults."""

    group_name: str = attrs.field()
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    @group_name.validator
    def _valid(self, _a: object, name: str) -> None:
        validate_group(name)
