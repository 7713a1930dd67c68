"""TLS settings, as RocketMQ names them, and the :class:`ssl.SSLContext` builders they feed.

RocketMQ reads its TLS settings from ``tls.*`` keys (system properties or ``tls.properties``);
evq accepts the same keys in broker.conf (and the name server's ``--config``), as
``EVQ_TLS_*`` environment variables and as ``--tls-*`` flags.  Two deliberate differences from
RocketMQ, both towards safety: the server's mode defaults to ``disabled`` (RocketMQ's
``permissive`` default comes with a self-signed test certificate evq does not ship), and a
client verifies the server's certificate and name unless told otherwise
(``tls.client.authServer=false``; RocketMQ's default trusts any server).

The server's mode decides what one port takes:

=============  =========================================================================
``disabled``   clear text only: today's accept path, untouched
``permissive`` both: the first byte tells them apart (0x16 opens a TLS handshake record)
``enforcing``  TLS only: a connection whose first byte is not 0x16 is closed
=============  =========================================================================

:func:`route` is that table; :mod:`evq.net.listener` applies it to accepted sockets.

Client programs (CLI commands, the client library, Spark) build their context with
:func:`client_tls`; :func:`add_client_tls_flags` and :func:`client_tls_from_args` are the CLI
flags and ``EVQ_TLS*`` variables for it.  The broker's own outgoing connections (name server
registration, the slave's HA link, offsets handed back to the master) use ``tls.enable`` and the
``tls.client.*`` keys through the same builder.
"""

from __future__ import annotations

import argparse
import enum
import ssl
from collections.abc import Mapping
from typing import Final

import attrs

TLS_HANDSHAKE_RECORD: Final = 0x16
"""The first byte of every TLS connection: the record type of the ClientHello."""
DEFAULT_HANDSHAKE_TIMEOUT_MS: Final = 10_000
"""From accept to a finished handshake (Netty's SslHandler default); a connection that is
silent, or still handshaking, past it is closed."""
DEFAULT_MAX_HANDSHAKES: Final = 256
"""Accepted connections a server sniffs or handshakes at once; past it, new ones wait in the
kernel's listen backlog rather than cost the server a socket and a task each."""


class TlsConfigError(ValueError):
    """TLS settings that cannot be used: a missing or unreadable file, a key that does not
    match its certificate, a wrong password.  The message names the setting."""


class TlsMode(enum.Enum):
    """``tls.server.mode``."""

    DISABLED = "DISABLED"
    PERMISSIVE = "PERMISSIVE"
    ENFORCING = "ENFORCING"


class ClientAuth(enum.Enum):
    """``tls.server.need.client.auth``: whether the server asks for a client certificate."""

    NONE = "NONE"
    OPTIONAL = "OPTIONAL"
    REQUIRE = "REQUIRE"


class Route(enum.Enum):
    """What a server does with an accepted connection, given its first byte."""

    TLS = enum.auto()
    PLAIN = enum.auto()
    REFUSE = enum.auto()


def route(mode: TlsMode, first_byte: int) -> Route:
    """The mode table above, for a server that sniffs (permissive or enforcing)."""
    if first_byte == TLS_HANDSHAKE_RECORD:
        return Route.TLS
    return Route.PLAIN if mode is TlsMode.PERMISSIVE else Route.REFUSE


@attrs.frozen(slots=True)
class ServerTls:
    """What a listening server needs: the mode, the context for TLS connections and the
    bounds on connections that have not finished their handshake."""

    mode: TlsMode
    context: ssl.SSLContext = attrs.field(eq=False)
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT_MS / 1000
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES

    def __attrs_post_init__(self) -> None:
        if self.mode is TlsMode.DISABLED:
            raise ValueError("a disabled server takes no ServerTls; pass None")
        if self.handshake_timeout <= 0 or self.max_handshakes < 1:
            raise ValueError("handshake_timeout and max_handshakes must be positive")


