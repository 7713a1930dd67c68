"""An account file a server enforces, reloaded when it changes.

RocketMQ watches ``plain_acl.yml`` and applies an edited file without a restart; so does
:class:`AclFile`.  It polls the file's identity (modification time, size and inode: an editor
that writes a new file and renames it over the old one changes the inode even within one
mtime tick) every second, reads and parses it off the event loop, and swaps the whole
:class:`~evq.acl.accounts.AclConfig` in at once, so a request is checked against one version
of the file, never a mix.  A new file that cannot be read or parsed is logged as an error and
the accounts in force stay: a typo must not open or close the cluster.  Broker, name server
and HA server each hold one.
"""

from __future__ import annotations

import asyncio
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


def read_acl(path: Path) -> tuple[AclConfig, _Stamp]:
    """The accounts in ``path`` and the identity of what was read; :class:`AclFileError`
    naming the file when it cannot be read or parsed."""
    try:
        before = _stamp(path)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AclFileError(f"cannot read ACL file {path}: {reason}") from None
    try:
        return parse_acl(text), before
    except AclFileError as exc:
        raise AclFileError(f"{path}: {exc}") from None


class AclFile:
    """The accounts of one file, current as of the last poll; ``config`` is what to check
    requests against now."""

    def __init__(self, path: Path, config: AclConfig, stamp: _Stamp) -> None:
        self.path = path
        self.config = config
        self._stamp = stamp

    @classmethod
    async def open(cls, path: Path) -> AclFile:
        """Read ``path`` (off the loop); :class:`AclFileError` when a server should refuse to
        start rather than run without the accounts it was told to enforce."""
        config, stamp = await asyncio.to_thread(read_acl, path)
        log.info("acl_loaded", file=str(path), accounts=len(config.accounts))
        return cls(path, config, stamp)

    async def watch(self, interval: float = POLL_S) -> None:
        """Reload on change until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.reload_if_changed()

    async def reload_if_changed(self) -> bool:
        """Apply the file if it changed since it was last read; whether it was applied."""
        try:
            stamp = await asyncio.to_thread(_stamp, self.path)
        except OSError as exc:
            if self._stamp != (0, 0, 0):  # say so once, not every second
                log.error("acl_file_unreadable_keeping_accounts", file=str(self.path),
                          error=exc.strerror)
                self._stamp = (0, 0, 0)
            return False
        if stamp == self._stamp:
            return False
        try:
            config, read = await asyncio.to_thread(read_acl, self.path)
        except AclFileError as exc:
            log.error("acl_file_invalid_keeping_accounts", file=str(self.path), error=str(exc))
            self._stamp = stamp  # logged once; a further edit is tried again
            return False
        self.config, self._stamp = config, read
        log.info("acl_reloaded", file=str(self.path), accounts=len(config.accounts))
        return True
