"""An account file kept current: ``plain_acl.yml`` read at start, read again when it changes.

RocketMQ watches its ACL file and applies edits without a restart; so does evq.  The file is
stat'ed every :data:`POLL_S` seconds in a worker thread (never on the event loop) and re-read
when its modification time, size or inode changed (an editor's rename-over counts).  A new
version that does not parse is logged with the reason and *not* applied: the accounts in force
stay the last good ones, never a half-read file and never none.  A file that is missing or bad
at start is an error, so a server never starts open when its operator asked for an ACL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Final

from evq import logs
from evq.acl.accounts import AclConfig, AclFileError, parse_acl

log = logs.get_logger(__name__)

POLL_S: Final = 1.0

_Stamp = tuple[int, int, int]


def _stamp(path: Path) -> _Stamp:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _read(path: Path) -> tuple[_Stamp, AclConfig]:
    """The file's stamp and accounts; the stamp is taken first, so a write racing the read
    changes the stamp again and is read on the next poll."""
    stamp = _stamp(path)
    try:
        return stamp, parse_acl(path.read_text(encoding="utf-8"))
    except AclFileError as exc:
        raise AclFileError(f"{path}: {exc}") from None


class AclFile:
    """The accounts of ``path``, current to within :data:`POLL_S`; :meth:`start` loads them
    (raising :class:`~evq.acl.accounts.AclFileError` for a file missing, unreadable or not
    valid) and starts the watch."""

    def __init__(self, path: Path, *, poll_s: float = POLL_S) -> None:
        self.path = path
        self._poll_s = poll_s
        self._stamp: _Stamp | None = None
        self._config = AclConfig()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        """The last reload failed: said once in the log, not at every poll."""

    @property
    def config(self) -> AclConfig:
        """The accounts in force."""
        return self._config

    async def start(self) -> None:
        try:
            self._stamp, self._config = await asyncio.to_thread(_read, self.path)
        except OSError as exc:
            raise AclFileError(f"cannot read ACL file {self.path}: "
                               f"{exc.strerror or exc}") from None
        log.info("acl_loaded", file=str(self.path), accounts=len(self._config.accounts))
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def reload_if_changed(self) -> bool:
        """Read the file again if it changed; whether new accounts are now in force."""
        try:
            stamp = await asyncio.to_thread(_stamp, self.path)
            if stamp == self._stamp:
                return False
            stamp, config = await asyncio.to_thread(_read, self.path)
        except (OSError, AclFileError) as exc:
            if not self._failing:
                log.error("acl_reload_failed", file=str(self.path), error=str(exc),
                          kept_accounts=len(self._config.accounts))
            self._failing = True
            with contextlib.suppress(OSError):  # a bad version is read once, not every poll
                self._stamp = await asyncio.to_thread(_stamp, self.path)
            return False
        self._failing = False
        self._stamp, self._config = stamp, config
        log.info("acl_reloaded", file=str(self.path), accounts=len(config.accounts))
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self.reload_if_changed()
