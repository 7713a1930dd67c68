"""evq's clients over TLS, end to end: ``evq serve`` enforcing TLS on both ports, and the
commands (``--tls-ca`` or ``EVQ_TLS_CA``), the client library and the Spark options reaching
it through the name server; clear text is refused with a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evq.client.producer import Producer, SendStatus
from evq.client.pull_consumer import PullConsumer
from evq.domain.message import new_message
from evq.net.security import ClientSecurity
from evq.net.tls import client_tls
from evq.spark.options import OptionError, parse_sink
from tests.net.certs import Pki, make_pki
from tests.processes import run_evq, running_evq


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_commands_and_the_library_reach_an_enforcing_server(tmp_path: Path, pki: Pki) -> None:
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(tmp_path / "data"), "--tls-mode", "enforcing",
                     "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
                     "--tls-enable", "--tls-client-ca", pki.ca, servers=2) as served:
        namesrv = served.addresses["namesrv"]
        sent = run_evq("produce", "-n", namesrv, "-t", "T", "--tls-ca", pki.ca,
                       stdin="over tls\n")
        assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stderr
        got = run_evq("consume", "-n", namesrv, "-t", "T", "-g", "G", "--from-beginning",
                      "--count", "1", env={"EVQ_TLS_CA": pki.ca})
        assert got.returncode == 0 and got.stdout == "over tls\n", got.stderr
        clear = run_evq("produce", "-n", namesrv, "-t", "T", stdin="clear\n")
        assert clear.returncode != 0 and namesrv in clear.stderr, clear.stderr
        untrusted = run_evq("produce", "-n", namesrv, "-t", "T", "--tls-ca", pki.other_ca,
                            stdin="x\n")
        assert untrusted.returncode != 0 and "certificate" in untrusted.stderr, untrusted.stderr
        asyncio.run(_library(namesrv, ClientSecurity(tls=client_tls(ca=pki.ca))))
        assert served.stop() == 0


async def _library(namesrv: str, security: ClientSecurity) -> None:
    async with Producer("PG-tls", namesrv, security=security) as p:
        r = await p.send(new_message("T", b"library"))
        assert r.status is SendStatus.SEND_OK
    async with PullConsumer("G-tls", namesrv, security=security) as pc:
        await pc.assign(await pc.queues("T"))
        got: list[bytes] = []
        async with asyncio.timeout(20):
            while b"library" not in got:
                got += [m.payload() for m in await pc.poll_all(wait_ms=200)]


def test_spark_tls_options_fail_on_the_driver_and_travel_as_paths(pki: Pki) -> None:
    sink = parse_sink({"namesrv": "h:1", "tlsCa": pki.ca})
    security = sink.security.client_security()
    assert security is not None and security.tls is not None and security.credentials is None
    with pytest.raises(OptionError, match="tls"):
        parse_sink({"namesrv": "h:1", "tlsCa": "/no/such/ca.pem"})
    with pytest.raises(OptionError, match="tlsVerify"):
        parse_sink({"namesrv": "h:1", "tls": "true", "tlsVerify": "maybe"})
