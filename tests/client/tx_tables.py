"""The application table of the transaction tests: an order row written by the local
transaction, in the same database transaction as its transaction id."""

from __future__ import annotations

import sqlalchemy as sa

from evq.domain.message import Message

orders = sa.Table("orders", sa.MetaData(), sa.Column("name", sa.String(64), primary_key=True))


def record_order(conn: sa.Connection, msg: Message, arg: object) -> None:
    conn.execute(orders.insert().values(name=str(arg)))
