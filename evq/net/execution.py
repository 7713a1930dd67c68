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
* **In a worker thread, in turn** (:class:`InTurn`): a put that writes metadata, and a
  batch of :data:`LARGE_WORK` bytes or more, split, put and answered there in one call (a
  4 MiB batch may hold 190,650 empty messages, a second of work), with the cycle collector
  paused (:func:`collector_paused`).  Puts that arrive meanwhile wait for it on the loop
  instead of appending past it, so a batch stays contiguous and puts keep arrival order.
* **On the store's own threads:** flushing (group commit) and cleaning; the loop learns of a
  flush through :class:`evq.net.durable.DurableWaker`, one wake-up a flush round.

:mod:`evq.net.loop_lag` measures how long the loop went without running (``evq bench net``
reports the longest stall under mixed load).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import attrs

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


@attrs.define(slots=True)
class InTurn:
    """Runs calls in arrival order when some of them run in a worker thread.

    A caller runs an inline call at once while :attr:`busy` is zero (the common case: one
    test, no coroutine) and through :meth:`inline` otherwise, where it queues behind the
    calls before it.  The lock is asyncio's, which wakes waiters first come, first served."""

    _lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    busy: int = attrs.field(default=0, init=False)
    """Calls holding or waiting for the lock; nonzero: a new call queues behind them.  A count
    in a slot rather than a property, since every send asks (the send lane reads it as a
    flag): a slot is read without a Python frame."""

    async def off_loop(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` in a worker thread once the calls before it are done."""
        self.busy += 1
        try:
            async with self._lock:
                return await asyncio.to_thread(fn)
        finally:
            self.busy -= 1

    async def inline(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on the loop, after the calls before it."""
        self.busy += 1
        try:
            async with self._lock:
                return fn()
        finally:
            self.busy -= 1


_paused = 0
_paused_lock = threading.Lock()
_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector while building and dropping many acyclic objects in a
    worker thread.  A full collection holds the GIL while it walks every live object, so the
    loop waits it out; pausing is bounded by the work (one request of bounded size).  Nested
    and concurrent pauses share one; the collector's state before the first is restored
    after the last, so a host program that disabled it keeps it disabled."""
    global _paused, _was_enabled
    with _paused_lock:
        if not _paused:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if not _paused and _was_enabled:
                gc.enable()
