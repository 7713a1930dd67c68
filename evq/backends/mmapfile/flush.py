"""Flush services: group commit for SYNC_FLUSH, a periodic flusher for ASYNC_FLUSH.

One thread does both jobs.  Under SYNC_FLUSH writers park a request (log end offset, callback,
deadline) and the thread serves all parked requests with a single fdatasync per round: the
more writers wait, the more each flush carries (group commit).  Under ASYNC_FLUSH it wakes
every ``flush_interval_ms`` and flushes when at least ``flush_least_pages`` dirty pages wait,
or unconditionally every ``flush_thorough_interval_ms``.  Consume queues, index and checkpoint
follow every ``flush_consume_queue_interval_ms``.

Deadlines use real monotonic time, not the store's injected clock: a flush timeout is about
the disk, not about message time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from evq.backends.config import StoreConfig
from evq.domain.log import FlushMode

log = structlog.get_logger(__name__)
PAGE = 4096

DurableCallback = Callable[[bool], None]


class Flusher:
    def __init__(
        self,
        config: StoreConfig,
        *,
        written: Callable[[], int],
        flush_log: Callable[[int], int],
        flush_projections: Callable[[], None],
        durable: int,
    ):
        self._cfg = config
        self._written = written
        self._flush_log = flush_log
        self._flush_projections = flush_projections
        self.durable = durable
        self._cond = threading.Condition()
        self._requests: list[tuple[int, DurableCallback, float]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="evq-flush", daemon=True)
        self._thread.start()

    @property
    def sync(self) -> bool:
        return self._cfg.flush is FlushMode.SYNC_FLUSH

    def request(self, end_offset: int, callback: DurableCallback, timeout: float) -> None:
        if not self.sync or end_offset <= self.durable:
            callback(True)
            return
        with self._cond:
            self._requests.append((end_offset, callback, time.monotonic() + timeout))
            self._cond.notify()

    def wait(self, end_offset: int, timeout: float) -> bool:
        if not self.sync or end_offset <= self.durable:
            return True
        done = threading.Event()
        result: list[bool] = []

        def finish(ok: bool) -> None:
            result.append(ok)
            done.set()

        self.request(end_offset, finish, timeout)
        done.wait()
        return result[0]

    def _run(self) -> None:
        cfg = self._cfg
        last_projection = last_thorough = time.monotonic()
        interval = cfg.flush_interval_ms / 1000
        while True:
            with self._cond:
                if self.sync:
                    while not self._requests and not self._stopping:
                        if not self._cond.wait(timeout=cfg.flush_consume_queue_interval_ms / 1000):
                            break
                else:
                    self._cond.wait_for(lambda: self._stopping, timeout=interval)
                stopping = self._stopping
                pending, self._requests = self._requests, []
            now = time.monotonic()
            try:
                target = self._written()
                if self.sync or stopping:
                    self.durable = self._flush_log(target)
                elif (
                    target - self.durable >= cfg.flush_least_pages * PAGE
                    or now - last_thorough >= cfg.flush_thorough_interval_ms / 1000
                ):
                    self.durable = self._flush_log(target)
                    last_thorough = now
                if stopping or now - last_projection >= cfg.flush_consume_queue_interval_ms / 1000:
                    self._flush_projections()
                    last_projection = now
            except Exception:  # keep the service alive; waiters time out and see the error
                log.exception("flush_failed")
            keep: list[tuple[int, DurableCallback, float]] = []
            for req in pending:
                end, cb, deadline = req
                if end <= self.durable:
                    cb(True)
                elif now >= deadline or stopping:
                    cb(False)
                else:
                    keep.append(req)
            if keep:  # the flush failed: retry shortly rather than spin
                with self._cond:
                    self._requests[:0] = keep
                    self._cond.wait(timeout=0.01)
            if stopping:
                return

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
