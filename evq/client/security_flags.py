"""The command-line side of :class:`~evq.net.security.ClientSecurity`: one set of flags that
every ``evq`` command talking to servers takes (``produce``, ``consume``, ``admin ...``), and
the one function that turns them into the value handed to the client library.

Credentials come from ``--access-key`` / ``--secret-key`` or, when a flag is not given, from
``$EVQ_ACCESS_KEY`` / ``$EVQ_SECRET_KEY`` (the same names a broker reads its own keys from).
The environment is the better home for a secret: a flag shows in ``ps`` to every user of the
machine.  The TLS flags (:func:`evq.net.tls.add_client_tls_flags`) are added here too, next to
the credentials, so that a command has a single place to ask how its connections are secured.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Final

from evq.acl.signature import Credentials
from evq.net.security import ClientSecurity
from evq.net.tls import add_client_tls_flags, client_tls_from_args

ACCESS_KEY_ENV: Final = "EVQ_ACCESS_KEY"
SECRET_KEY_ENV: Final = "EVQ_SECRET_KEY"


class SecurityFlagError(ValueError):
    """Security flags that cannot be used together (bad usage, not a failure while running)."""


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """``--access-key`` / ``--secret-key`` and the TLS flags on a client command."""
    group = parser.add_argument_group(
        "security", "credentials for an ACL-enabled cluster (RocketMQ's plain ACL)")
    group.add_argument("--access-key", default=None, metavar="KEY",
                       help=f"account to sign requests with (default: ${ACCESS_KEY_ENV})")
    group.add_argument("--secret-key", default=None, metavar="SECRET",
                       help=f"its secret (default: ${SECRET_KEY_ENV}, which is the safer "
                            "place: a flag is visible to other users in ps)")
    add_client_tls_flags(parser)


def credentials_from(access_key: str | None, secret_key: str | None,
                     env: Mapping[str, str]) -> Credentials | None:
    """The credentials given by flags, else by the environment; None when neither gives an
    access key.  One without the other is an error naming what is missing."""
    access = access_key or env.get(ACCESS_KEY_ENV) or None
    secret = secret_key or env.get(SECRET_KEY_ENV) or None
    if access is None and secret is None:
        return None
    if access is None:
        raise SecurityFlagError(f"a secret key needs an access key (--access-key or "
                                f"${ACCESS_KEY_ENV})")
    if secret is None:
        raise SecurityFlagError(f"access key {access!r} needs its secret key (--secret-key or "
                                f"${SECRET_KEY_ENV})")
    return Credentials(access, secret)


def client_security(args: argparse.Namespace, env: Mapping[str, str] | None = None
                    ) -> ClientSecurity | None:
    """What the parsed security flags ask for; None for plain, unsigned connections.  Raises
    :class:`SecurityFlagError` or :class:`evq.net.tls.TlsConfigError`."""
    env = os.environ if env is None else env
    credentials = credentials_from(args.access_key, args.secret_key, env)
    tls = client_tls_from_args(args, env)
    if credentials is None and tls is None:
        return None
    return ClientSecurity(credentials=credentials, tls=tls)
