"""Blocking connections to brokers: a :class:`~evq.client.blocking.SyncProducer`'s sends and
a :class:`~evq.client.blocking.SyncPullConsumer`'s polls made on their callers' own threads.

A SyncProducer used to carry every send to its event loop's thread and back: a hand-off each
way between two threads and a round of the loop's work, which cost more than the send itself
(262 µs of CPU a 1 KiB send, against the asyncio :class:`~evq.client.producer.Producer`'s
119 µs in the same minute; issue 18).  A send whose route, queue and master are known already
needs none of the loop's machinery: the calling thread writes the request on a blocking
socket of its own and reads the answer, as redis-py and RocketMQ's own blocking ``send`` do.
The loop goes on doing all the rest (routes, heartbeats, a topic's first send, retries):
:meth:`Producer.send_now <evq.client.producer.Producer.send_now>` says which sends come here,
and :meth:`PullConsumer.poll_now <evq.client.pull_consumer.PullConsumer.poll_now>` which polls
(a poll crossed to the loop and back cost a sync consumer a seventh of its rate; issue 18).

Execution model: a :class:`BlockingLine` is used by one thread at a time, taken from its
:class:`BlockingLines` pool for a request and given back after it; the pool is shared by the
callers' threads.  Nothing here touches an event loop.  Timeouts are the kernel's
(``SO_RCVTIMEO`` / ``SO_SNDTIMEO``, set when a line opens and again only when a request asks
for another, as a long poll does): a Python socket timeout would poll before every read and
write, a system call a request (8 µs of the send's CPU, measured).

Bounds: a broker gets at most :data:`MAX_LINES_PER_BROKER` lines of one pool (callers beyond
that send through the loop's connection); an answer is read within the client's frame limit
(:data:`~evq.net.protocol.MAX_FRAME`); a line idle for :data:`IDLE_REUSE_S` is closed rather
than reused, well before a broker closes an idle connection (120 s, RocketMQ's and evq's).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

from evq import logs
from evq.acl.signature import signed_fields
from evq.net.protocol import (
    MAX_FRAME,
    RESPONSE_FLAG,
    FrameDecoder,
    OpaqueCounter,
    ProtocolError,
    RemotingCommand,
)
from evq.net.security import ClientSecurity
from evq.net.transport import ConnectError, ConnectionClosed, RequestTimeout, TransportError

log = logs.get_logger(__name__)

MAX_LINES_PER_BROKER: Final = 16
IDLE_REUSE_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 3.0
READ_SIZE: Final = 64 * 1024

MadeRequest = Callable[[int], tuple[RemotingCommand, bytes | None]]
"""``make(opaque)``: the request and its whole frame, or None for the line to encode it (as
:meth:`evq.net.transport.Connection.send_made` takes it)."""


def _kernel_timeout(seconds: float) -> bytes:
    """``SO_RCVTIMEO``'s value: milliseconds on Windows, a ``struct timeval`` elsewhere."""
    if sys.platform == "win32":  # pragma: no cover - evq's CI runs on Linux
        return struct.pack("<L", max(1, round(seconds * 1000)))
    usec = max(1, round(seconds * 1_000_000))  # zero would mean no timeout at all
    return struct.pack("ll", usec // 1_000_000, usec % 1_000_000)


def _set_kernel_timeout(sock: socket.socket, seconds: float) -> None:
    value = _kernel_timeout(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


class BlockingLine:
    """One blocking connection to a broker, for requests that wait for their answer."""

    def __init__(self, addr: str, sock: socket.socket, timeout: float,
                 security: ClientSecurity | None) -> None:
        self.addr = addr
        self.timeout = timeout
        """A request's timeout when it names none."""
        self._sock = sock
        self._credentials = security.credentials if security is not None else None
        self._decoder = FrameDecoder(MAX_FRAME)
        self._opaques = OpaqueCounter()
        self._buffer = bytearray(READ_SIZE)
        self._view = memoryview(self._buffer)
        self._kernel_s = timeout  # what SO_RCVTIMEO and SO_SNDTIMEO are set to now
        self.closed = False
        self.last_used = time.monotonic()

    @classmethod
    def open(cls, addr: str, timeout: float, security: ClientSecurity | None) -> BlockingLine:
        """Connect (and shake hands over TLS when ``security`` says so) within
        :data:`CONNECT_TIMEOUT_S`; each read or write of a request then waits at most
        ``timeout`` seconds."""
        host, _, port = addr.rpartition(":")
        tls = security.tls if security is not None else None
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            raise ConnectError(f"cannot connect to {addr}: {exc or 'timed out'}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
            sock.settimeout(None)
            _set_kernel_timeout(sock, timeout)
        except ssl.SSLError as exc:
            sock.close()
            raise ConnectError(f"TLS handshake with {addr} failed: {exc}") from exc
        except OSError as exc:
            sock.close()
            raise ConnectError(f"cannot connect to {addr}: {exc or 'timed out'}") from exc
        return cls(addr, sock, timeout, security)

    def request(self, make: MadeRequest, timeout: float | None = None) -> RemotingCommand:
        """Send the request ``make(opaque)`` makes and return the broker's answer to it; a
        :class:`TransportError` (the line closed) when the broker does not answer within
        ``timeout`` seconds (default: the line's), the connection fails, or the bytes that
        come back are no frame."""
        opaque = self._opaques()
        cmd, frame = make(opaque)
        if self._credentials is not None:  # signed as Connection.send_made signs
            cmd.ext_fields = signed_fields(self._credentials, cmd.ext_fields, cmd.body)
            frame = None
        if timeout is None:
            timeout = self.timeout
        deadline = time.monotonic() + timeout
        sock, decoder = self._sock, self._decoder
        try:
            if timeout != self._kernel_s:
                _set_kernel_timeout(sock, timeout)
                self._kernel_s = timeout
            sock.sendall(cmd.encode() if frame is None else frame)
            # Read first: the answer cannot come before its request went out, and every read
            # is looked through whole before the next, so what an earlier request left in the
            # decoder (frames that answered nothing, skipped next time) is never this answer.
            while True:
                n = sock.recv_into(self._buffer)
                if not n:
                    raise ConnectionClosed(f"{self.addr} closed the connection")
                decoder.feed(self._view[:n])
                while (answer := decoder.next_command()) is not None:
                    if answer.flag & RESPONSE_FLAG and answer.opaque == opaque:
                        self.last_used = time.monotonic()
                        return answer
                    # no broker asks a line anything (it never heartbeats): skipped
                    log.debug("skipped a frame on a blocking line", broker=self.addr,
                              code=answer.code, opaque=answer.opaque)
                if time.monotonic() > deadline:
                    raise TimeoutError
        except TransportError:
            self.close()
            raise
        except (BlockingIOError, TimeoutError, ssl.SSLWantReadError,
                ssl.SSLWantWriteError) as exc:
            self.close()
            raise RequestTimeout(f"{self.addr} did not answer request {opaque} within "
                                 f"{timeout:g} s") from exc
        except (OSError, ProtocolError) as exc:
            self.close()
            raise ConnectionClosed(f"connection to {self.addr} failed: {exc}") from exc
        except BaseException:  # interrupted: an answer may still come, to the next request
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.close()


class BlockingLines:
    """A pool of :class:`BlockingLine` by broker address, shared by a client's callers.

    Taking a line is a list's ``pop`` (atomic in CPython); giving one back takes the lock, so
    that a line given back as :meth:`close` runs is closed rather than left idle in a closed
    pool, and so do opening and closing one, to count a broker's lines."""

    def __init__(self, timeout: float, security: ClientSecurity | None,
                 max_per_broker: int = MAX_LINES_PER_BROKER) -> None:
        self._timeout = timeout
        self._security = security
        self._max = max_per_broker
        self._idle: dict[str, list[BlockingLine]] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.answered = 0
        """Requests the lines carried and had answered (a counter metrics can read)."""

    def request(self, addr: str, make: MadeRequest, timeout: float | None = None
                ) -> RemotingCommand | None:
        """The answer to ``make``'s request, over a line to ``addr``, within ``timeout``
        seconds (default: the pool's); None when ``addr`` already has its most lines in use
        (or the pool is closed): send another way.

        Taking an idle line that is fresh, and giving it back, are written here rather than
        in helpers: a sync send waits on every Python frame its client runs."""
        idle = self._idle.get(addr)
        try:
            line = idle.pop() if idle else None
        except IndexError:  # another thread took the last one
            line = None
        if line is None or time.monotonic() - line.last_used >= IDLE_REUSE_S:
            line = self._take(addr, line)
            if line is None:
                return None
        answered = False
        try:
            answer = line.request(make, timeout)
            answered = True
            return answer
        finally:
            if line.closed:  # failed mid-way
                self._forget(line)
            else:  # answered, or nothing was sent (``make`` raised): the line is as it was
                with self._lock:
                    self.answered += answered
                    closed = self._closed
                    if closed:
                        self._count[addr] -= 1
                    else:
                        self._idle[addr].append(line)
                if closed:
                    line.close()

    def _take(self, addr: str, stale: BlockingLine | None) -> BlockingLine | None:
        """A line to ``addr`` for :meth:`request` when it found no fresh idle one (``stale``:
        the one it popped, idle too long): the next fresh idle line, else a new one; None
        when ``addr`` has its most lines or the pool is closed."""
        line = stale
        idle = self._idle.get(addr)
        while line is not None:
            if time.monotonic() - line.last_used < IDLE_REUSE_S:
                return line
            self._forget(line)  # the broker may have closed it: a new one costs less
            line.close()
            try:
                line = idle.pop() if idle else None
            except IndexError:  # another thread took the last one
                line = None
        with self._lock:
            if self._closed or self._count.get(addr, 0) >= self._max:
                return None
            self._count[addr] = self._count.get(addr, 0) + 1
            self._idle.setdefault(addr, [])
        try:
            return BlockingLine.open(addr, self._timeout, self._security)
        except TransportError:
            with self._lock:
                self._count[addr] -= 1
            raise

    def _forget(self, line: BlockingLine) -> None:
        with self._lock:
            self._count[line.addr] -= 1

    def lines(self, addr: str) -> int:
        """Lines open to ``addr``, in use or idle."""
        return self._count.get(addr, 0)

    def close(self) -> None:
        """Close the idle lines; those in use close when their request ends."""
        with self._lock:
            self._closed = True
            idle = [line for lines in self._idle.values() for line in lines]
            for lines in self._idle.values():
                lines.clear()
            for line in idle:
                self._count[line.addr] -= 1
        for line in idle:
            line.close()
