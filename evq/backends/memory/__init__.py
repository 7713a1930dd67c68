"""The in-memory reference backend: the MessageLog port's executable specification.

It runs the key-value log (:mod:`evq.backends.kvlog.store`) over plain sorted in-memory
tables (:mod:`evq.backends.memory.tables`), with the same offsets, statuses and projections as
every other backend, and no durability beyond the process: a store reopened in the same
process finds its data while its directory is there, a crashed process loses it all.
"""

from evq.backends.memory.tables import MemoryDriver

__all__ = ["MemoryDriver"]
