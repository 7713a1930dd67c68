"""Applying the ACL to one request on a server: the decision (off the event loop when the
body is big) and the bounded log of refusals.  The broker runs it before every processor
(:mod:`evq.net.broker.acl`), the name server before its write codes."""

from __future__ import annotations

import asyncio
from typing import Final

from evq import logs
from evq.acl.accounts import AclConfig
from evq.acl.signature import ACCESS_KEY
from evq.acl.verifier import Decision, Deny, verify
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection

log = logs.get_logger(__name__)

BIG_BODY: Final = 256 * 1024
"""Bodies past this are signature-checked in a worker thread: HMAC over a 4 MiB batch takes
milliseconds the event loop should spend on other connections (hashlib releases the GIL)."""


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
