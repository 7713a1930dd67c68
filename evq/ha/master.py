"""The master's HA service: listens on the HA port, streams its log to every slave, and tells
a SYNC_MASTER's send path when a slave holds a message.

One connection per slave, two coroutines per connection: a writer that streams the log from
the slave's offset in chunks of up to :data:`~evq.ha.frames.MAX_TRANSFER` bytes (woken by the
log's dispatch, a heartbeat after 5 s idle), and a reader that takes the slave's offset
reports, which are its acknowledgements.  Store calls run off the loop.

With ``accounts`` (the broker's ACL), a connection is admitted only once the slave proved an
admin account (:mod:`evq.ha.auth`); until then the master says nothing about its log.
With ``tls`` (the broker's ``tls.server.*`` settings) the HA port takes slaves as the
remoting port takes clients: TLS only when enforcing, TLS or clear text when permissive, each
connection's handshake bounded (:mod:`evq.net.listener`); replication then streams the whole
log encrypted.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import secrets
from collections.abc import Callable

import attrs

from evq import logs
from evq.acl.accounts import AclConfig
from evq.domain.log import LogError, MessageLog, PutStatus
from evq.ha.auth import refusal
from evq.ha.frames import (
    HELLO,
    HELLO_MAGIC,
    MAX_TRANSFER,
    NONCE_SIZE,
    PROOF_HEAD,
    Answer,
    AnswerKind,
    FrameError,
    Greeting,
    Hello,
    ReportDecoder,
    decode_proof,
    proof_rest_size,
    transfer_head,
)
from evq.ha.handshake import decide
from evq.ha.log_window import LogWindow
from evq.net.listener import SniffingListener
from evq.net.refusals import Refusals
from evq.net.tls import ServerTls

log = logs.get_logger(__name__)

HEARTBEAT_S = 5.0  # haSendHeartbeatInterval
HOUSEKEEPING_S = 20.0  # haHousekeepingInterval: a slave silent this long is dropped
SLAVE_FALLBEHIND_MAX = 256 * 1024 * 1024  # haSlaveFallbehindMax
MAX_CONNECTIONS = 64
"""Connections the HA port holds at once (evq's bound; RocketMQ has none): a group has one or
two slaves, and one reconnecting may briefly hold two.  Each costs a descriptor the store may
need for its next segment, and an admitted one a reader of the log."""
_READ = 64 * 1024


@attrs.define(slots=True, eq=False)
class _Slave:
    peer: str
    acked: int
    wake: asyncio.Event = attrs.field(factory=asyncio.Event)


class HAMaster:
    """Replication to its slaves.  Bind with :meth:`start`; :attr:`port` is the bound port
    (``port=0`` picks a free one).  ``accounts`` gives the ACL in force: only its admin
    accounts may attach as slaves; None admits any slave, as RocketMQ does.
    ``max_connections``: connections the port holds at once (see :data:`MAX_CONNECTIONS`)."""

    def __init__(self, message_log: MessageLog, host: str, port: int, *,
                 heartbeat_s: float = HEARTBEAT_S, housekeeping_s: float = HOUSEKEEPING_S,
                 fallbehind_max: int = SLAVE_FALLBEHIND_MAX,
                 accounts: Callable[[], AclConfig] | None = None,
                 tls: ServerTls | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._log = message_log
        self._accounts = accounts
        self._window = LogWindow(message_log)
        self._host = host
        self._port = port
        self._heartbeat_s = heartbeat_s
        self._housekeeping_s = housekeeping_s
        self._fallbehind_max = fallbehind_max
        self._slaves: set[_Slave] = set()  # never rebound: the store's subscription holds it
        self._waiters: list[tuple[int, int, asyncio.Future[bool]]] = []
        self._seq = itertools.count()
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._listener: SniffingListener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe = lambda: None
        self._connections: set[asyncio.Task[None]] = set()
        self.refusals = Refusals("ha_connections_refused", max_connections)
        """Connections closed on arrival because ``max_connections`` were open."""

    @property
    def port(self) -> int:
        if self._listener is not None:
            return self._listener.port
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def slave_offsets(self) -> list[int]:
        """What each connected slave acknowledged."""
        return [s.acked for s in self._slaves]

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._tls is None:
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
        else:
            self._listener = SniffingListener(self._host, self._port, self._tls,
                                              self._stream_protocol)
            await self._listener.bind()
            await self._listener.start_serving()
        # Called only while a slave is connected: the store looks at the set once the batch
        # is readable, and a writer that joins later reads the log before it waits.
        self._unsubscribe = self._log.subscribe_dispatch(self._on_dispatch, wanted=self._slaves)
        log.info("ha_master_listening", address=self.address)

    async def shutdown(self) -> None:
        self._unsubscribe()
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            await self._listener.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for _end, _seq, future in self._waiters:
            if not future.done():
                future.set_result(False)
        self._waiters.clear()

    # --- SYNC_MASTER ---------------------------------------------------------------------------

    async def wait_replicated(self, end_offset: int, timeout: float) -> PutStatus:
        """PUT_OK once a slave acknowledged ``end_offset``; SLAVE_NOT_AVAILABLE at once when no
        slave is connected or the best is more than haSlaveFallbehindMax behind;
        FLUSH_SLAVE_TIMEOUT when none got there within ``timeout`` seconds."""
        best = max(self.slave_offsets, default=None)
        if best is None or self._log.max_physical_offset - best > self._fallbehind_max:
            return PutStatus.SLAVE_NOT_AVAILABLE
        if best >= end_offset:
            return PutStatus.PUT_OK
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_offset, next(self._seq), future))
        try:  # wait_for, not asyncio.timeout: this runs in an eager handler's first step
            ok = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        return PutStatus.PUT_OK if ok else PutStatus.FLUSH_SLAVE_TIMEOUT

    def _acknowledged(self, offset: int) -> None:
        while self._waiters and self._waiters[0][0] <= offset:
            _end, _seq, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(True)

    # --- streaming -----------------------------------------------------------------------------

    def _on_dispatch(self, _batch: object) -> None:
        """From the store's thread, while a slave is connected: new log bytes for every
        writer."""
        if self._loop is not None:  # set before the subscription
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for slave in self._slaves:
            slave.wake.set()

    def _stream_protocol(self) -> asyncio.StreamReaderProtocol:
        """What ``asyncio.start_server`` makes per connection, for the sniffing listener."""
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's callback for a new connection: the session runs in a task of the
        master's own, which :meth:`shutdown` cancels.  Cancelling the callback's task instead
        makes Python 3.11's stream machinery report the cancellation as an error, with a
        traceback, on every shutdown with a slave connected.  Past ``max_connections`` the
        connection is closed before anything is sent or read."""
        if len(self._connections) >= self.refusals.bound:
            self.refusals.refuse(port=self.port)
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._session(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                       ) -> None:
        peer = "{}:{}".format(*writer.get_extra_info("peername")[:2])
        try:
            if not await self._admit(reader, writer, peer):
                return
            start = await self._handshake(reader, writer, peer)
            if start is not None:
                await self._stream(reader, writer, _Slave(peer, start))
        except (ConnectionError, asyncio.IncompleteReadError, FrameError, LogError,
                TimeoutError) as exc:
            log.warning("ha_slave_dropped", slave=peer, error=str(exc) or type(exc).__name__)
        except Exception:
            log.exception("ha_session_failed", slave=peer)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: str) -> bool:
        """Greet the slave; with an ACL, take its proof and decide whether it may go on."""
        if self._accounts is None:
            writer.write(Greeting(auth=False).encode())
            await writer.drain()
            return True
        nonce = secrets.token_bytes(NONCE_SIZE)
        writer.write(Greeting(auth=True, nonce=nonce).encode())
        await writer.drain()
        async with asyncio.timeout(self._housekeeping_s):
            head = await reader.readexactly(PROOF_HEAD.size)
            if head.startswith(HELLO_MAGIC):
                access_key, reason = None, "the slave sent no credentials"
            else:
                proof = decode_proof(await reader.readexactly(proof_rest_size(head)))
                access_key, reason = proof.access_key, refusal(proof, nonce, self._accounts())
        if reason is not None:
            log.warning("ha_slave_refused", slave=peer, access_key=access_key, reason=reason)
            writer.write(Answer(AnswerKind.DENIED, 0).encode())
            await writer.drain()
            return False
        log.info("ha_slave_admitted", slave=peer, access_key=access_key)
        return True

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: str) -> int | None:
        while True:
            async with asyncio.timeout(self._housekeeping_s):
                claim = Hello.decode(await reader.readexactly(HELLO.size))
            answer = await asyncio.to_thread(decide, claim, self._window)
            writer.write(answer.encode())
            await writer.drain()
            log.info("ha_handshake", slave=peer, slave_max=claim.slave_max,
                     probe_end=claim.probe_end, answer=answer.kind.name, offset=answer.offset)
            if answer.kind is AnswerKind.STREAM:
                return answer.offset
            if answer.kind is AnswerKind.REFUSED:
                return None

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      slave: _Slave) -> None:
        self._slaves.add(slave)
        self._acknowledged(max(s.acked for s in self._slaves))
        reports = asyncio.create_task(self._read_reports(reader, slave))
        try:
            await self._write_log(writer, slave, reports)
        finally:
            self._slaves.discard(slave)
            reports.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reports

    async def _read_reports(self, reader: asyncio.StreamReader, slave: _Slave) -> None:
        decoder = ReportDecoder()
        while True:
            async with asyncio.timeout(self._housekeeping_s):
                data = await reader.read(_READ)
            if not data:
                raise ConnectionError("the slave closed the connection")
            offset = decoder.feed(data)
            if offset is not None:
                slave.acked = offset
                self._acknowledged(offset)

    async def _write_log(self, writer: asyncio.StreamWriter, slave: _Slave,
                         reports: asyncio.Task[None]) -> None:
        position = slave.acked
        while not reports.done():
            slave.wake.clear()
            data = await asyncio.to_thread(self._log.read_log, position, MAX_TRANSFER)
            if data:
                writer.write(transfer_head(position, len(data)))
                writer.write(data)
                position += len(data)
                await writer.drain()
                continue
            waker = asyncio.create_task(slave.wake.wait())
            done, _ = await asyncio.wait({waker, reports}, timeout=self._heartbeat_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            if not done:
                writer.write(transfer_head(position, 0))
                await writer.drain()
        reports.result()  # the reader's error ends the session with its reason
