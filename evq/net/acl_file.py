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
from evq.acl.signature import ACCESS_KEY
from evq.acl.verifier import Decision, Deny, verify
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection

log = logs.get_logger(__name__)

POLL_S: Final = 1.0
BIG_BODY: Final = 256 * 1024
"""Bodies past this are signature-checked in a worker thread: HMAC over a 4 MiB batch takes
milliseconds the event loop should spend on other connections (hashlib releases the GIL)."""
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


def peer_ip(peer: str) -> str:
    """The address part of a connection's ``ip:port`` (IPv6 addresses contain colons too)."""
    return peer.rpartition(":")[0] or peer


async def decide(config: AclConfig, peer: str, cmd: RemotingCommand) -> Decision:
    """:func:`~evq.acl.verifier.verify` for a request that came from ``peer``, off the event
    loop when its body is big."""
    args = (config, peer_ip(peer), cmd.code, cmd.ext_fields, cmd.body)
    return await asyncio.to_thread(verify, *args) if len(cmd.body) > BIG_BODY else verify(*args)


class RefusalLog:
    """Logs refused requests, a bounded number per connection: a client that retries a
    forbidden request in a loop gets its first :data:`LOGGED_PER_CONNECTION` refusals logged,
    then one line with the total when it disconnects, never a line a request (which would let
    any client fill the server's disk).  Runs on the event loop, which owns the counts."""

    LOGGED_PER_CONNECTION: Final = 10

    def __init__(self, event: str) -> None:
        self._event = event
        self._counts: dict[int, int] = {}

    def refused(self, conn: Connection, cmd: RemotingCommand, decision: Deny) -> None:
        count = self._counts.get(conn.id, 0) + 1
        if count == 1:
            conn.add_close_callback(self._closed)
        self._counts[conn.id] = count
        if count <= self.LOGGED_PER_CONNECTION:
            log.warning(self._event, peer=conn.peer, code=cmd.code,
                        access_key=cmd.ext_fields.get(ACCESS_KEY), reason=decision.reason,
                        refusals=count)

    def _closed(self, conn: Connection) -> None:
        count = self._counts.pop(conn.id, 0)
        if count > self.LOGGED_PER_CONNECTION:
            log.warning(f"{self._event}_total", peer=conn.peer, refusals=count,
                        logged=self.LOGGED_PER_CONNECTION)
