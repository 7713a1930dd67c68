"""Which work runs on the event loop and which runs elsewhere, and why.

The loop is shared by every connection of a server, so one request that holds it stalls all
of them (and a C++ client drops its connection when a heartbeat waits over 3 s).  The rule:

* **On the loop:** framing, dispatch, and store calls that touch only memory and the page
  cache: appending a message (a copy into a mapped segment), reading a queue, lookups.  They
  cost microseconds, and a thread hop would cost more than the work.  The servers' handlers
  start inside the read callback (:class:`~evq.net.transport.Dispatcher`'s ``eager``), so a
  request that needs nothing else is answered before the loop turns, with no task at all.
* **In a worker thread** (:func:`blocking`): any call that may wait on a disk, a lock held
  across disk work or a peer: metadata writes (a topic or group auto-created, an offsets
  snapshot) append, wait for durability (up to the flush timeout under SYNC_FLUSH) and commit
  SQLite; opening and closing a store.
* **In a worker thread when large** (:func:`sized`): work proportional to a request's bytes,
  such as inflating a compressed batch; below :data:`LARGE_WORK` bytes it runs inline, where
  the thread hop would cost more than the work.
* **On the store's own threads:** flushing (group commit) and cleaning; the loop learns of a
  flush through :class:`evq.net.durable.DurableWaker`, one wake-up a flush round.

:mod:`evq.net.loop_lag` measures how long the loop went without running (``evq bench net``
reports the longest stall under mixed load).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

_T = TypeVar("_T")

LARGE_WORK: Final = 64 * 1024
"""Bytes of input above which size-proportional work leaves the loop (~0.1 ms of zlib)."""


async def blocking(fn: Callable[..., _T], *args: object) -> _T:
    """Run ``fn(*args)``, which may wait on disk, in a worker thread."""
    return await asyncio.to_thread(fn, *args)


async def sized(size: int, fn: Callable[..., _T], *args: object) -> _T:
    """Run ``fn(*args)`` inline when its input of ``size`` bytes is small, else in a worker
    thread (zlib and the record codec release the GIL for large buffers)."""
    if size < LARGE_WORK:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
