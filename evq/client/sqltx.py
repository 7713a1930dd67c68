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
answered UNKNOWN (asked again later).  An older one is *fenced*: the check inserts the id with
ROLLBACK.  The id is the table's primary key, so of a late local transaction and the fence
exactly one insert commits; a local transaction that loses fails its insert, rolls back its
work and answers ROLLBACK too — the broker and the database never disagree, whatever the
timing.  :func:`decide` is the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import sqlalchemy as sa

from evq import logs
from evq.client.transactions import TransactionState
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.message import Message, Prop

log = logs.get_logger(__name__)

DEFAULT_TABLE: Final = "evq_transactions"
PENDING_MS: Final = 60_000
"""How long a local transaction may take: a missing id younger than this may still commit."""

Work = Callable[[sa.Connection, Message, object], None]
"""The application's local transaction: its writes go through the given connection."""


def decide(recorded: TransactionState | None, age_ms: int, pending_ms: int = PENDING_MS
           ) -> TransactionState:
    """The check-back answer: what the table recorded, else UNKNOWN while the local
    transaction may still be running, else ROLLBACK (which the check then records)."""
    if recorded is not None:
        return recorded
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
            sa.Column("committed", sa.Boolean, nullable=False),
            sa.Column("recorded_ms", sa.BigInteger, nullable=False, index=True),
        )
        metadata.create_all(engine)

    def listener(self, work: Work) -> SqlTransactionListener:
        """A :class:`~evq.client.transactions.TransactionListener` running ``work`` in the
        recording transaction."""
        return SqlTransactionListener(self, work)

    def run(self, work: Work, msg: Message, arg: object) -> TransactionState:
        """``work`` and the id's COMMIT row in one database transaction: COMMIT when it
        commits, ROLLBACK when anything in it raises — a fence included (nothing of it is
        then in the database)."""
        tx_id = msg.properties[Prop.UNIQ_KEY]
        try:
            with self.engine.begin() as conn:
                work(conn, msg, arg)
                self._record(conn, tx_id, TransactionState.COMMIT)
        except Exception:
            log.exception("local transaction rolled back", transaction_id=tx_id)
            return TransactionState.ROLLBACK
        return TransactionState.COMMIT

    def check(self, msg: Message) -> TransactionState:
        tx_id = msg.properties.get(Prop.UNIQ_KEY, "")
        state = decide(self.recorded(tx_id), self._clock.now_ms() - msg.born_timestamp,
                       self.pending_ms)
        if state is TransactionState.ROLLBACK and self.recorded(tx_id) is None:
            try:
                with self.engine.begin() as conn:
                    self._record(conn, tx_id, TransactionState.ROLLBACK)
            except sa.exc.IntegrityError:  # the local transaction committed just now
                state = decide(self.recorded(tx_id), 0, self.pending_ms)
        log.info("transaction checked", transaction_id=tx_id, state=state.name)
        return state

    def recorded(self, tx_id: str) -> TransactionState | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.table.c.committed).where(
                self.table.c.transaction_id == tx_id)).first()
        if row is None:
            return None
        return TransactionState.COMMIT if row.committed else TransactionState.ROLLBACK

    def prune(self, older_than_ms: int) -> int:
        """Forget ids recorded before ``older_than_ms`` (epoch ms) — once the broker can no
        longer ask about them (after transactionCheckMax checks); returns how many."""
        with self.engine.begin() as conn:
            result = conn.execute(self.table.delete().where(
                self.table.c.recorded_ms < older_than_ms))
        return int(result.rowcount)

    def _record(self, conn: sa.Connection, tx_id: str, state: TransactionState) -> None:
        conn.execute(self.table.insert().values(
            transaction_id=tx_id, committed=state is TransactionState.COMMIT,
            recorded_ms=self._clock.now_ms()))


class SqlTransactionListener:
    def __init__(self, transactions: SqlTransactions, work: Work) -> None:
        self._tx = transactions
        self._work = work

    def execute(self, msg: Message, arg: object) -> TransactionState:
        return self._tx.run(self._work, msg, arg)

    def check(self, msg: Message) -> TransactionState:
        return self._tx.check(msg)
