"""Ending a half message: END_TRANSACTION (37), from the producer, and
CHECK_TRANSACTION_STATE (39), the broker asking a producer of the group about a half it holds.

``commitOrRollback`` carries the message sysflag's transaction type
(:data:`evq.domain.sysflag.TRANSACTION_COMMIT_TYPE`, ``..._ROLLBACK_TYPE``, ``..._NOT_TYPE``
for "unknown"), as in RocketMQ.
"""

from __future__ import annotations

from evq.net.headers import BOOL, INT, LONG, Header, header, wire


@header
class EndTransactionRequest(Header):
    producer_group: str = wire("producerGroup")
    tran_state_table_offset: int = wire("tranStateTableOffset", LONG)
    """The half's queue offset."""
    commit_log_offset: int = wire("commitLogOffset", LONG)
    """The half's commit-log offset."""
    commit_or_rollback: int = wire("commitOrRollback", INT)
    from_transaction_check: bool = wire("fromTransactionCheck", BOOL, default=False)
    msg_id: str | None = wire("msgId", default=None)
    transaction_id: str | None = wire("transactionId", default=None)


@header
class CheckTransactionStateRequest(Header):
    tran_state_table_offset: int = wire("tranStateTableOffset", LONG)
    commit_log_offset: int = wire("commitLogOffset", LONG)
    msg_id: str | None = wire("msgId", default=None)
    """The half's UNIQ_KEY."""
    transaction_id: str | None = wire("transactionId", default=None)
    offset_msg_id: str | None = wire("offsetMsgId", default=None)
