"""Certificates the TLS tests make for themselves (trustme): a CA, a server certificate for
127.0.0.1, a client certificate, and the bad ones (another CA's, an expired one, one for
another host), written as PEM files as an operator would have them."""

from __future__ import annotations

import datetime
from pathlib import Path

import attrs
import trustme


@attrs.frozen
class Pair:
    cert: str
    key: str


@attrs.frozen
class Pki:
    ca: str
    """The CA that signed everything below except ``stranger``."""
    server: Pair
    client: Pair
    stranger: Pair
    """A server certificate for 127.0.0.1 from another CA."""
    expired: Pair
    wrong_host: Pair
    """Signed by ``ca``, but for ``broker.example`` only."""
    other_ca: str
    """The CA of ``stranger``: trusting it rejects ``server``."""


def _write(cert: trustme.LeafCert, directory: Path, name: str) -> Pair:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))
    return Pair(str(cert_path), str(key_path))


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    return Pki(
        ca=str(directory / "ca.pem"),
        server=_write(ca.issue_cert("127.0.0.1", "localhost"), directory, "server"),
        client=_write(ca.issue_cert("evq-client@example"), directory, "client"),
        stranger=_write(other.issue_cert("127.0.0.1"), directory, "stranger"),
        expired=_write(ca.issue_cert("127.0.0.1", not_before=past - datetime.timedelta(days=1),
                                     not_after=past), directory, "expired"),
        wrong_host=_write(ca.issue_cert("broker.example"), directory, "wrong-host"),
        other_ca=str(directory / "other-ca.pem"),
    )
