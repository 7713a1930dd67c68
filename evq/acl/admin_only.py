"""Who may run an operator's request where only admin accounts may: the name server's writes.

RocketMQ's name server checks nothing, so anyone who reaches its port can unregister a broker
or delete a topic's routes.  evq's name server, given an ACL file, lets these requests through
only from an admin account of that file, checked as the broker checks a request: a client at a
global white address, or at the account's own white address, is trusted without a signature;
anyone else needs the account's valid signature.  Pure: the caller brings the accounts, the
request's fields and body, and the client's IP.
"""

from __future__ import annotations

from collections.abc import Mapping

from evq.acl.accounts import AclConfig
from evq.acl.signature import ACCESS_KEY, signature_matches


def admin_refusal(config: AclConfig, fields: Mapping[str, str], body: bytes, ip: str
                  ) -> str | None:
    """Why this request may not run an admin-only operation; None when it may."""
    if config.globally_trusted(ip):
        return None
    access_key = fields.get(ACCESS_KEY, "")
    if not access_key:
        return "this operation needs an admin account's signature; the request is not signed"
    account = config.account(access_key)
    if account is None:
        return f"no account {access_key!r}"
    if not account.admin:
        return f"account {access_key!r} is not an admin"
    if account.white_remote_address.matches(ip):
        return None
    if not signature_matches(account.secret_key, fields, body):
        return f"signature of account {access_key!r} does not match"
    return None
