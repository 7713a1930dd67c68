"""The store shell: one life cycle around every backend, as RocketMQ's DefaultMessageStore.

Every backend opens, flushes, cleans and closes the same way, so that is written here once
and a backend (:class:`~evq.backends.mmapfile.store.MmapMessageLog`,
:class:`~evq.backends.kvlog.store.KeyedMessageLog`) supplies only what differs: appending,
reading, expiry, and the hooks below.

What the shell owns::

    root/lock    flock held while open (one process per store)
    root/abort   exists while open: found at start = the last run crashed

* opening: lock the directory, note the abort marker, let the backend recover
  (:meth:`StoreShell._recover`), then put the marker down and start the services;
* the flusher (:class:`~evq.backends.flush.Flusher`): group commit under SYNC_FLUSH,
  periodic under ASYNC_FLUSH, over the backend's :meth:`StoreShell._flush_log` and
  :meth:`StoreShell._flush_projections`;
* the cleaner thread, which expires the log per :func:`evq.backends.rules.clean_due`;
* closing: stop the services, flush a last time, release the backend's files
  (:meth:`StoreShell._release_files`) and the lock, and take the marker away.

A store that keeps nothing on disk (the in-memory reference) has no lock and no marker.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from evq import durable_fs
from evq.backends import rules
from evq.backends.config import StoreConfig
from evq.backends.flush import Flusher
from evq.backends.subscribers import DispatchSubscribers
from evq.domain.clock import Clock
from evq.domain.log import DispatchCallback, LogClosed, LogLocked, MessageLog
from evq.domain.message import host_bytes
from evq.domain.record import TagsCodeFn

log = structlog.get_logger(__name__)


class StoreShell(MessageLog):
    """The life cycle every backend shares; see the module docstring.

    A backend's ``open`` builds the instance and calls :meth:`_start`; everything it holds is
    released by :meth:`_release_files`, also when opening fails half way."""

    def __init__(
        self, root: Path, config: StoreConfig, clock: Clock, tags_code_fn: TagsCodeFn, *,
        persistent: bool = True,
    ):
        self.root = root
        self.config = config
        self._clock = clock
        self._tags_code_fn = tags_code_fn
        self._persistent = persistent
        self._host = host_bytes(config.store_host)
        self._max_record = rules.max_record_size(config)
        self._put_lock = threading.RLock()
        self._closed = False
        self._last_store_ts = 0
        self._subscribers = DispatchSubscribers()
        self._lock_fd = -1
        self._flusher: Flusher | None = None
        self._cleaner: threading.Thread | None = None
        self._stop = threading.Event()

    # --- what a backend supplies -----------------------------------------------------------

    @abc.abstractmethod
    def _recover(self, abnormal: bool) -> tuple[int, int]:
        """Load the backend's files and bring log and projections to a consistent end
        (``abnormal``: the last run crashed); returns ``(log end, bytes cut)``."""

    def _prepare_appends(self) -> None:
        """Ready the first append once recovered and marked open (a segment to write in)."""

    @abc.abstractmethod
    def _log_end(self) -> int:
        """The end of what :meth:`_flush_log` makes durable: every byte written below it."""

    @abc.abstractmethod
    def _flush_log(self, target: int) -> int:
        """Make the log durable up to at least ``target``; returns the durable end."""

    def _flush_projections(self) -> None:
        """Write the projections back (and whatever records how far they reach)."""

    @abc.abstractmethod
    def _release_files(self) -> None:
        """Close what the backend opened; called once, also after a failed open."""

    # --- opening ---------------------------------------------------------------------------

    def _start(self, background: bool) -> None:
        """Lock, recover, mark open and start the services; on failure release everything.

        ``background=False`` runs no cleaner thread (tests drive :meth:`expire` themselves).
        """
        try:
            self._open_shell(background)
        except BaseException:
            self._release()
            raise

    def _open_shell(self, background: bool) -> None:
        root = self.root
        abnormal = False
        if self._persistent:
            durable_fs.make_dirs(root)
            self._lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LogLocked(f"{root} is in use by another process") from None
            abnormal = (root / "abort").exists()
        started = time.monotonic()
        end, cut = self._recover(abnormal)
        log.info(
            "store_recovered", path=str(root), abnormal=abnormal, log_end=end, cut_bytes=cut,
            queues=len(self.queues()), seconds=round(time.monotonic() - started, 3),
        )
        if self._persistent:
            durable_fs.touch(root / "abort")
        self._prepare_appends()
        self._flusher = Flusher(
            self.config, written=self._log_end, flush_log=self._flush_log,
            flush_projections=self._flush_projections, durable=self._log_end(),
        )
        if background:
            self._cleaner = threading.Thread(target=self._clean_loop, name="evq-clean",
                                             daemon=True)
            self._cleaner.start()

    # --- durability ------------------------------------------------------------------------

    def wait_durable(self, end_offset: int, timeout: float) -> bool:
        return self._running_flusher().wait(end_offset, timeout)

    def on_durable(self, end_offset: int, callback: Callable[[bool], None], timeout: float) -> None:
        self._running_flusher().request(end_offset, callback, timeout)

    def _running_flusher(self) -> Flusher:
        if self._flusher is None:
            raise LogClosed("the log is closed")
        return self._flusher

    @property
    def durable_offset(self) -> int:
        return self._flusher.durable if self._flusher else self._log_end()

    def flush(self) -> None:
        flusher = self._running_flusher()
        flusher.durable = max(flusher.durable, self._flush_log(self._log_end()))
        self._flush_projections()

    @property
    def max_record_size(self) -> int:
        return self._max_record

    def subscribe_dispatch(self, callback: DispatchCallback) -> Callable[[], None]:
        return self._subscribers.subscribe(callback)

    # --- cleaning --------------------------------------------------------------------------

    def disk_used_ratio(self) -> float:
        usage = shutil.disk_usage(self.root if self.root.exists() else self.root.parent)
        return usage.used / usage.total if usage.total else 0.0

    def _clean_loop(self) -> None:
        while not self._stop.wait(self.config.clean_interval_s):
            try:
                due, force = rules.clean_due(self.config, self._clock.now_ms(),
                                             self.disk_used_ratio())
                if due:
                    self.expire(force=force)
            except Exception:
                log.exception("clean_failed")

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        with self._put_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._cleaner is not None:
            self._cleaner.join()
        if self._flusher is not None:
            self._flusher.close()
            self._flush_projections()
            self._flusher = None
        end = self._log_end()
        self._release()
        if self._persistent:
            with contextlib.suppress(FileNotFoundError):
                (self.root / "abort").unlink()
        log.info("store_closed", path=str(self.root), log_end=end)

    def _release(self) -> None:
        self._release_files()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = -1