def server_context(*, cert: str, key: str, key_password: str = "", trust: str = "",
                   client_auth: ClientAuth = ClientAuth.NONE) -> ssl.SSLContext:
    """A server context: this certificate chain and key, TLS 1.2 or later, and (unless
    ``client_auth`` is NONE) client certificates checked against the CAs in ``trust``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, "tls.server", cert, key, key_password)
    if client_auth is not ClientAuth.NONE:
        if not trust:
            raise TlsConfigError(
                "tls.server.need.client.auth asks for client certificates: "
                "tls.server.trustCertPath must name the CA file they are checked against")
        _load_trust(context, "tls.server.trustCertPath", trust)
        context.verify_mode = (ssl.CERT_REQUIRED if client_auth is ClientAuth.REQUIRE
                               else ssl.CERT_OPTIONAL)
    return context


def client_context(*, trust: str = "", cert: str = "", key: str = "", key_password: str = "",
                   verify: bool = True) -> ssl.SSLContext:
    """A client context.  With ``verify`` the server's chain must lead to a CA in ``trust``
    (the system's CAs when empty) and its certificate must name the host or IP address
    connected to; without, anything is accepted (RocketMQ's ``authServer=false``).  ``cert``
    and ``key`` are this side's certificate, for a server that asks for one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if verify:
        if trust:
            _load_trust(context, "tls.client.trustCertPath", trust)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert or key:
        _load_chain(context, "tls.client", cert, key, key_password)
    return context


def _load_chain(context: ssl.SSLContext, prefix: str, cert: str, key: str,
                password: str) -> None:
    if not cert or not key:
        raise TlsConfigError(f"{prefix}.certPath and {prefix}.keyPath are both needed")
    try:
        context.load_cert_chain(cert, key, password or None)
    except FileNotFoundError as exc:
        raise TlsConfigError(f"{prefix}: no such file: {exc.filename}") from None
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"{prefix}.certPath {cert} / keyPath {key}: cannot load the certificate and key "
            f"(wrong file, a key not matching the certificate, or a wrong keyPassword): {exc}"
        ) from None


def _load_trust(context: ssl.SSLContext, setting: str, path: str) -> None:
    try:
        context.load_verify_locations(cafile=path)
    except FileNotFoundError:
        raise TlsConfigError(f"{setting}: no such file: {path}") from None
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"{setting} {path}: not a PEM CA file: {exc}") from None


def describe(exc: BaseException) -> str:
    """A failed handshake in a sentence a user can act on (OpenSSL's reason, without the
    source-file noise)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"server certificate rejected: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.lower().replace("_", " ")
    return str(exc) or type(exc).__name__


@attrs.frozen(slots=True, kw_only=True)
class TlsSettings:
    """The ``tls.*`` settings of a broker or name server (a section of
    :class:`evq.settings.Settings`; field names are the settings' own names, the RocketMQ key
    is in each comment)."""

    tls_server_mode: TlsMode = TlsMode.DISABLED  # tls.server.mode
    tls_server_cert_path: str = ""  # tls.server.certPath
    tls_server_key_path: str = ""  # tls.server.keyPath
    tls_server_key_password: str = attrs.field(default="", repr=False)  # tls.server.keyPassword
    tls_server_need_client_auth: ClientAuth = ClientAuth.NONE  # tls.server.need.client.auth
    tls_server_trust_cert_path: str = ""  # tls.server.trustCertPath
    tls_server_handshake_timeout_ms: int = DEFAULT_HANDSHAKE_TIMEOUT_MS  # evq's own
    tls_enable: bool = False  # tls.enable: this broker's own connections use TLS
    tls_client_cert_path: str = ""  # tls.client.certPath
    tls_client_key_path: str = ""  # tls.client.keyPath
    tls_client_key_password: str = attrs.field(default="", repr=False)  # tls.client.keyPassword
    tls_client_trust_cert_path: str = ""  # tls.client.trustCertPath
    tls_client_auth_server: bool = True  # tls.client.authServer

    def __attrs_post_init__(self) -> None:
        if self.tls_server_mode is not TlsMode.DISABLED and not (
                self.tls_server_cert_path and self.tls_server_key_path):
            raise TlsConfigError(
                f"tls.server.mode={self.tls_server_mode.value.lower()} needs "
                "tls.server.certPath and tls.server.keyPath (--tls-cert, --tls-key)")
        if self.tls_server_handshake_timeout_ms < 1:
            raise TlsConfigError("the TLS handshake timeout must be positive")

    def server(self) -> ServerTls | None:
        """The listening side; None when disabled.  Raises :class:`TlsConfigError`."""
        if self.tls_server_mode is TlsMode.DISABLED:
            return None
        context = server_context(
            cert=self.tls_server_cert_path, key=self.tls_server_key_path,
            key_password=self.tls_server_key_password, trust=self.tls_server_trust_cert_path,
            client_auth=self.tls_server_need_client_auth)
        return ServerTls(self.tls_server_mode, context,
                         handshake_timeout=self.tls_server_handshake_timeout_ms / 1000)

    def client(self) -> ssl.SSLContext | None:
        """The broker's outgoing side; None unless ``tls.enable``.  Raises
        :class:`TlsConfigError`."""
        if not self.tls_enable:
            return None
        return client_context(
            trust=self.tls_client_trust_cert_path, cert=self.tls_client_cert_path,
            key=self.tls_client_key_path, key_password=self.tls_client_key_password,
            verify=self.tls_client_auth_server)


ALIASES: Final = {
    "tls.server.mode": "tls_server_mode",
    "tls.server.certPath": "tls_server_cert_path",
    "tls.server.keyPath": "tls_server_key_path",
    "tls.server.keyPassword": "tls_server_key_password",
    "tls.server.need.client.auth": "tls_server_need_client_auth",
    "tls.server.trustCertPath": "tls_server_trust_cert_path",
    "tls.server.handshakeTimeoutMs": "tls_server_handshake_timeout_ms",
    "tls.enable": "tls_enable",
    "tls.client.certPath": "tls_client_cert_path",
    "tls.client.keyPath": "tls_client_key_path",
    "tls.client.keyPassword": "tls_client_key_password",
    "tls.client.trustCertPath": "tls_client_trust_cert_path",
    "tls.client.authServer": "tls_client_auth_server",
}
"""RocketMQ's ``tls.*`` keys, by the settings name they set."""


