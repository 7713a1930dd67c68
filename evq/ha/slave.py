"""The slave's HA client: connect to the master, agree on a starting point, apply its log.

The master's HA address comes from configuration or from the name servers' registration
answer, whichever is known when a connection is attempted, so a slave started before its
master (or before the name server knows the master) simply keeps trying.  Replicated bytes go
through :meth:`MessageLog.append_replicated`, so the slave may run any backend; the offset it
reports after each write is its acknowledgement (SYNC_MASTER waits for it).  A master with an
ACL admits only a slave that proves an admin account: the broker's own ``credentials``.  With
``tls`` (the broker's ``tls.enable`` and ``tls.client.*`` settings) it connects over TLS,
checking the master's certificate as any evq client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

import attrs

from evq import logs
from evq.acl.signature import Credentials
from evq.domain.log import LogError, MessageLog
from evq.ha.auth import prove
from evq.ha.frames import (
    ANSWER,
    GREETING,
    Answer,
    AnswerKind,
    FrameError,
    Greeting,
    Transfer,
    TransferDecoder,
    encode_report,
)
from evq.ha.handshake import AdmissionDenied, HandshakeError, follow, hello
from evq.ha.log_window import LogWindow
from evq.net.transport import split_address

log = logs.get_logger(__name__)

REPORT_INTERVAL_S = 5.0  # haSendHeartbeatInterval
CONNECT_TIMEOUT_S = 3.0
SILENCE_S = 20.0  # the master heartbeats every 5 s; this long without a byte is a dead link
_READ = 256 * 1024


@attrs.define(slots=True)
class Backoff:
    """Reconnect delays: doubling from ``first`` up to ``cap``, back to ``first`` after a
    session that streamed."""

    first: float = 0.1
    cap: float = 2.0
    current: float = 0.0

    def next(self) -> float:
        self.current = self.first if self.current == 0 else min(self.cap, self.current * 2)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


class HASlave:
    """Keeps ``message_log`` a copy of the master's.  ``master_addr`` is asked before each
    connection attempt (None: not known yet).  ``truncate`` cuts a divergent tail; a broker
    passes one that rolls its metadata back with the log (the log's own by default)."""

    def __init__(self, message_log: MessageLog, master_addr: Callable[[], str | None], *,
                 report_interval_s: float = REPORT_INTERVAL_S,
                 backoff: Backoff | None = None,
                 on_streaming: Callable[[], Awaitable[None]] | None = None,
                 truncate: Callable[[int], None] | None = None,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._log = message_log
        self._credentials = credentials
        self._truncate = truncate or message_log.truncate
        self._window = LogWindow(message_log)
        self._master_addr = master_addr
        self._tls = tls
        self._report_interval_s = report_interval_s
        self._backoff = backoff or Backoff()
        self._on_streaming = on_streaming
        self._task: asyncio.Task[None] | None = None
        self._hooks: set[asyncio.Task[None]] = set()
        self.streaming = False
        """True while connected and past the handshake."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def shutdown(self) -> None:
        for hook in list(self._hooks):
            hook.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            addr = self._master_addr()
            if addr is not None:
                try:
                    await self._session(addr)
                except AdmissionDenied as exc:  # the operator's to fix: keys or the ACL file
                    log.error("ha_slave_not_admitted", master=addr, error=str(exc))
                except (OSError, asyncio.IncompleteReadError, FrameError, HandshakeError,
                        LogError, TimeoutError, ValueError) as exc:
                    log.warning("ha_master_lost", master=addr,
                                error=str(exc) or type(exc).__name__)
                except Exception:  # a slave that stops following is worse than one that retries
                    log.exception("ha_session_failed", master=addr)
                finally:
                    self.streaming = False
            await asyncio.sleep(self._backoff.next())

    async def _session(self, addr: str) -> None:
        host, port = split_address(addr)
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, ssl=self._tls)
        try:
            start = await self._handshake(reader, writer)
            log.info("ha_streaming", master=addr, start=start)
            self.streaming = True
            self._backoff.reset()
            if self._on_streaming is not None:  # alongside the stream, not before it
                hook = asyncio.create_task(self._on_streaming())
                self._hooks.add(hook)
                hook.add_done_callback(self._hooks.discard)
            await self._stream(reader, writer, start)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> int:
        async with asyncio.timeout(SILENCE_S):
            greeting = Greeting.decode(await reader.readexactly(GREETING.size))
        if greeting.auth and self._credentials is not None:
            writer.write(prove(self._credentials, greeting.nonce).encode())
        claim = await asyncio.to_thread(hello, self._window)
        while True:
            writer.write(claim.encode())
            await writer.drain()
            async with asyncio.timeout(SILENCE_S):
                answer = Answer.decode(await reader.readexactly(ANSWER.size))
            if answer.kind is AnswerKind.DENIED:
                raise AdmissionDenied(
                    f"the master refused this slave's account {self._credentials.access_key!r}"
                    " (an admin account of its ACL, with the right secret, is needed)"
                    if self._credentials is not None else
                    "the master has an ACL and this slave no credentials (set the broker's "
                    "accessKey and secretKey to an admin account)")
            step = follow(answer, claim.slave_max)
            if step.stream_from is not None:
                return step.stream_from
            if step.begin_at is not None:
                log.warning("ha_log_begins_at_master_min", begin=step.begin_at)
                await asyncio.to_thread(self._log.begin_at, step.begin_at)
                claim = await asyncio.to_thread(hello, self._window)
            elif step.truncate_to is not None:
                log.warning("ha_divergent_tail_dropped", cut_to=step.truncate_to,
                            dropped_bytes=claim.slave_max - step.truncate_to)
                await asyncio.to_thread(self._truncate, step.truncate_to)
                claim = await asyncio.to_thread(hello, self._window)
            else:
                claim = await asyncio.to_thread(hello, self._window, step.probe_at)

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      position: int) -> None:
        writer.write(encode_report(position))
        await writer.drain()
        reporter = asyncio.create_task(self._report_periodically(writer))
        decoder = TransferDecoder()
        try:
            while True:
                async with asyncio.timeout(SILENCE_S):
                    data = await reader.read(_READ)
                if not data:
                    raise ConnectionError("the master closed the connection")
                transfers = [t for t in decoder.feed(data) if not t.is_heartbeat]
                if transfers:
                    position = await asyncio.to_thread(self._apply, transfers)
                    writer.write(encode_report(position))
                    await writer.drain()
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter

    def _apply(self, transfers: list[Transfer]) -> int:
        """Append transfers that continue the log, as one write; a transfer that does not
        start at the log end drops the connection (RocketMQ's rule)."""
        end = self._log.max_physical_offset
        for t in transfers:
            if t.offset != end:
                raise FrameError(f"transfer at {t.offset}, this log ends at {end}")
            end = t.end
        data = b"".join(t.data for t in transfers)
        return self._log.append_replicated(transfers[0].offset, data)

    async def _report_periodically(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self._report_interval_s)
            writer.write(encode_report(self._log.max_physical_offset))
            await writer.drain()
