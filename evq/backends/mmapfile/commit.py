"""The commit service: RocketMQ's ``CommitRealTimeService`` for the transient store pool.

With the pool on (:mod:`evq.backends.mmapfile.transient_pool`) appends land in memory
buffers, and this thread moves them into the CommitLog's files: every
``commit_interval_ms`` (commitIntervalCommitLog, 200 ms) it writes the buffers' new bytes
with ``pwrite`` when at least ``commit_least_pages`` pages wait (commitCommitLogLeastPages,
4), and whatever waits every ``commit_thorough_interval_ms`` (commitCommitLogThoroughInterval,
200 ms).  Then it wakes the flusher, which syncs what was committed.  ``pwrite`` releases the
GIL, so a commit of megabytes does not stop the appending threads.

Readers see committed bytes only, so arrivals are announced when their records are committed:
the append path hands its dispatch events (long polling wake-ups, projections) to
:meth:`CommitService.defer`, and a commit delivers those whose records it wrote, in append
order.  A woken pull therefore always finds its records.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

from evq import logs
from evq.backends.config import StoreConfig
from evq.backends.mmapfile.mapped_file import MappedFileQueue
from evq.domain.log import Dispatched

log = logs.get_logger(__name__)
PAGE = 4096


class CommitService:
    def __init__(
        self,
        queue: MappedFileQueue,
        config: StoreConfig,
        *,
        notify: Callable[[Sequence[Dispatched]], None],
        committed: Callable[[], None],
        failed: Callable[[OSError], None],
    ):
        """``notify`` announces deferred arrivals; ``committed`` runs after each commit that
        wrote something (it wakes the flusher); ``failed`` hears of a commit's OSError (the
        bytes stay in the buffers, and the next round tries again)."""
        self._queue = queue
        self._cfg = config
        self._notify = notify
        self._committed = committed
        self._failed = failed
        self._deferred: collections.deque[tuple[int, list[Dispatched]]] = collections.deque()
        self._deliver = threading.Lock()  # arrivals leave in append order, whoever commits
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evq-commit", daemon=True)
        self._thread.start()

    def defer(self, end: int, batch: list[Dispatched]) -> None:
        """Announce ``batch`` once the log is committed up to ``end`` (called in append
        order, under the put lock)."""
        self._deferred.append((end, batch))

    def commit_now(self) -> int:
        """Commit everything written, deliver the arrivals it covers; returns the committed
        end of the log."""
        end = self._queue.commit()
        with self._deliver:
            ready: list[Dispatched] = []
            deferred = self._deferred
            while deferred and deferred[0][0] <= end:
                ready += deferred.popleft()[1]
            if ready:
                self._notify(ready)
        return end

    def _run(self) -> None:
        cfg = self._cfg
        least = cfg.commit_least_pages * PAGE
        thorough = cfg.commit_thorough_interval_ms / 1000
        last_thorough = time.monotonic()
        while not self._stop.wait(cfg.commit_interval_ms / 1000):
            queue = self._queue
            waiting = queue.max_offset - queue.read_end
            now = time.monotonic()
            if waiting <= 0 or (waiting < least and now - last_thorough < thorough):
                continue
            last_thorough = now
            try:
                self.commit_now()
            except OSError as exc:
                log.warning("commit_failed", bytes_waiting=waiting, error=str(exc))
                self._failed(exc)
                continue
            except Exception:  # keep the service alive; the next round retries
                log.exception("commit_failed")
                continue
            self._committed()

    def close(self) -> None:
        """Stop the thread (the caller's last flush commits what is left)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