# --- client programs ------------------------------------------------------------------------

ENV_TLS: Final = "EVQ_TLS"
ENV_TLS_CA: Final = "EVQ_TLS_CA"
ENV_TLS_CERT: Final = "EVQ_TLS_CERT"
ENV_TLS_KEY: Final = "EVQ_TLS_KEY"
ENV_TLS_KEY_PASSWORD: Final = "EVQ_TLS_KEY_PASSWORD"
ENV_TLS_NO_VERIFY: Final = "EVQ_TLS_NO_VERIFY"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})


def client_tls(*, enable: bool = False, ca: str | None = None, cert: str | None = None,
               key: str | None = None, key_password: str | None = None,
               verify: bool = True) -> ssl.SSLContext | None:
    """The TLS context of a client program, or None for clear text.

    Naming a CA file, a certificate or a key turns TLS on by itself; ``enable`` alone
    connects over TLS trusting the system's CAs.  Raises :class:`TlsConfigError`."""
    if not (enable or ca or cert or key):
        return None
    return client_context(trust=ca or "", cert=cert or "", key=key or "",
                          key_password=key_password or "", verify=verify)


def add_client_tls_flags(parser: argparse.ArgumentParser) -> None:
    """``--tls``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--tls-no-verify`` for a
    client command; read them back with :func:`client_tls_from_args`."""
    group = parser.add_argument_group("TLS (also EVQ_TLS, EVQ_TLS_CA, EVQ_TLS_CERT, "
                                      "EVQ_TLS_KEY, EVQ_TLS_KEY_PASSWORD)")
    group.add_argument("--tls", dest="tls", action="store_true", default=None,
                       help="connect over TLS (implied by --tls-ca, --tls-cert, --tls-key)")
    group.add_argument("--tls-ca", dest="tls_ca", default=None, metavar="FILE",
                       help="CA certificates (PEM) the servers' certificates must chain to "
                            "(default: the system's)")
    group.add_argument("--tls-cert", dest="tls_cert", default=None, metavar="FILE",
                       help="this client's certificate (PEM), for servers that require one")
    group.add_argument("--tls-key", dest="tls_key", default=None, metavar="FILE",
                       help="the private key of --tls-cert (PEM)")
    group.add_argument("--tls-no-verify", dest="tls_no_verify", action="store_true",
                       default=None,
                       help="accept any server certificate (testing only: anyone on the path "
                            "can read and change the traffic)")


def client_tls_from_args(args: argparse.Namespace,
                         env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The context :func:`add_client_tls_flags`' flags ask for, each flag falling back on its
    ``EVQ_TLS*`` variable (the key password comes only from the environment: a flag would
    show it in the process list).  Raises :class:`TlsConfigError`."""

    def pick(name: str, var: str) -> str | None:
        value = getattr(args, name, None)
        return str(value) if value is not None else env.get(var) or None

    def flag(name: str, var: str) -> bool:
        value = getattr(args, name, None)
        return bool(value) if value is not None else env.get(var, "").lower() in _TRUE

    return client_tls(enable=flag("tls", ENV_TLS), ca=pick("tls_ca", ENV_TLS_CA),
                      cert=pick("tls_cert", ENV_TLS_CERT), key=pick("tls_key", ENV_TLS_KEY),
                      key_password=env.get(ENV_TLS_KEY_PASSWORD) or None,
                      verify=not flag("tls_no_verify", ENV_TLS_NO_VERIFY))
