"""The metadata projection on SQLAlchemy (SQLite file in the data dir by default)."""

from evq.meta.sql import SqlMetadataStore

__all__ = ["SqlMetadataStore"]
