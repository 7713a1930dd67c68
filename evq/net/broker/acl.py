"""The ACL check in front of every broker processor (``aclEnable=true``).

Each request is decided by :func:`evq.acl.verifier.verify` against the account file's current
version before its processor runs; a refusal is answered NO_PERMISSION (16) with the
verifier's reason as remark (RocketMQ answers its ``AclException`` as SYSTEM_ERROR; the issue
asks for the permission code, which stock clients report the same way).
"""

from __future__ import annotations

from evq.acl.verifier import Deny
from evq.domain.codes import ResponseCode
from evq.net.acl_check import RefusalLog, decide
from evq.net.acl_file import AclFile
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler, settled


def acl_checked(handler: Handler, acl: AclFile, refusals: RefusalLog) -> Handler:
    """``handler`` behind the ACL: it runs only for requests the accounts allow."""

    async def checked(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        decision = await decide(acl.config, conn.peer, cmd)
        if isinstance(decision, Deny):
            refusals.refused(conn, cmd, decision)
            return cmd.response(ResponseCode.NO_PERMISSION, decision.reason)
        return await settled(handler(conn, cmd))

    return checked
