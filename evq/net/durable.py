"""Acknowledging writes once the log is durable, for every coroutine of one event loop.

Under SYNC_FLUSH each send waits for the group commit that covers it.  Asking the log once per
message (``on_durable`` with a callback that hops back to the loop) costs a flusher request and
a loop wake-up per message; the flusher serves a round with one msync anyway.  The waker keeps
at most one request outstanding, for the highest offset waiting, and settles every waiter the
round covers at once.  The request is made once the loop has run everything ready: the writers
a round released come back within that one loop pass, append, and all join the next request,
rather than the first of them taking a round alone and the rest waiting for the one after.
"""

from __future__ import annotations

import asyncio

from evq.domain.log import MessageLog


class DurableWaker:
    def __init__(self, loop: asyncio.AbstractEventLoop, log: MessageLog, timeout: float):
        self._loop = loop
        self._log = log
        self._timeout = timeout
        self._waiting: list[tuple[int, float, asyncio.Future[bool]]] = []
        self._requested = False

    def wait(self, end_offset: int) -> asyncio.Future[bool]:
        """A future that becomes True once the log is durable up to ``end_offset``, False
        if that takes longer than the timeout (the data is stored either way)."""
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._waiting.append((end_offset, self._loop.time() + self._timeout, fut))
        if not self._requested:
            self._requested = True
            self._loop.call_soon(self._request)
        return fut

    def _request(self) -> None:
        end = max(e for e, _, _ in self._waiting)
        timeout = max(0.0, min(d for _, d, _ in self._waiting) - self._loop.time())
        loop, settle = self._loop, self._settle
        self._log.on_durable(end, lambda ok: loop.call_soon_threadsafe(settle, end, ok), timeout)

    def _settle(self, end: int, ok: bool) -> None:
        durable = self._log.durable_offset
        if ok:  # durable as far as the flush policy asks, even if the disk lags (ASYNC_FLUSH)
            durable = max(durable, end)
        now = self._loop.time()
        keep = []
        for item in self._waiting:
            end_offset, deadline, fut = item
            if end_offset <= durable or now >= deadline:
                if not fut.done():
                    fut.set_result(end_offset <= durable)
            else:
                keep.append(item)
        self._waiting = keep
        self._requested = bool(keep)
        if keep:
            self._loop.call_soon(self._request)
