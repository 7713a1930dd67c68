"""Allow or refuse one request against the accounts, in RocketMQ's order.

``PlainPermissionManager.validate`` decides, and so does :func:`verify`, step by step:

1. a client at a global white address passes;
2. the request must name an ``AccessKey`` ("No accessKey is configured") of a known account
   ("No acl config for <ak>");
3. a client at the account's own white address passes (RocketMQ's rule: the address stands in
   for the signature, and for the permissions too);
4. the ``Signature`` must be the account's ("Check signature failed for accessKey=<ak>");
5. a send to ``RMQ_SYS_TRACE_TOPIC`` passes (message traces go there from every producer);
6. admin-only codes need an admin account;
7. an admin passes; any other account needs each resource's permission: its ``topicPerms`` /
   ``groupPerms`` entry when it has one, else its default; DENY refuses.

The reasons are RocketMQ's words, so operators can search for them; none contains a secret.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from evq.acl.accounts import AclConfig, Perm
from evq.acl.resources import ADMIN_CODES, TRACE_TOPIC, Resource, UnreadableRequest, needs
from evq.acl.signature import ACCESS_KEY, signature_matches


@attrs.frozen(slots=True)
class Allow:
    access_key: str | None
    """The account the request was checked as; None when a white address let it in."""


@attrs.frozen(slots=True)
class Deny:
    reason: str


Decision = Allow | Deny


def verify(config: AclConfig, ip: str, code: int, fields: Mapping[str, str],
           body: bytes) -> Decision:
    """The decision for a request from a client at ``ip`` (the bare address, no port)."""
    if config.globally_trusted(ip):
        return Allow(None)
    access_key = fields.get(ACCESS_KEY)
    if access_key is None:
        return Deny("No accessKey is configured")
    account = config.account(access_key)
    if account is None:
        return Deny(f"No acl config for {access_key}")
    if account.white_remote_address.matches(ip):
        return Allow(access_key)
    if not signature_matches(account.secret_key, fields, body):
        return Deny(f"Check signature failed for accessKey={access_key}")
    try:
        needed = needs(code, fields, body)
    except UnreadableRequest as exc:
        return Deny(f"Cannot tell what request code={code} touches: {exc}")
    if needed == [(Resource(TRACE_TOPIC), Perm.PUB)]:
        return Allow(access_key)
    if code in ADMIN_CODES and not account.admin:
        return Deny(f"Need admin permission for request code={code}, "
                    f"but accessKey={access_key} is not")
    if account.admin:
        return Allow(access_key)
    for resource, perm in needed:
        owned = account.group_perm(resource.name) if resource.group else account.topic_perm(
            resource.name)
        if not owned.grants(perm):
            return Deny(f"No permission for {resource} (needs {perm.name}) "
                        f"for accessKey={access_key}")
    return Allow(access_key)
