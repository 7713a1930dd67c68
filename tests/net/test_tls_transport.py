"""TLS on the remoting transport, in process over real sockets on 127.0.0.1, on both loops:
the three server modes, the client's verification, mutual TLS, and the bounds on connections
that have not finished their handshake."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evq.domain.clock import ManualClock
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.tls import (
    ClientAuth,
    ServerTls,
    TlsConfigError,
    TlsMode,
    add_client_tls_flags,
    client_tls,
    client_tls_from_args,
    server_context,
)
from evq.net.transport import (
    ConnectError,
    ConnectionClosed,
    Dispatcher,
    RemotingClient,
    RemotingServer,
    TransportConfig,
    TransportError,
)
from tests.net.certs import Pki, make_pki
from tests.net.harness import ECHO, HOST, TIMEOUT, echo, eventually, raw_frame


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_tls(pki: Pki, mode: TlsMode, *, client_auth: ClientAuth = ClientAuth.NONE,
               handshake_timeout: float = 5.0, max_handshakes: int = 256) -> ServerTls:
    context = server_context(cert=pki.server.cert, key=pki.server.key, trust=pki.ca,
                             client_auth=client_auth)
    return ServerTls(mode, context, handshake_timeout=handshake_timeout,
                     max_handshakes=max_handshakes)


@contextlib.asynccontextmanager
async def tls_serving(tls: ServerTls | None, **config: int) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(HOST, 0, Dispatcher({ECHO: echo}), clock=ManualClock(), tls=tls,
                            config=TransportConfig(**config))
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown(grace=1.0)


async def echo_over(server: RemotingServer, tls: ssl.SSLContext | None,
                    body: bytes = b"hello") -> bytes:
    security = ClientSecurity(tls=tls) if tls is not None else None
    async with RemotingClient(HOST, server.port, security=security) as client:
        answer = await client.invoke(RemotingCommand.request(ECHO, {"k": "v"}, body), TIMEOUT)
        return answer.body


def trusting(pki: Pki, **kwargs: str) -> ssl.SSLContext:
    context = client_tls(ca=pki.ca, **kwargs)
    assert context is not None
    return context


async def test_enforcing_takes_tls_and_closes_clear_text(pki: Pki) -> None:
    async with tls_serving(server_tls(pki, TlsMode.ENFORCING)) as server:
        assert await echo_over(server, trusting(pki)) == b"hello"
        with pytest.raises(ConnectionClosed):
            await echo_over(server, None)
        await eventually(lambda: not server.connections)


async def test_tls_connections_are_counted_and_one_past_max_connections_closed(
        pki: Pki) -> None:
    async with tls_serving(server_tls(pki, TlsMode.ENFORCING), max_connections=1) as server, \
            RemotingClient(HOST, server.port, security=ClientSecurity(tls=trusting(pki))
                           ) as first:
        assert (await first.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0
        assert len(server.connections) == 1  # counted once its handshake was done
        with pytest.raises(ConnectionClosed):
            await echo_over(server, trusting(pki))
        assert server.refusals.count == 1
        assert (await first.invoke(RemotingCommand.request(ECHO), TIMEOUT)).code == 0


async def test_permissive_takes_both_on_one_port(pki: Pki) -> None:
    async with tls_serving(server_tls(pki, TlsMode.PERMISSIVE)) as server:
        assert await echo_over(server, trusting(pki)) == b"hello"
        assert await echo_over(server, None, b"clear") == b"clear"


async def test_disabled_is_clear_text_and_a_tls_client_fails_clearly(pki: Pki) -> None:
    async with tls_serving(None) as server:
        assert await echo_over(server, None) == b"hello"
        with pytest.raises(TransportError):
            await echo_over(server, trusting(pki))


async def test_a_4_mib_message_round_trips_over_tls(pki: Pki) -> None:
    body = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    async with tls_serving(server_tls(pki, TlsMode.ENFORCING)) as server:
        assert await echo_over(server, trusting(pki), body) == body


@pytest.mark.parametrize(("trust", "served", "reason"), [
    ("other_ca", "server", "unable to get local issuer certificate"),
    ("ca", "expired", "certificate has expired"),
    ("ca", "wrong_host", "IP address mismatch"),
])
async def test_the_client_rejects_a_server_it_cannot_trust_and_says_why(
        pki: Pki, trust: str, served: str, reason: str) -> None:
    pair = getattr(pki, served)
    tls = ServerTls(TlsMode.ENFORCING, server_context(cert=pair.cert, key=pair.key))
    async with tls_serving(tls) as server:
        with pytest.raises(ConnectError, match=f"TLS handshake with .* failed: .*{reason}"):
            await echo_over(server, client_tls(ca=getattr(pki, trust)))


async def test_without_verification_any_server_is_accepted(pki: Pki) -> None:
    tls = ServerTls(TlsMode.ENFORCING,
                    server_context(cert=pki.stranger.cert, key=pki.stranger.key))
    async with tls_serving(tls) as server:
        assert await echo_over(server, client_tls(enable=True, verify=False)) == b"hello"


async def test_mutual_tls_require_takes_only_clients_with_a_trusted_certificate(
        pki: Pki) -> None:
    tls = server_tls(pki, TlsMode.ENFORCING, client_auth=ClientAuth.REQUIRE)
    async with tls_serving(tls) as server:
        with_cert = trusting(pki, cert=pki.client.cert, key=pki.client.key)
        assert await echo_over(server, with_cert) == b"hello"
        # TLS 1.3 finishes the client's side of the handshake before the server checks the
        # certificate: the refusal arrives as the connection closing, or at connect.
        with pytest.raises(TransportError):
            await echo_over(server, trusting(pki))
        stranger = trusting(pki, cert=pki.stranger.cert, key=pki.stranger.key)
        with pytest.raises(TransportError):
            await echo_over(server, stranger)


async def test_optional_client_auth_takes_clients_with_and_without(pki: Pki) -> None:
    tls = server_tls(pki, TlsMode.ENFORCING, client_auth=ClientAuth.OPTIONAL)
    async with tls_serving(tls) as server:
        assert await echo_over(server, trusting(pki)) == b"hello"
        with_cert = trusting(pki, cert=pki.client.cert, key=pki.client.key)
        assert await echo_over(server, with_cert) == b"hello"


async def _closed_by_server(sock: socket.socket) -> bool:
    """Wait until the server closes ``sock`` (b"" or a reset); False if it never does."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.sock_recv(sock, 1024) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("mode", [TlsMode.PERMISSIVE, TlsMode.ENFORCING])
