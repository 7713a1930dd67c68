"""Long polling: a pull with nothing to read waits until its queue gets a matching message.

RocketMQ's PullRequestHoldService parks such pulls per ``topic@queueId`` and re-runs them when
the store dispatches a new entry (or when the client's suspend timeout is near).  Here a parked
pull is an asyncio future; the store's dispatch callback (on the store's thread) hands each
batch to the event loop, which resolves the futures whose queue passed their offset with an
entry their tag filter accepts.  Nothing polls, and with no pull parked the store does not even
call: the holds subscribe with their parked pulls as what they want (:meth:`PullHolds.listen`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import attrs

from evq.domain.log import Dispatched, MessageLog, TagFilter

QueueKey = tuple[str, int]


@attrs.define(slots=True)
class _Waiter:
    offset: int
    tag_filter: TagFilter | None
    future: asyncio.Future[bool]


class PullHolds:
    """Parked pulls of one broker; create it on the event loop that serves the pulls."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        # Changed in place, never rebound: the store's subscription holds it (listen).
        self._waiters: dict[QueueKey, list[_Waiter]] = {}

    def listen(self, log: MessageLog) -> Callable[[], None]:
        """Subscribe to ``log``'s dispatch, called only while a pull is parked; returns the
        unsubscribe function."""
        # The store looks at the parked pulls once a batch is readable, racily (a pull parked
        # meanwhile re-checks the store before it waits).
        return log.subscribe_dispatch(self.on_dispatch, wanted=self._waiters)

    def on_dispatch(self, batch: Sequence[Dispatched]) -> None:
        """The store's dispatch callback (while a pull is parked, see :meth:`listen`): safe
        from any thread."""
        self._loop.call_soon_threadsafe(self._wake, batch)

    def _wake(self, batch: Sequence[Dispatched]) -> None:
        for d in batch:
            waiters = self._waiters.get((d.topic, d.queue_id))
            if not waiters:
                continue
            keep: list[_Waiter] = []
            for w in waiters:
                if w.future.done():
                    continue
                if d.queue_offset >= w.offset and (
                    w.tag_filter is None or w.tag_filter(d.tags_code)
                ):
                    w.future.set_result(True)
                else:
                    keep.append(w)
            if keep:
                self._waiters[(d.topic, d.queue_id)] = keep
            else:
                del self._waiters[(d.topic, d.queue_id)]

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float,
                   tag_filter: TagFilter | None = None,
                   recheck: Callable[[], bool] | None = None) -> bool:
        """Wait until ``topic``/``queue_id`` gets an entry at or past ``offset`` that
        ``tag_filter`` accepts; False on timeout.  ``recheck`` closes the race with a message
        that arrived between the caller's read and the parking: if it says data is there
        already, return at once."""
        future: asyncio.Future[bool] = self._loop.create_future()
        key = (topic, queue_id)
        self._waiters.setdefault(key, []).append(_Waiter(offset, tag_filter, future))
        if recheck is not None and recheck():
            future.cancel()
            return True
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._discard(key, future)

    def _discard(self, key: QueueKey, future: asyncio.Future[bool]) -> None:
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        waiters[:] = [w for w in waiters if w.future is not future]
        if not waiters:
            del self._waiters[key]

    @property
    def parked(self) -> int:
        return sum(len(ws) for ws in self._waiters.values())

    def release_all(self) -> None:
        """On shutdown: answer every parked pull now (they re-read and answer what is there)."""
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.future.done():
                    w.future.set_result(False)
