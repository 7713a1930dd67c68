"""A transactional producer that dies between its database commit and END_TRANSACTION.

``python -m tests.client.tx_child NAMESRV DB_URL TOPIC GROUP BODY`` sends one half message, runs
the local transaction through :class:`evq.client.sqltx.SqlTransactions` (the row and the
transaction id commit together), prints ``committed <transaction id>`` and then waits to be
killed: the half is stored, the database says it committed, nobody told the broker.
"""

from __future__ import annotations

import asyncio
import sys

import sqlalchemy as sa

from evq.client.sqltx import SqlTransactions
from evq.client.transactions import TransactionProducer, TransactionState
from evq.domain.message import Message, Prop, new_message
from evq.net.transport import new_event_loop
from tests.client.tx_tables import orders, record_order


class DieAfterCommit:
    def __init__(self, transactions: SqlTransactions) -> None:
        self._tx = transactions

    def execute(self, msg: Message, arg: object) -> TransactionState:
        state = self._tx.run(record_order, msg, arg)
        print("committed", msg.properties[Prop.UNIQ_KEY], state.name, flush=True)
        sys.stdin.read()  # until killed
        return state

    def check(self, msg: Message) -> TransactionState:
        return self._tx.check(msg)


async def main(namesrv: str, url: str, topic: str, group: str, body: str) -> None:
    engine = sa.create_engine(url)
    orders.metadata.create_all(engine)
    listener = DieAfterCommit(SqlTransactions(engine))
    async with TransactionProducer(group, namesrv, listener) as producer:
        await producer.send_in_transaction(new_message(topic, body.encode()), body)


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main(*sys.argv[1:6]))