@pytest.mark.parametrize("opening", [b"", b"\x16\x03\x01", b"\x16garbage that is no hello"])
async def test_a_silent_or_stalled_connection_is_closed_at_the_handshake_timeout(
        pki: Pki, mode: TlsMode, opening: bytes) -> None:
    async with tls_serving(server_tls(pki, mode, handshake_timeout=0.5)) as server:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (HOST, server.port))
            await loop.sock_sendall(sock, opening)
            started = loop.time()
            assert await asyncio.wait_for(_closed_by_server(sock), TIMEOUT)
            # closed at the timeout, not earlier (a garbage hello may fail at once)
            if not opening.startswith(b"\x16g"):
                assert loop.time() - started >= 0.4
        finally:
            sock.close()
        assert not server.connections


async def test_clear_text_garbage_in_permissive_mode_is_the_transport_s_as_ever(
        pki: Pki) -> None:
    async with tls_serving(server_tls(pki, TlsMode.PERMISSIVE)) as server:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(raw_frame(b"not json"))
        assert await asyncio.wait_for(reader.read(), TIMEOUT) is not None
        writer.close()
        await eventually(lambda: not server.connections)


async def test_connections_in_the_handshake_are_bounded(pki: Pki) -> None:
    tls = server_tls(pki, TlsMode.PERMISSIVE, handshake_timeout=TIMEOUT, max_handshakes=4)
    async with tls_serving(tls) as server:
        loop = asyncio.get_running_loop()
        silent = []
        try:
            for _ in range(10):
                sock = socket.socket()
                sock.setblocking(False)
                silent.append(sock)
                await loop.sock_connect(sock, (HOST, server.port))  # the backlog takes them
            listener = server._listener
            assert listener is not None
            await eventually(lambda: listener.pending == 4)
            await asyncio.sleep(0.1)  # give a wrong implementation the chance to take more
            assert listener.pending == 4
            # a real client still gets through once the silent ones go
            for sock in silent:
                sock.close()
            silent.clear()
            assert await echo_over(server, trusting(pki)) == b"hello"
        finally:
            for sock in silent:
                sock.close()


async def test_shutdown_closes_connections_still_in_the_handshake(pki: Pki) -> None:
    server = RemotingServer(HOST, 0, Dispatcher({ECHO: echo}), clock=ManualClock(),
                            tls=server_tls(pki, TlsMode.ENFORCING))
    await server.start()
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (HOST, server.port))
        listener = server._listener
        assert listener is not None
        await eventually(lambda: listener.pending == 1)
        await server.shutdown(grace=1.0)
        assert await asyncio.wait_for(_closed_by_server(sock), TIMEOUT)
    finally:
        sock.close()


def test_settings_name_unusable_files(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(TlsConfigError, match="no such file"):
        server_context(cert=str(tmp_path / "missing.pem"), key=pki.server.key)
    with pytest.raises(TlsConfigError, match="key not matching"):
        server_context(cert=pki.server.cert, key=pki.client.key)
    with pytest.raises(TlsConfigError, match="trustCertPath"):
        server_context(cert=pki.server.cert, key=pki.server.key,
                       client_auth=ClientAuth.REQUIRE)
    with pytest.raises(TlsConfigError, match="not a PEM CA file"):
        client_tls(ca=pki.server.key)
    assert client_tls() is None


def test_client_flags_fall_back_on_the_environment(pki: Pki) -> None:
    parser = argparse.ArgumentParser()
    add_client_tls_flags(parser)
    assert client_tls_from_args(parser.parse_args([]), {}) is None
    from_env = client_tls_from_args(parser.parse_args([]), {"EVQ_TLS_CA": pki.ca})
    assert from_env is not None
    assert (from_env.verify_mode, from_env.check_hostname) == (ssl.CERT_REQUIRED, True)
    insecure = client_tls_from_args(parser.parse_args(["--tls", "--tls-no-verify"]), {})
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE
    with pytest.raises(TlsConfigError, match="no such file"):
        client_tls_from_args(parser.parse_args(["--tls-cert", pki.client.cert]),
                             {"EVQ_TLS_KEY": "/nonexistent.key"})


async def test_a_client_built_from_flags_passes_mutual_tls(pki: Pki) -> None:
    parser = argparse.ArgumentParser()
    add_client_tls_flags(parser)
    args = parser.parse_args(["--tls-ca", pki.ca, "--tls-cert", pki.client.cert])
    context = client_tls_from_args(args, {"EVQ_TLS_KEY": pki.client.key})
    tls = server_tls(pki, TlsMode.ENFORCING, client_auth=ClientAuth.REQUIRE)
    async with tls_serving(tls) as server:
        assert await echo_over(server, context) == b"hello"
