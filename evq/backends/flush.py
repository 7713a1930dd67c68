"""Flush services: group commit for SYNC_FLUSH, a periodic flusher for ASYNC_FLUSH.

Two threads.  The log flusher serves durability: under SYNC_FLUSH writers park a request (log
end offset, callback, deadline) and the thread serves every parked request with a single msync
per round: the more writers wait, the more each flush carries (group commit).  Under
ASYNC_FLUSH it wakes every ``flush_interval_ms`` (or when the transient store pool's commit
service has written bytes to the files, :meth:`Flusher.wake`) and flushes when at least
``flush_least_pages`` dirty pages wait, or unconditionally every ``flush_thorough_interval_ms``.

A round does not start with the first request alone: the writers the last round released
come back one after another, each appending first, and a round started on the first of them
would leave the rest to the next msync, splitting the writers into groups that each wait for
two flushes.  So a round waits until as many requests are parked as the last round served, or
for as long as the last msync took, whichever comes first.

The projection flusher writes consume queues, index and checkpoint back every
``flush_consume_queue_interval_ms`` (a round it runs is ``periodic``: a backend may write a
costly part back less often, as the mmap store does its index head).  It has its own thread
because a sync acknowledgement needs only the CommitLog on disk (recovery rebuilds the
projections from it, as RocketMQ's does): flushing them in the group-commit thread held every
waiting writer up for the tens of milliseconds an index write-back takes.

Deadlines use real monotonic time, not the store's injected clock: a flush timeout is about
the disk, not about message time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from evq import logs
from evq.backends.config import StoreConfig
from evq.domain.log import FlushMode

log = logs.get_logger(__name__)
PAGE = 4096

DurableCallback = Callable[[bool], None]


class _Wakeup:
    """Parks one thread in :meth:`Flusher.wait` until the flusher calls it.

    A bare lock acquired twice: the cheapest hand-off CPython has (``threading.Event`` runs a
    Condition in Python code on both sides, several times the cost per acknowledgement)."""

    __slots__ = ("lock", "ok")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.ok = False

    def __call__(self, ok: bool) -> None:
        self.ok = ok
        self.lock.release()


class Flusher:
    def __init__(
        self,
        config: StoreConfig,
        *,
        written: Callable[[], int],
        flush_log: Callable[[int], int],
        flush_projections: Callable[[bool], None],
        durable: int,
    ):
        self._cfg = config
        self._written = written
        self._flush_log = flush_log
        self._flush_projections = flush_projections
        self.durable = durable
        self._log_epoch = 0  # one more each time the log is cut back or begins elsewhere
        self._cond = threading.Condition(threading.Lock())
        self._requests: list[tuple[int, DurableCallback, float]] = []
        self._expected = 1  # requests the last round served: the round to come waits for them
        self._stopping = False
        self._woken = False
        self._stop_projections = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evq-flush", daemon=True)
        self._projector = threading.Thread(
            target=self._run_projections, name="evq-flush-projections", daemon=True
        )
        self._thread.start()
        self._projector.start()

    @property
    def sync(self) -> bool:
        return self._cfg.flush is FlushMode.SYNC_FLUSH

    def request(self, end_offset: int, callback: DurableCallback, timeout: float) -> None:
        if not self.sync or end_offset <= self.durable:
            callback(True)
            return
        with self._cond:
            self._requests.append((end_offset, callback, time.monotonic() + timeout))
            if len(self._requests) in (1, self._expected):  # the idle or the gathering wait
                self._cond.notify()

    def round_start(self) -> int:
        """What a flush passes to :meth:`advance` once it returns; read it before the log end
        the flush goes to."""
        with self._cond:
            return self._log_epoch

    def advance(self, durable: int, started: int) -> None:
        """Raise the durable end to ``durable``, the end of a flush that began at
        :meth:`round_start` ``started``; never lower it.

        Flushes run on this service's thread and on any caller of the log's ``flush()`` at
        once, and one that started earlier (from a smaller target) may finish last: assigned
        as it came, its end took the durable end back below what a waiter had just been told
        was durable.  A flush that began before the log was cut back (:meth:`cut`) says
        nothing of the bytes written at those offsets since, and is not counted at all.
        """
        with self._cond:
            if started == self._log_epoch and durable > self.durable:
                self.durable = durable

    def cut(self, end: int) -> None:
        """The log was cut back to ``end``: the durable end goes no further, and flushes still
        in flight from before (:meth:`advance`) were flushing bytes that are gone; they must
        not vouch for what is written at those offsets from now on."""
        with self._cond:
            self._log_epoch += 1
            self.durable = min(self.durable, end)

    def restart(self, start: int) -> None:
        """The (empty) log now begins at ``start``: everything before it counts as durable,
        and no flush from before counts (see :meth:`cut`)."""
        with self._cond:
            self._log_epoch += 1
            self.durable = start

    def wake(self) -> None:
        """Start an ASYNC_FLUSH round now rather than at the end of the interval: the
        transient store pool's commit service calls this once it has written bytes to the
        files, as RocketMQ's commit service wakes its flush service."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    def wait(self, end_offset: int, timeout: float) -> bool:
        if not self.sync or end_offset <= self.durable:
            return True
        wakeup = _Wakeup()
        self.request(end_offset, wakeup, timeout)
        wakeup.lock.acquire()
        return wakeup.ok

    def _run(self) -> None:
        cfg = self._cfg
        last_thorough = time.monotonic()
        # Under SYNC_FLUSH records appended without a waiter still reach the disk this often.
        idle = (cfg.flush_consume_queue_interval_ms if self.sync else cfg.flush_interval_ms) / 1000
        gather = 0.0  # how long the last msync took
        while True:
            with self._cond:
                if self.sync:
                    if not self._requests and not self._stopping:
                        self._cond.wait(timeout=idle)
                    if 0 < len(self._requests) < self._expected and not self._stopping:
                        self._cond.wait(timeout=gather)
                else:
                    self._cond.wait_for(lambda: self._stopping or self._woken, timeout=idle)
                    self._woken = False
                stopping = self._stopping
                pending, self._requests = self._requests, []
                self._expected = max(len(pending), 1)
            now = time.monotonic()
            try:
                started = self.round_start()
                target = self._written()
                if self.sync or stopping:
                    self.advance(self._flush_log(target), started)
                    gather = time.monotonic() - now
                elif (
                    target - self.durable >= cfg.flush_least_pages * PAGE
                    or now - last_thorough >= cfg.flush_thorough_interval_ms / 1000
                ):
                    self.advance(self._flush_log(target), started)
                    last_thorough = now
            except Exception:  # keep the service alive; waiters time out and see the error
                log.exception("flush_failed")
            keep: list[tuple[int, DurableCallback, float]] = []
            durable = self.durable
            for req in pending:
                end, cb, deadline = req
                if end <= durable:
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

    def _run_projections(self) -> None:
        interval = self._cfg.flush_consume_queue_interval_ms / 1000
        while not self._stop_projections.wait(interval):
            try:
                self._flush_projections(True)
            except Exception:
                log.exception("projection_flush_failed")

    def close(self) -> None:
        """Stop both threads; the log is flushed a last time, the projections are the
        caller's to flush once appends have stopped."""
        self._stop_projections.set()
        self._projector.join()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
