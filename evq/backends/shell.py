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
* the service thread, which samples disk use every ``disk_check_interval_s`` (never per
  message: ``statvfs`` of the store root) and expires the log per
  :func:`evq.backends.rules.clean_due` every ``clean_interval_s``;
* the disk guard (:mod:`evq.backends.disk`): above the warning level, or once an allocation
  found no space, every put is refused (SERVICE_NOT_AVAILABLE) until a later sample finds
  room again, without a restart.  Disk use is also sampled at open and whenever the log
  starts a segment.  Reads go on throughout; :attr:`StoreShell.disk_status` tells the broker
  why puts are refused;
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
from collections.abc import Callable, Sized
from pathlib import Path

from evq import durable_fs, logs
from evq.backends import disk, rules
from evq.backends.config import StoreConfig
from evq.backends.flush import Flusher
from evq.backends.subscribers import DispatchSubscribers
from evq.domain.clock import Clock
from evq.domain.log import DiskStatus, DispatchCallback, LogClosed, LogLocked, MessageLog
from evq.domain.message import host_bytes
from evq.domain.record import TagsCodeFn

log = logs.get_logger(__name__)


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
        self._service: threading.Thread | None = None
        self._stop = threading.Event()
        # The disk guard's state, changed under the put lock.  ``_refused`` is what appends
        # read: the ratio's refusal, else the allocation's.
        self._disk_ratio = 0.0
        self._ratio_refused = ""
        self._space_refused = ""
        self._space_need = 0
        self._refused = ""

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

    def _flush_projections(self, periodic: bool = False) -> None:
        """Write the projections back (and whatever records how far they reach).
        ``periodic``: the projection flusher's round, which may leave a part whose write-back
        costs more than the recovery work it saves to a longer interval of its own; an
        explicit flush and closing write everything."""

    @abc.abstractmethod
    def _release_files(self) -> None:
        """Close what the backend opened; called once, also after a failed open."""

    def _allocate_again(self) -> None:
        """Retry what an allocation that found no space left undone (under the put lock),
        once the disk has room again; raises OSError if it still cannot."""

    # --- opening ---------------------------------------------------------------------------

    def _start(self, background: bool) -> None:
        """Lock, recover, mark open and start the services; on failure release everything.

        ``background=False`` runs no service thread (tests drive :meth:`expire` themselves, and
        disk use is sampled only at open and at new segments).
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
            self._mark_open(root / "abort")
        self._check_disk()
        self._prepare_appends()
        self._flusher = Flusher(
            self.config, written=self._log_end, flush_log=self._flush_log,
            flush_projections=self._flush_projections, durable=self._log_end(),
        )
        if background:
            self._service = threading.Thread(target=self._service_loop, name="evq-store",
                                             daemon=True)
            self._service.start()

    def _mark_open(self, marker: Path) -> None:
        """Put the abort marker down.  On a full disk the store opens without it, with a
        warning: a crash of this run is then recovered as a clean shutdown would be (the
        last segments checked), which is still better than not serving at all."""
        try:
            durable_fs.touch(marker)
        except OSError as exc:
            if not disk.no_space(exc):
                raise
            log.warning("abort_marker_not_written", path=str(marker), error=str(exc))

    # --- durability ------------------------------------------------------------------------

    def wait_durable(self, end_offset: int, timeout: float) -> bool:
        return self._running_flusher().wait(end_offset, timeout)

    def on_durable(self, end_offset: int, callback: Callable[[bool], None], timeout: float) -> None:
        self._running_flusher().request(end_offset, callback, timeout)

    def make_readable(self, end_offset: int) -> None:
        """Readable once appended (the mmap store with a transient store pool overrides)."""

    def _running_flusher(self) -> Flusher:
        if self._flusher is None:
            raise LogClosed("the log is closed")
        return self._flusher

    @property
    def durable_offset(self) -> int:
        return self._flusher.durable if self._flusher else self._log_end()

    def flush(self) -> None:
        flusher = self._running_flusher()
        started = flusher.round_start()
        flusher.advance(self._flush_log(self._log_end()), started)
        self._flush_projections()

    @property
    def max_record_size(self) -> int:
        return self._max_record

    def subscribe_dispatch(self, callback: DispatchCallback,
                           wanted: Sized | None = None) -> Callable[[], None]:
        # Under the put lock: an append decides as it starts whether to report its batch (it
        # builds reports only for listeners), so one under way when a listener comes would
        # go unreported to it; it finishes first, and the listener's first read sees it.
        with self._put_lock:
            return self._subscribers.subscribe(callback, wanted)

    # --- disk guard and cleaning ----------------------------------------------------------

    @property
    def disk_status(self) -> DiskStatus:
        return DiskStatus(str(self.root), self._disk_ratio, self._refused)

    def _usage(self) -> tuple[int, int, int]:
        """``(total, used, free)`` bytes of the file system holding the store."""
        path = self.root
        while not path.exists():  # an in-memory store's directory may be gone
            path = path.parent
        return shutil.disk_usage(path)

    def _note_usage(self) -> float:
        """Sample disk use and refuse or take puts by the warning level; returns the ratio."""
        total, used, _free = self._usage()
        ratio = used / total if total else 0.0
        with self._put_lock:
            self._disk_ratio = ratio
            self._ratio_refused = disk.ratio_refusal(self.config, ratio, self.root)
            self._update_refused()
        return ratio

    def _check_disk(self) -> float:
        """:meth:`_note_usage`, and once as much space is free as an allocation lacked, try it
        again (:meth:`_allocate_again`): puts resume when it succeeds."""
        ratio = self._note_usage()
        if self._space_refused and self._usage()[2] >= self._space_need:
            with self._put_lock:
                if self._closed:
                    return ratio
                try:
                    self._allocate_again()
                except OSError as exc:
                    if not disk.no_space(exc):
                        raise
                else:
                    self._space_refused = ""
                self._update_refused()
        return ratio

    def _found_no_space(self, error: BaseException, need: int | None = None) -> None:
        """An allocation (or a write of ``need`` bytes) found no space: refuse puts until
        that much is free and :meth:`_allocate_again` succeeds.  An allocation's error says
        where and how much (:class:`evq.backends.disk.NoSpace`)."""
        if need is None:
            need = error.need if isinstance(error, disk.NoSpace) else disk.WRITE_SLACK
        filename = getattr(error, "filename", None)
        with self._put_lock:
            self._space_need = need
            self._space_refused = disk.space_refusal(Path(filename or self.root), need, error)
            self._update_refused()

    def _update_refused(self) -> None:
        refused = self._ratio_refused or self._space_refused
        if refused and not self._refused:
            log.warning("puts_refused", path=str(self.root), used_ratio=round(self._disk_ratio, 4),
                        reason=refused)
        elif self._refused and not refused:
            log.info("puts_resumed", path=str(self.root), used_ratio=round(self._disk_ratio, 4))
        self._refused = refused

    def _service_loop(self) -> None:
        cfg = self.config
        next_clean = time.monotonic() + cfg.clean_interval_s
        while not self._stop.wait(cfg.disk_check_interval_s):
            try:
                ratio = self._check_disk()
                if time.monotonic() >= next_clean:
                    next_clean = time.monotonic() + cfg.clean_interval_s
                    due, force = rules.clean_due(cfg, self._clock.now_ms(), ratio)
                    if due:
                        self.expire(force=force)
            except Exception:
                log.exception("store_service_failed")

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        with self._put_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._service is not None:
            self._service.join()
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
        try:
            self._release_files()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing drops the flock
                self._lock_fd = -1
