"""The ACL check in front of every broker processor (``aclEnable=true``).

Each request is decided by :func:`evq.acl.verifier.verify` against the account file's current
version before its processor runs; a refusal is answered NO_PERMISSION (16) with the
verifier's reason as remark (RocketMQ answers its ``AclException`` as SYSTEM_ERROR; the issue
asks for the permission code, which stock clients report the same way).
"""

from __future__ import annotations

import asyncio
from typing import Final

from evq import logs
from evq.acl.verifier import Deny, verify
from evq.domain.codes import ResponseCode
from evq.net.acl_file import AclFile
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

log = logs.get_logger(__name__)

BIG_BODY: Final = 256 * 1024
"""Bodies past this are signed-checked in a worker thread: HMAC over a 4 MiB batch takes
milliseconds the event loop should spend on other connections (hashlib releases the GIL)."""


def peer_ip(peer: str) -> str:
    """The address part of a connection's ``ip:port`` (IPv6 addresses contain colons too)."""
    return peer.rpartition(":")[0] or peer


def acl_checked(handler: Handler, acl: AclFile) -> Handler:
    """``handler`` behind the ACL: it runs only for requests the accounts allow."""

    async def checked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        args = (acl.config, peer_ip(conn.peer), cmd.code, cmd.ext_fields, cmd.body)
        decision = (await asyncio.to_thread(verify, *args) if len(cmd.body) > BIG_BODY
                    else verify(*args))
        if isinstance(decision, Deny):
            log.info("acl_refused", peer=conn.peer, code=cmd.code, reason=decision.reason)
            return cmd.response(ResponseCode.NO_PERMISSION, decision.reason)
        return await handler(conn, cmd)

    return checked
