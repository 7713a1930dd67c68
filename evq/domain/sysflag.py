"""MessageSysFlag bits (RocketMQ ``MessageSysFlag``) and the helpers that read them."""

from __future__ import annotations

COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_MASK = 0xC
BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
NEED_UNWRAP = 0x40
INNER_BATCH = 0x80
COMPRESSION_TYPE_MASK = 0x700


NOT_CONSUMABLE = frozenset({TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE})
"""Transaction types that get no ConsumeQueue entry (test ``sysflag & TRANSACTION_MASK``)."""


def has_consume_queue_entry(sysflag: int) -> bool:
    """Only plain and committed records are consumable; prepared and rollback ones are not."""
    return sysflag & TRANSACTION_MASK not in NOT_CONSUMABLE
