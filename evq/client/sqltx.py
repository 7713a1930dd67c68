"""The local-message-table pattern without its polling job: transaction ids in the same database
transaction as the application's writes.

Seed 001's "local message table" makes a database change and a message agree by writing the
message to a table in the same database transaction and relaying it later with a poller.  With
half messages the relay is not needed: the half is already stored, and all the broker needs to
learn is whether the database transaction committed.  So :meth:`SqlTransactions.listener`
runs the application's work and inserts the transaction id in ONE database transaction, and the
check-back answers from that table: the id is there exactly when the work committed, whoever
asks and whenever (the producer that sent the half may be long dead).

An id that is not there yet may belong to a transaction still running (a check can arrive
while a slow local transaction holds its locks), so a half younger than ``pending_ms`` is
answered UNKNOWN (asked again later) and only an older one is rolled back: see
:func:`decide`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import sqlalchemy as sa
import structlog

from evq.client.transactions import TransactionState
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.message import Message, Prop

log = structlog.get_logger(__name__)

DEFAULT_TABLE: Final = "evq_transactions"
PENDING_MS: Final = 60_000
"""How long a local transaction may take: a missing id younger than this may still commit."""

Work = Callable[[sa.Connection, Message, object], None]
"""The application's local transaction: its writes go through the given connection."""


def decide(committed: bool, age_ms: int, pending_ms: int = PENDING_MS) -> TransactionState:
    """The check-back answer from the table: committed ids commit; a missing id rolls back
    once no transaction that started with the half can still be running."""
    if committed:
        return TransactionState.COMMIT
    return TransactionState.UNKNOWN if age_ms < pending_ms else TransactionState.ROLLBACK


class SqlTransactions:
    """Transaction ids in a table of the application's own database (any SQLAlchemy URL)."""

    def __init__(self, engine: sa.Engine, *, table: str = DEFAULT_TABLE,
                 pending_ms: int = PENDING_MS, clock: Clock = SYSTEM_CLOCK) -> None:
        self.engine = engine
        self.pending_ms = pending_ms
        self._clock = clock
        metadata = sa.MetaData()
        self.table = sa.Table(
            table, metadata,
            sa.Column("transaction_id", sa.String(64), primary_key=True),
            sa.Column("committed_ms", sa.BigInteger, nullable=False, index=True),
        )
        metadata.create_all(engine)

    def listener(self, work: Work) -> SqlTransactionListener:
        """A :class:`~evq.client.transactions.TransactionListener` running ``work`` in the
        recording transaction."""
        return SqlTransactionListener(self, work)

    def run(self, work: Work, msg: Message, arg: object) -> TransactionState:
        """``work`` and the id's row in one database transaction: COMMIT when it commits,
        ROLLBACK when anything in it raises (nothing of it is then in the database)."""
        tx_id = msg.properties[Prop.UNIQ_KEY]
        try:
            with self.engine.begin() as conn:
                work(conn, msg, arg)
                conn.execute(self.table.insert().values(transaction_id=tx_id,
                                                        committed_ms=self._clock.now_ms()))
        except Exception:
            log.exception("local transaction rolled back", transaction_id=tx_id)
            return TransactionState.ROLLBACK
        return TransactionState.COMMIT

    def check(self, msg: Message) -> TransactionState:
        tx_id = msg.properties.get(Prop.UNIQ_KEY, "")
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(self.table.c.transaction_id).where(
                self.table.c.transaction_id == tx_id)).first() is not None
        state = decide(found, self._clock.now_ms() - msg.born_timestamp, self.pending_ms)
        log.info("transaction checked", transaction_id=tx_id, state=state.name)
        return state

    def prune(self, older_than_ms: int) -> int:
        """Forget ids committed before ``older_than_ms`` (epoch ms) — once the broker can no
        longer ask about them (after transactionCheckMax checks); returns how many."""
        with self.engine.begin() as conn:
            result = conn.execute(self.table.delete().where(
                self.table.c.committed_ms < older_than_ms))
        return int(result.rowcount)


class SqlTransactionListener:
    def __init__(self, transactions: SqlTransactions, work: Work) -> None:
        self._tx = transactions
        self._work = work

    def execute(self, msg: Message, arg: object) -> TransactionState:
        return self._tx.run(self._work, msg, arg)

    def check(self, msg: Message) -> TransactionState:
        return self._tx.check(msg)
