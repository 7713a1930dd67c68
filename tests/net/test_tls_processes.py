"""TLS end to end: ``evq namesrv`` and ``evq broker`` processes with certificates the tests
make, evq's RemotingClient (``ClientSecurity(tls=...)``) as the client.  Enforcing refuses
clear text, permissive takes both, disabled is as before; a 4 MiB message and a long poll go
over TLS; a broker registers and a slave replicates over TLS; silent connections are closed at
the handshake timeout, on the remoting port and on the HA port."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from evq.client.blocking import SyncProducer, SyncPullConsumer
from evq.client.producer import SendStatus
from evq.domain.codes import ResponseCode
from evq.domain.message import new_message
from evq.domain.record import iter_records
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.tls import client_tls
from evq.net.transport import (
    ConnectError,
    RemotingClient,
    TransportError,
    run,
    split_address,
)
from tests.net.certs import Pki, make_pki
from tests.net.test_broker_server import send_fields
from tests.processes import free_port, run_evq, running_evq

TIMEOUT = 5.0
WAIT_S = 30.0
HANDSHAKE_MS = 1500
"""The servers' handshake timeout: a silent connection lasts this long, a refused one much
less (REFUSED_S) even on a busy machine."""
REFUSED_S = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def serving_flags(pki: Pki, mode: str, *extra: str) -> tuple[str, ...]:
    return ("--tls-mode", mode, "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
            *extra)


def security(pki: Pki, **kwargs: str) -> ClientSecurity:
    return ClientSecurity(tls=client_tls(ca=pki.ca, **kwargs))


async def call(addr: str, sec: ClientSecurity | None, code: int,
               fields: dict[str, object] | None = None, body: bytes = b"",
               timeout: float = TIMEOUT) -> RemotingCommand:
    async with RemotingClient(*split_address(addr), security=sec) as client:
        return await client.invoke(RemotingCommand.request(code, fields, body), timeout)


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def pull_fields(topic: str, offset: int, suspend_ms: int = 0) -> dict[str, object]:
    return {"consumerGroup": "G", "topic": topic, "queueId": 0, "queueOffset": offset,
            "maxMsgNums": 32, "sysFlag": 6 if suspend_ms else 4, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_ms, "subscription": "*", "subVersion": 0}


async def closed_at_timeout(addr: str, opening: bytes) -> float:
    """Connect, send ``opening``, and return how long the server took to close on us."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, split_address(addr))
        await loop.sock_sendall(sock, opening)
        started = loop.time()
        async with asyncio.timeout(TIMEOUT):
            try:
                data = await loop.sock_recv(sock, 1024)
            except ConnectionResetError:
                data = b""
        assert data == b"", "the server answered a connection that never finished a hello"
        return loop.time() - started
    finally:
        sock.close()


def test_an_enforcing_cluster_speaks_only_tls(tmp_path: Path, pki: Pki) -> None:
    """Name server (tls.* from a RocketMQ-style config file) and broker both enforcing; the
    broker registers over TLS; clear text is refused on both; big and parked requests work."""
    conf = tmp_path / "tls.properties"
    conf.write_text(f"tls.server.mode=enforcing\ntls.server.certPath={pki.server.cert}\n"
                    f"tls.server.keyPath={pki.server.key}\n"
                    f"tls.server.handshakeTimeoutMs={HANDSHAKE_MS}\n")
    with running_evq("--log-level", "warning", "namesrv", "--port", "0", "--config", str(conf),
                     servers=1) as ns:
        namesrv = ns.addresses["namesrv"]
        with running_evq("--log-level", "warning", "broker", "--port", "0", "--namesrv",
                         namesrv, "--data", str(tmp_path / "data"),
                         *serving_flags(pki, "enforcing",
                                        "--tls-handshake-timeout-ms", str(HANDSHAKE_MS)),
                         "--tls-enable", "--tls-client-ca", pki.ca, servers=1) as broker:
            addr = broker.addresses["broker"]
            run(_enforcing_cluster(namesrv, addr, security(pki)))
            with SyncProducer("TlsSync", namesrv, security=security(pki)) as p:
                sent = [p.send(new_message("T", b"tls %d" % i)) for i in range(5)]
                assert {r.status for r in sent} == {SendStatus.SEND_OK}
                # On the callers' thread, over a blocking TLS connection of its own.
                assert p.direct_sends == 4 and p.lines(addr) == 1
            with SyncPullConsumer("TlsSyncReaders", namesrv, security=security(pki)) as c:
                queue = sent[-1].queue
                c.assign([queue])
                polled = c.poll(queue)
                assert polled.messages and c.direct_polls == 1 and c.lines(addr) == 1
            assert broker.stop() == 0


