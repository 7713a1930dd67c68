"""Metadata projection tables on any SQLAlchemy database.

The rows are what :meth:`evq.domain.metadata.MetadataState.apply` says changed; each commit
writes them and the watermark in one transaction, so after a crash the database is exactly the
log replayed up to its watermark.  Only portable SQL is used (delete + insert rather than a
dialect's upsert), so SQLite, PostgreSQL and MySQL all work.

    evq_watermark            id=1 | queue_offset | physical_offset
    evq_topics               topic_name | config (JSON)
    evq_subscription_groups  group_name | config (JSON)
    evq_consumer_offsets     group_name | topic | queue_id | queue_offset
    evq_service_progress     service | value (JSON)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from evq import durable_fs, logs
from evq.domain.metadata import Change, MetadataStore, MetadataWriteError, Table, Watermark

log = logs.get_logger(__name__)

_md = sa.MetaData()
_watermark = sa.Table(
    "evq_watermark", _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("queue_offset", sa.BigInteger, nullable=False),
    sa.Column("physical_offset", sa.BigInteger, nullable=False),
)
_tables: dict[Table, sa.Table] = {
    Table.TOPICS: sa.Table(
        "evq_topics", _md,
        sa.Column("topic_name", sa.String(255), primary_key=True),
        sa.Column("config", sa.JSON, nullable=False),
    ),
    Table.GROUPS: sa.Table(
        "evq_subscription_groups", _md,
        sa.Column("group_name", sa.String(255), primary_key=True),
        sa.Column("config", sa.JSON, nullable=False),
    ),
    Table.OFFSETS: sa.Table(
        "evq_consumer_offsets", _md,
        sa.Column("group_name", sa.String(255), primary_key=True),
        sa.Column("topic", sa.String(255), primary_key=True),
        sa.Column("queue_id", sa.Integer, primary_key=True),
        sa.Column("queue_offset", sa.BigInteger, nullable=False),
    ),
    Table.PROGRESS: sa.Table(
        "evq_service_progress", _md,
        sa.Column("service", sa.String(255), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
    ),
}


def _key_columns(table: sa.Table) -> list[sa.Column[object]]:
    return list(table.primary_key.columns)


def _value_column(table: sa.Table) -> sa.Column[object]:
    return next(c for c in table.columns if not c.primary_key)


class SqlMetadataStore(MetadataStore):
    def __init__(self, url: str) -> None:
        self._engine = sa.create_engine(url)
        _md.create_all(self._engine)

    @classmethod
    def in_dir(cls, data_dir: str | os.PathLike[str]) -> SqlMetadataStore:
        """The default: ``<data dir>/meta.sqlite``.

        SQLite syncs the file and, when it creates a journal, the directory; the database
        file's own entry, and the directories above it, are made durable here, once."""
        path = Path(data_dir) / "meta.sqlite"
        durable_fs.make_dirs(path.parent)
        store = cls(f"sqlite:///{path}")
        try:
            durable_fs.sync_path(path.parent)
        except BaseException:
            store.close()
            raise
        return store

    def load(self) -> tuple[list[Change], Watermark]:
        rows: list[Change] = []
        with self._engine.connect() as conn:
            for kind, table in _tables.items():
                keys, value = _key_columns(table), _value_column(table)
                for r in conn.execute(sa.select(*keys, value)):
                    rows.append(Change(kind, tuple(r[:-1]), r[-1]))
            w = conn.execute(sa.select(_watermark.c.queue_offset, _watermark.c.physical_offset)
                             .where(_watermark.c.id == 1)).first()
        return rows, Watermark(w[0], w[1]) if w else Watermark()

    def commit(self, changes: Sequence[Change], watermark: Watermark) -> None:
        try:
            self._commit(changes, watermark)
        except sa.exc.OperationalError as exc:  # a full disk (SQLITE_FULL), a lost server
            raise MetadataWriteError(f"metadata commit failed: {exc.orig}") from exc

    def _commit(self, changes: Sequence[Change], watermark: Watermark) -> None:
        with self._engine.begin() as conn:
            for c in changes:
                table = _tables[c.table]
                keys = _key_columns(table)
                match = sa.and_(*(col == v for col, v in zip(keys, c.key, strict=True)))
                conn.execute(table.delete().where(match))
                if c.value is not None:
                    row = {col.name: v for col, v in zip(keys, c.key, strict=True)}
                    row[_value_column(table).name] = c.value
                    conn.execute(table.insert().values(**row))
            conn.execute(_watermark.delete())
            conn.execute(_watermark.insert().values(
                id=1, queue_offset=watermark.queue_offset,
                physical_offset=watermark.physical_offset))

    def clear(self) -> None:
        with self._engine.begin() as conn:
            for table in (*_tables.values(), _watermark):
                conn.execute(table.delete())

    def close(self) -> None:
        self._engine.dispose()
