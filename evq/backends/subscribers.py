"""Dispatch subscribers: who hears about records once the projections hold them.

Every backend keeps them the same way, so long polling and the metadata projection see the
same events whichever store runs underneath.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence, Sized

from evq import logs
from evq.domain.log import DispatchCallback, Dispatched

log = logs.get_logger(__name__)

Listener = tuple[DispatchCallback, Sized | None]
"""A subscriber and what it waits for (see :meth:`DispatchSubscribers.subscribe`)."""


class DispatchSubscribers:
    __slots__ = ("_lock", "listeners")

    def __init__(self) -> None:
        self.listeners: tuple[Listener, ...] = ()
        """Who listens, in subscription order.  Replaced on each change, never changed in
        place: a notification walks it without copying it, and the mmap store's compiled
        append reads it as :meth:`notify` does (evq/backends/mmapfile/store_kernels.pyx)."""
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        """Whether anyone listens: the append path builds no event list otherwise."""
        return bool(self.listeners)

    def subscribe(self, callback: DispatchCallback,
                  wanted: Sized | None = None) -> Callable[[], None]:
        """Add ``callback``; ``wanted``, if given, is a collection of the callback's own that
        is empty while it has nothing to do with a batch (no parked pull, no slave): it is
        not called then.  Looked at as the callback would look at it itself, after the batch
        is readable, but by the container's length, in C: a broker's listeners are idle on
        most sends, and each was a Python call a send."""
        listener = (callback, wanted)
        with self._lock:
            self.listeners = (*self.listeners, listener)

        def unsubscribe() -> None:
            with self._lock:
                listeners = list(self.listeners)
                for i, other in enumerate(listeners):
                    if other is listener:  # this subscription's, though the same may be twice
                        del listeners[i]
                        self.listeners = tuple(listeners)
                        break

        return unsubscribe

    def notify(self, batch: Sequence[Dispatched]) -> None:
        """Hand ``batch`` to every subscriber that wants it; one that fails is logged, not
        fatal."""
        for callback, wanted in self.listeners:
            if wanted is None or wanted:
                try:
                    callback(batch)
                except Exception:
                    self.failed()

    def failed(self) -> None:
        """Log the exception a subscriber raised (called while it is being handled)."""
        log.exception("dispatch_subscriber_failed")
