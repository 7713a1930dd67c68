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
    __slots__ = ("_callbacks", "_lock")

    def __init__(self) -> None:
        self._callbacks: list[DispatchCallback] = []
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        """Whether anyone listens: the append path builds no event list otherwise."""
        return bool(self._callbacks)

    def subscribe(self, callback: DispatchCallback) -> Callable[[], None]:
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def notify(self, batch: Sequence[Dispatched]) -> None:
        """Hand ``batch`` to every subscriber; one that fails is logged, not fatal."""
        for cb in list(self._callbacks):
            try:
                cb(batch)
            except Exception:
                log.exception("dispatch_subscriber_failed")