async def _enforcing_cluster(namesrv: str, addr: str, sec: ClientSecurity) -> None:
    async def registered() -> bool:
        answer = await call(namesrv, sec, RequestCode.GET_BROKER_CLUSTER_INFO)
        return addr in answer.body.decode()

    await until(f"{addr} to register over TLS with {namesrv}", registered)
    for server in (namesrv, addr):
        with pytest.raises(TransportError):
            await call(server, None, RequestCode.GET_BROKER_CLUSTER_INFO)
        assert HANDSHAKE_MS / 1000 - 0.1 <= await closed_at_timeout(server, b"") < TIMEOUT
        assert await closed_at_timeout(server, b"GET / HTTP/1.0\r\n\r\n") < REFUSED_S
    big = bytes(range(256)) * (4 * 1024 * 1024 // 256 - 1)  # 4 MiB less room for properties
    sent = await call(addr, sec, RequestCode.SEND_MESSAGE, send_fields("T"), big)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    async with RemotingClient(*split_address(addr), security=sec) as client:
        parked = asyncio.ensure_future(client.invoke(RemotingCommand.request(
            RequestCode.PULL_MESSAGE, pull_fields("T", 1, suspend_ms=20_000)), WAIT_S))
        pulled = await client.invoke(RemotingCommand.request(
            RequestCode.PULL_MESSAGE, pull_fields("T", 0)), TIMEOUT)
        assert [m.body for m in iter_records(pulled.body)] == [big]
        await asyncio.sleep(0.2)
        assert not parked.done(), "a long poll with nothing to read answered at once"
        await client.invoke(RemotingCommand.request(
            RequestCode.SEND_MESSAGE, send_fields("T"), b"wake"), TIMEOUT)
        woken = await asyncio.wait_for(parked, TIMEOUT)
        assert [m.body for m in iter_records(woken.body)] == [b"wake"]


def test_permissive_takes_both_and_disabled_is_unchanged(tmp_path: Path, pki: Pki) -> None:
    for mode in ("permissive", "disabled"):
        with running_evq("--log-level", "warning", "broker", "--port", "0", "--data",
                         str(tmp_path / mode), *serving_flags(pki, mode), servers=1) as broker:
            run(_both_ways(broker.addresses["broker"], security(pki), tls_ok=mode != "disabled"))


async def _both_ways(addr: str, sec: ClientSecurity, *, tls_ok: bool) -> None:
    clear = await call(addr, None, RequestCode.SEND_MESSAGE, send_fields("T"), b"clear")
    assert clear.code == ResponseCode.SUCCESS, clear.remark
    if tls_ok:
        sent = await call(addr, sec, RequestCode.SEND_MESSAGE, send_fields("T"), b"tls")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
    else:
        with pytest.raises(TransportError):
            await call(addr, sec, RequestCode.SEND_MESSAGE, send_fields("T"), b"tls")


def test_mutual_tls_and_a_server_the_client_cannot_trust(tmp_path: Path, pki: Pki) -> None:
    """A broker that requires client certificates takes only those its CA signed; a client
    told to trust another CA, or talking to a broker whose certificate names another host,
    fails at connect with the reason."""
    with running_evq("--log-level", "warning", "broker", "--port", "0", "--data",
                     str(tmp_path / "mtls"),
                     *serving_flags(pki, "enforcing", "--tls-client-auth", "require",
                                    "--tls-ca", pki.ca), servers=1) as broker:
        addr = broker.addresses["broker"]
        run(_mutual(addr, pki))
    with running_evq("--log-level", "warning", "broker", "--port", "0", "--data",
                     str(tmp_path / "wrong-host"), "--tls-mode", "enforcing", "--tls-cert",
                     pki.wrong_host.cert, "--tls-key", pki.wrong_host.key, servers=1) as broker:
        run(_untrusted(broker.addresses["broker"], pki))


async def _mutual(addr: str, pki: Pki) -> None:
    with_cert = security(pki, cert=pki.client.cert, key=pki.client.key)
    answer = await call(addr, with_cert, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert answer.code == ResponseCode.SUCCESS
    for sec in (security(pki), security(pki, cert=pki.stranger.cert, key=pki.stranger.key)):
        with pytest.raises(TransportError):
            await call(addr, sec, RequestCode.GET_BROKER_RUNTIME_INFO)


async def _untrusted(addr: str, pki: Pki) -> None:
    with pytest.raises(ConnectError, match="IP address mismatch"):
        await call(addr, security(pki), RequestCode.GET_BROKER_RUNTIME_INFO)
    other = ClientSecurity(tls=client_tls(ca=pki.other_ca))
    with pytest.raises(ConnectError, match="unable to get local issuer certificate"):
        await call(addr, other, RequestCode.GET_BROKER_RUNTIME_INFO)


def test_a_slave_replicates_over_tls(tmp_path: Path, pki: Pki) -> None:
    """Master and slave enforcing on every port, tls.* from broker.conf under RocketMQ's
    names; the slave follows over TLS, a clear-text stranger on the HA port is dropped."""
    conf = tmp_path / "broker.conf"
    conf.write_text(f"tls.server.mode=enforcing\ntls.server.certPath={pki.server.cert}\n"
                    f"tls.server.keyPath={pki.server.key}\n"
                    f"tls.server.handshakeTimeoutMs={HANDSHAKE_MS}\n"
                    f"tls.enable=true\ntls.client.trustCertPath={pki.ca}\n"
                    "mappedFileSizeCommitLog=16777216\nwarmSegments=false\n"
                    "slaveReadEnable=true\n")
    ha = f"127.0.0.1:{free_port()}"
    with running_evq("--log-level", "warning", "broker", "--config", str(conf), "--port", "0",
                     "--ha-port", ha.rpartition(":")[2], "--data", str(tmp_path / "master"),
                     servers=1) as master:
        addr = master.addresses["broker"]
        with running_evq("--log-level", "warning", "broker", "--config", str(conf), "--port",
                         "0", "--role", "SLAVE", "--broker-id", "1", "--master-ha", ha,
                         "--data", str(tmp_path / "slave"), servers=1) as slave:
            run(_replicated(addr, slave.addresses["broker"], ha, security(pki)))


async def _replicated(master: str, slave: str, ha: str, sec: ClientSecurity) -> None:
    for i in range(20):
        sent = await call(master, sec, RequestCode.SEND_MESSAGE, send_fields("T"), b"m%d" % i)
        assert sent.code == ResponseCode.SUCCESS, sent.remark

    async def log_end(addr: str) -> int:
        answer = await call(addr, sec, RequestCode.GET_BROKER_RUNTIME_INFO)
        return int(json.loads(answer.body)["table"]["commitLogMaxOffset"])

    end = await log_end(master)

    async def caught_up() -> bool:
        return await log_end(slave) == end

    await until(f"the slave {slave} to replicate the master's {end} bytes over TLS", caught_up)
    assert HANDSHAKE_MS / 1000 - 0.1 <= await closed_at_timeout(ha, b"") < TIMEOUT
    assert await closed_at_timeout(ha, b"\x00" * 16) < REFUSED_S


def test_unusable_tls_settings_are_one_line_usage_errors(tmp_path: Path, pki: Pki) -> None:
    missing = run_evq("broker", "--port", "0", "--data", str(tmp_path / "d"),
                      "--tls-mode", "enforcing", "--tls-cert", str(tmp_path / "none.pem"),
                      "--tls-key", pki.server.key)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("evq: error: tls.server: no such")
    half = run_evq("namesrv", "--port", "0", "--tls-mode", "permissive")
    assert half.returncode == 2 and "tls.server.certPath" in half.stderr
