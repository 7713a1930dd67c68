"""The request signature RocketMQ's ACL checks (``AclClientRPCHook`` / ``PlainAccessValidator``).

A signed request carries, in its extFields, ``AccessKey`` (the account), ``Signature`` and,
from some clients, ``SecurityToken`` and ``OnsChannel``.  The signature is::

    base64( HMAC-SHA1( secretKey, UTF-8( values of every extField except "Signature",
                                         in key order, concatenated ) + body ) )

Key order is Java's ``TreeMap`` order (UTF-16 code units); extField keys are ASCII, where that
is code-point order.  Both stock clients sign this way: Java adds ``AccessKey`` (and a
non-empty ``SecurityToken``) before signing, the C++ client ``AccessKey`` and ``OnsChannel``;
the broker signs back whatever fields arrived, so any field a client adds is covered, except
QUERY_MESSAGE's ``_UNIQUE_KEY_QUERY`` flag: RocketMQ's verifier (``PlainAccessValidator.parse``,
since 4.7) leaves it out of what it checks, so a signer that covered it would be refused by a
RocketMQ broker, and evq leaves it out on both sides.
Values are signed as the strings the broker sees (a JSON number ``3`` is ``"3"``), which is
why the header must be coerced to strings before :func:`sign` runs on either side.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

import attrs

ACCESS_KEY: Final = "AccessKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"
UNIQUE_KEY_QUERY: Final = "_UNIQUE_KEY_QUERY"  # RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG
UNSIGNED_FIELDS: Final = frozenset({SIGNATURE, UNIQUE_KEY_QUERY})


@attrs.frozen(slots=True, repr=False)
class Credentials:
    """An account's key pair; ``repr`` leaves the secret out so it never reaches a log."""

    access_key: str
    secret_key: str

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r})"


def signed_content(fields: Mapping[str, str], body: bytes) -> bytes:
    """The bytes a signature covers: sorted field values (:data:`UNSIGNED_FIELDS` left out),
    then the body."""
    text = "".join(fields[k] for k in sorted(fields) if k not in UNSIGNED_FIELDS)
    return text.encode("utf-8") + body


def sign(secret_key: str, fields: Mapping[str, str], body: bytes) -> str:
    """The base64 HMAC-SHA1 of :func:`signed_content` under ``secret_key``."""
    mac = hmac.new(secret_key.encode("utf-8"), signed_content(fields, body), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def signed_fields(credentials: Credentials, fields: Mapping[str, str],
                  body: bytes) -> dict[str, str]:
    """``fields`` with ``AccessKey`` and its ``Signature`` added, as a signing client sends."""
    out = dict(fields)
    out.pop(SIGNATURE, None)
    out[ACCESS_KEY] = credentials.access_key
    out[SIGNATURE] = sign(credentials.secret_key, out, body)
    return out


def signature_matches(secret_key: str, fields: Mapping[str, str], body: bytes) -> bool:
    """Whether ``fields["Signature"]`` is ``secret_key``'s signature of this request, compared
    in constant time so the answer's timing tells an attacker nothing about the right one."""
    given = fields.get(SIGNATURE, "")
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               sign(secret_key, fields, body).encode("ascii"))
