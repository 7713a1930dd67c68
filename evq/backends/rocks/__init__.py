"""The RocksDB backend: the MessageLog port (:mod:`evq.backends.kvlog`) on RocksDB column
families through ``rocksdict``."""

from evq.backends.rocks.driver import RocksDriver

__all__ = ["RocksDriver"]
