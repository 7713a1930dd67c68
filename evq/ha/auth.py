"""Which slaves a master admits: a challenge-response over an admin account of the ACL.

A stranger who reaches the HA port must not be able to read the whole log by posing as a
slave.  When the master broker has an ACL, it greets every connection with a fresh random
nonce; the slave answers with an access key and ``HMAC-SHA1(secretKey, label + nonce +
accessKey)``, and the master streams nothing, and answers nothing about its log, until that
MAC is the one the account's secret gives and the account is an admin.  The secret never
crosses the wire, and since the nonce is new on every connection, a proof recorded on one
connection is worth nothing on another (no replay).  The label keeps an HA proof from ever
being mistaken for a remoting signature or the other way round.  Pure: the caller brings the
nonce, the accounts and the bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from evq.acl.accounts import AclConfig
from evq.acl.signature import Credentials
from evq.ha.frames import Proof

PROOF_LABEL: Final = b"evq-ha-slave\x00"


def proof_mac(secret_key: str, nonce: bytes, access_key: str) -> bytes:
    message = PROOF_LABEL + nonce + access_key.encode("utf-8")
    return hmac.new(secret_key.encode("utf-8"), message, hashlib.sha1).digest()


def prove(credentials: Credentials, nonce: bytes) -> Proof:
    """The slave's proof for this connection's ``nonce``."""
    return Proof(credentials.access_key,
                 proof_mac(credentials.secret_key, nonce, credentials.access_key))


def refusal(proof: Proof, nonce: bytes, accounts: AclConfig) -> str | None:
    """Why the master does not admit this slave; None when it does."""
    account = accounts.account(proof.access_key)
    if account is None:
        return f"no account {proof.access_key!r}"
    if not account.admin:
        return f"account {proof.access_key!r} is not an admin"
    if not hmac.compare_digest(proof.mac,
                               proof_mac(account.secret_key, nonce, proof.access_key)):
        return f"proof of account {proof.access_key!r} does not match"
    return None
