"""A listening socket that tells TLS from clear text on the same port, with bounds.

Used for a server whose ``tls.server.mode`` is permissive or enforcing (the remoting port of
brokers and name servers, a master's HA port); a disabled server keeps asyncio's own
``create_server`` and pays nothing for this.  Each accepted connection is *sniffed*: its first
byte is peeked (``MSG_PEEK``, so the TLS stack still reads the whole ClientHello), then
:func:`evq.net.tls.route` decides: hand it to the loop as TLS
(``loop.connect_accepted_socket(..., ssl=context)``), as clear text, or close it.

Bounds, because an attacker can open connections for free:

* from accept to a finished handshake (or, for clear text, to the first byte) a connection has
  ``handshake_timeout`` seconds; a silent peer, or one that stalls the handshake, is closed then;
* at most ``max_handshakes`` connections are being sniffed or handshaken at once; past that
  the listener stops accepting, and new connections wait in the kernel's backlog;
* once handed over, a connection is the server's, with its usual limits (idle timeout included).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Final

from evq import logs
from evq.net.tls import Route, ServerTls, describe, route

log = logs.get_logger(__name__)

BACKLOG: Final = 1024
ACCEPT_RETRY_S: Final = 1.0  # asyncio's own pause after EMFILE and friends

ProtocolFactory = Callable[[], asyncio.BaseProtocol]
Accepted = Callable[[asyncio.BaseProtocol], None]


class SniffingListener:
    """Binds ``host:port`` (port 0: any free one) and serves it under ``tls``'s mode.

    ``factory`` makes the protocol of each connection; ``accepted`` (optional) is called with
    it once the connection is handed over, so that a server counts only connections that made
    it through the handshake.
    """

    def __init__(self, host: str, port: int, tls: ServerTls, factory: ProtocolFactory,
                 accepted: Accepted | None = None) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._factory = factory
        self._accepted = accepted
        self._sock: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(tls.max_handshakes)

    @property
    def pending(self) -> int:
        """Connections being sniffed or handshaken now."""
        return len(self._pending)

    async def bind(self) -> None:
        """Bind without listening: connections are refused until :meth:`start_serving`.
        Raises OSError."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]

    async def start_serving(self) -> None:
        assert self._sock is not None, "bind() first"
        self._sock.listen(BACKLOG)
        self._acceptor = asyncio.get_running_loop().create_task(self._accept_forever())

    async def close(self) -> None:
        """Stop accepting, close the listening socket and every connection not yet handed
        over; handed-over connections are their server's to close."""
        if self._acceptor is not None:
            self._acceptor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acceptor
            self._acceptor = None
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _accept_forever(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                conn, _address = await loop.sock_accept(self._sock)
            except OSError as exc:
                self._slots.release()
                log.warning("accept_failed", port=self.port, error=str(exc))
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            except BaseException:
                self._slots.release()
                raise
            task = loop.create_task(self._admit(conn))
            self._pending.add(task)
            task.add_done_callback(self._admitted)

    def _admitted(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        self._slots.release()

    async def _admit(self, sock: socket.socket) -> None:
        """Sniff, then hand over or close; never raises (its task has nobody to tell)."""
        peer = _peer(sock)
        handed = False
        try:
            async with asyncio.timeout(self._tls.handshake_timeout):
                first = await _peek(sock)
                if not first:
                    return  # closed before saying anything: a port scan, a health check
                decision = route(self._tls.mode, first[0])
                if decision is Route.REFUSE:
                    log.info("clear_text_refused", peer=peer, port=self.port,
                             reason="tls.server.mode is enforcing")
                    return
                protocol = await self._hand_over(sock, decision)
            handed = True
            if self._accepted is not None:
                self._accepted(protocol)
        except TimeoutError:
            log.info("handshake_timeout", peer=peer, port=self.port,
                     seconds=self._tls.handshake_timeout)
        except OSError as exc:  # ssl.SSLError included: a bad hello, an untrusted client
            log.info("handshake_failed", peer=peer, port=self.port, error=describe(exc))
        except Exception:  # a bug here must cost one connection, never the listener
            log.exception("admit_failed", peer=peer, port=self.port)
        finally:
            if not handed:
                sock.close()

    async def _hand_over(self, sock: socket.socket, decision: Route) -> asyncio.BaseProtocol:
        loop = asyncio.get_running_loop()
        if decision is Route.TLS:
            transport, _ = await loop.connect_accepted_socket(
                self._factory, sock, ssl=self._tls.context,
                ssl_handshake_timeout=self._tls.handshake_timeout)
        else:
            transport, _ = await loop.connect_accepted_socket(self._factory, sock)
        # The factory's protocol: uvloop returns its own SSL protocol in the pair, asyncio the
        # factory's; the transport names the factory's under both.
        return transport.get_protocol()


async def _peek(sock: socket.socket) -> bytes:
    """The first byte the peer sent, left in the socket; b"" when it closed without one."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(sock.fileno())
    return sock.recv(1, socket.MSG_PEEK)


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
