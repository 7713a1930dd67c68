"""The LMDB backend: the MessageLog port (:mod:`evq.backends.kvlog`) on an LMDB environment."""

from evq.backends.lmdb.driver import LmdbDriver

__all__ = ["LmdbDriver"]
