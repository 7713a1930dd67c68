"""Dispatch subscribers: who hears about records once the projections hold them.

Every backend keeps them the same way, so long polling and the metadata projection see the
same events whichever store runs underneath.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from evq import logs
from evq.domain.log import DispatchCallback, Dispatched

log = logs.get_logger(__name__)


class DispatchSubscribers:
    __slots__ = ("_lock", "callbacks")

    def __init__(self) -> None:
        self.callbacks: tuple[DispatchCallback, ...] = ()
        """Who listens, in subscription order.  Replaced on each change, never changed in
        place: a notification walks it without copying it, and the mmap store's compiled
        append reads it as :meth:`notify` does (evq/backends/mmapfile/store_kernels.pyx)."""
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        """Whether anyone listens: the append path builds no event list otherwise."""
        return bool(self.callbacks)

    def subscribe(self, callback: DispatchCallback) -> Callable[[], None]:
        with self._lock:
            self.callbacks = (*self.callbacks, callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = list(self.callbacks)
                if callback in callbacks:
                    callbacks.remove(callback)
                    self.callbacks = tuple(callbacks)

        return unsubscribe

    def notify(self, batch: Sequence[Dispatched]) -> None:
        """Hand ``batch`` to every subscriber; one that fails is logged, not fatal."""
        for cb in self.callbacks:
            try:
                cb(batch)
            except Exception:
                self.failed()

    def failed(self) -> None:
        """Log the exception a subscriber raised (called while it is being handled)."""
        log.exception("dispatch_subscriber_failed")
