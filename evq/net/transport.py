"""The asyncio pumps around :mod:`evq.net.protocol`: server, client, connection, shutdown.

Both ends of a RocketMQ connection send requests: clients call the broker, and the broker calls
clients back (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO).
So one :class:`Connection` class serves both sides: it answers incoming requests through a
:class:`Dispatcher` (a table of async handlers by request code) and matches incoming responses to
its own pending requests by opaque.  :class:`RemotingServer` accepts such connections,
:class:`RemotingClient` opens one to an address and reopens it on demand.

A handler is ``async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand |
None``, or a plain function returning the answer itself or an awaitable of it (see
:data:`Handler`); it answers with ``cmd.response(...)`` or raises
:class:`~evq.domain.codes.BrokerError` for a refusal.  The dispatcher turns everything else
into RocketMQ's answers: unknown codes get REQUEST_CODE_NOT_SUPPORTED, any other exception
SYSTEM_ERROR (and a log line); oneway requests (flag bit 1) get nothing.  A processor module
looks like::

    async def get_max_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMaxOffsetRequest.read(cmd.ext_fields)    # evq.net.headers.offsets
        offset = broker.max_offset(h.topic, h.queue_id)
        return cmd.response(fields=GetMaxOffsetResponse.write(offset=offset))

    dispatcher = Dispatcher({RequestCode.GET_MAX_OFFSET: get_max_offset})
    server = RemotingServer("127.0.0.1", 10911, dispatcher)
    await server.start()                       # server.port is the bound port
    ...
    conn.add_close_callback(drop_client)       # e.g. in the HEART_BEAT handler
    answer = await conn.send_request(RemotingCommand.request(code, fields), timeout=3.0)
    ...
    await server.shutdown(grace=10.0)

What the transport promises, and why:

* Each request runs in its own task and answers go out in completion order, so a pull parked
  for 15 s by long polling does not hold up a heartbeat behind it on the same connection (the
  C++ client drops the whole connection when a heartbeat takes over 3 s).  A server's
  dispatcher is *eager* (``Dispatcher(eager=True)``, as Python 3.12's eager tasks): a
  handler's first step runs at once in the read callback, and only a handler that suspends
  gets a task for the rest.  Most requests (a send under ASYNC_FLUSH, a pull that finds
  messages, a heartbeat) never suspend, and the task, its scheduling and its done callback
  were a sixth of the broker's CPU for a single send.  The price: no task is current during
  that first step, so an eager handler must not use ``asyncio.timeout`` or a ``TaskGroup``
  before its first ``await`` that suspends (a timer handle or ``asyncio.wait_for`` does the
  same job).  Client-side dispatchers, which run users' callbacks, stay lazy.
* Backpressure, as Netty's channel writability: a server connection stops reading, and stops
  starting handlers, while its transport's write buffer is above ``write_high_water``, while
  ``max_in_flight`` handlers are running, or while the requests they hold add up to
  ``max_request_bytes``.  A handler starts only while the buffer is under the mark
  (:meth:`Connection.writable`), and a handler that builds a large answer after waiting (a
  long poll that woke up) waits for it again first; since nothing awaits between building an
  answer and writing it, a peer that does not read its answers costs one connection at most
  ``write_high_water`` plus one answer plus ``max_request_bytes`` plus one frame, however many
  requests it pipelines.  A client connection pauses only for ``max_in_flight`` and
  ``max_request_bytes``, never for its own write buffer: its writes are requests its caller
  awaits (bounded by the caller), and if it stopped reading while the server did too, big
  messages sent while big answers come back would deadlock the connection.  A handler waiting
  for the peer's answer to a broker-initiated request is bounded by its own timeout, even
  while reading is paused.
* A malformed frame loses the framing: the peer gets SYSTEM_ERROR if its opaque was readable,
  then the connection is closed; the server and its other connections carry on.
* Idle connections (nothing received or sent and no request running for ``idle_timeout``
  seconds, by the injected clock) are closed by the server.
* TLS (``tls.server.mode``): a server given a :class:`~evq.net.tls.ServerTls` accepts
  through :class:`~evq.net.listener.SniffingListener` (permissive: TLS and clear text on one
  port; enforcing: TLS only), with a bounded handshake; without one it is asyncio's own accept
  path, as before.  A client opened with ``security.tls`` connects over TLS, checking the
  server's certificate against the address it dialled (IP addresses included), and a failed
  handshake is a :class:`ConnectError` that says why.
* :meth:`RemotingServer.shutdown` stops accepting, stops reading, lets running handlers answer
  for up to ``grace`` seconds, then closes every connection; :func:`run_until_signal` runs a
  program on uvloop (when installed) until SIGTERM or SIGINT asks it to do that.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import signal
import ssl
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import attrs

from evq import logs
from evq.acl.signature import signed_fields
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import BrokerError, ResponseCode
from evq.net import protocol
from evq.net.listener import SniffingListener
from evq.net.protocol import (
    HEADER_LENGTH_MASK,
    MAX_FRAME,
    MAX_HEADER,
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    FrameDecoder,
    OpaqueCounter,
    ProtocolError,
    RemotingCommand,
)
from evq.net.read_budget import ReadBudget
from evq.net.refusals import Refusals
from evq.net.security import ClientSecurity
from evq.net.tls import ServerTls, describe

_uvloop_factory: Callable[[], asyncio.AbstractEventLoop] | None
try:
    from uvloop import new_event_loop as _uvloop_factory
except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
    _uvloop_factory = None

log = logs.get_logger(__name__)

Reply = RemotingCommand | bytes | None
"""A handler's answer: the response, the response's whole frame already encoded (the send
lane's, :mod:`evq.net.broker.send_lane`), or None for none (a oneway request's)."""
Handler = Callable[["Connection", RemotingCommand], Awaitable[Reply] | Reply]
"""A request's handler: it answers at once (a plain function returning the :data:`Reply`) or
later (an awaitable of it: a coroutine).  Answering at once spares a coroutine, its first
step and its ``StopIteration`` a request; a send under ASYNC_FLUSH does (see
:meth:`Connection._start`)."""


_ANSWERS: Final = (RemotingCommand, bytes)
"""The types of a :data:`Reply` that is the answer itself, not an awaitable of it."""


async def settled(outcome: Awaitable[Reply] | Reply) -> Reply:
    """What a handler answered, awaited if it answers later: for a handler that wraps
    another (a check in front of it) and so awaits it either way."""
    if outcome is None or isinstance(outcome, _ANSWERS):
        return outcome  # type: ignore[return-value]
    return await outcome


CloseCallback = Callable[["Connection"], None]
_T = TypeVar("_T")

SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
_REMARK_LIMIT: Final = 256
_connection_ids = itertools.count(1)


@attrs.frozen(slots=True, kw_only=True)
class TransportConfig:
    """Per-connection limits; the defaults follow the Java broker where it has one."""

    max_frame: int = MAX_FRAME
    """Largest frame taken from a peer (Java's 16 MiB ``frameMaxLength``)."""
    max_header: int = MAX_HEADER
    """Largest header a server takes from a peer (see :data:`~evq.net.protocol.MAX_HEADER`);
    a client takes any header its frame holds."""
    max_in_flight: int = 1024
    """Handlers running at once on one connection: a client process pulls every queue it owns
    over one connection, with one long poll parked per queue."""
    write_high_water: int = 4 * 1024 * 1024
    """Unsent bytes above which the connection stops reading and starting handlers..."""
    write_low_water: int = 1024 * 1024
    """...until the peer has taken the buffer down to this."""
    max_request_bytes: int = 64 * 1024 * 1024
    """Bytes of requests the running handlers of one connection may hold (sixteen 4 MiB
    messages waiting for a flush or a slave); past it no further request is taken."""
    idle_timeout: float = 120.0
    """Seconds without traffic after which the server closes a connection (Java: 120)."""
    max_buffered_bytes: int = 1024 * 1024 * 1024
    """Bytes of requests a server holds for all its connections together (frames arriving,
    requests its handlers hold); past it, a connection in the middle of a frame waits (see
    :mod:`evq.net.read_budget`)."""
    max_connections: int = 10_000
    """Connections a server holds at once (Redis's ``maxclients``); one more is closed as
    soon as it is accepted.  Each holds up to a frame and its requests in memory, and a
    descriptor the store may need to open its next segment or index file."""
    idle_check_interval: float = 10.0
    connect_timeout: float = 3.0

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.write_low_water <= self.write_high_water:
            raise ValueError(
                f"write_low_water {self.write_low_water} must be between 0 and "
                f"write_high_water {self.write_high_water}"
            )
        if min(self.max_frame, self.max_header, self.max_in_flight, self.max_request_bytes,
               self.max_buffered_bytes, self.max_connections) < 1:
            raise ValueError("max_frame, max_header, max_in_flight, max_request_bytes, "
                             "max_buffered_bytes and max_connections must be positive")
        if min(self.idle_timeout, self.idle_check_interval, self.connect_timeout) <= 0:
            raise ValueError("timeouts and intervals must be positive")


class TransportError(Exception):
    """A request that got no answer: base of the transport's own errors."""


class ConnectError(TransportError):
    """The peer's address refused or did not accept a connection in time."""


class ConnectionClosed(TransportError):
    """The connection closed before the answer came (or was closed when asked to send)."""


class RequestTimeout(TransportError):
    """No answer within the caller's timeout; the pending request is dropped."""


def split_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; ValueError naming the address otherwise."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {addr!r}")
    return host, int(port)


_future_set_result: Final = asyncio.Future.set_result
"""The future's own ``set_result``, named once: ``super()`` costs a lookup per answer."""


class Answer(asyncio.Future[RemotingCommand]):
    """The future a request's caller awaits: its answer wakes the caller at once.

    An asyncio future wakes the task awaiting it through ``loop.call_soon``, so the task runs
    at the loop's next turn, after another poll of the selector: a second ``epoll_wait`` and
    a second turn of the loop for every request a client makes.  This future keeps the
    awaiting task's wake-up to itself, and :meth:`answer`, called as the answer is read,
    runs it at once, as if the task had been waiting in the read callback.  Only there: a
    task cannot be entered inside another one, so whenever a task is running (and for every
    other way of finishing: a timeout, a closed connection, a cancellation) the wake-up goes
    through ``call_soon`` as asyncio's own would.
    """

    # A class default rather than slots and an ``__init__``: the instance dict made when the
    # task's wake-up is kept costs less than a Python-level constructor on every request.
    _waker: tuple[Callable[[Any], object], contextvars.Context] | None = None

    def add_done_callback(self, fn: Callable[[Any], object], *,
                          context: contextvars.Context | None = None) -> None:
        if self._waker is None and not self.done():  # the awaiting task's: kept here
            self._waker = (fn, context if context is not None else contextvars.copy_context())
        else:
            super().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        removed = 0
        if self._waker is not None and self._waker[0] == fn:
            self._waker, removed = None, 1
        return removed + super().remove_done_callback(fn)

    def answer(self, response: RemotingCommand) -> None:
        """Resolve with ``response``; the waiting task runs its next step now unless a task
        is running."""
        waker = self._waker
        if waker is None or asyncio.current_task(self.get_loop()) is not None:
            self.set_result(response)
            return
        self._waker = None
        _future_set_result(self, response)
        waker[1].run(waker[0], self)

    # Every other way to finish wakes the task through the loop, ahead of any callback
    # added after it (asyncio runs a future's callbacks in the order they were added).

    def set_result(self, result: RemotingCommand) -> None:
        self._wake_later()
        _future_set_result(self, result)

    def set_exception(self, exception: type | BaseException) -> None:
        self._wake_later()
        super().set_exception(exception)

    def cancel(self, msg: Any | None = None) -> bool:
        self._wake_later()
        return super().cancel(msg=msg)

    def _wake_later(self) -> None:
        # Only while not done: the waker is dropped as the future finishes, so a second
        # finish (refused by asyncio's own check) schedules nothing.
        waker = self._waker
        if waker is not None:
            self._waker = None
            self.get_loop().call_soon(waker[0], self, context=waker[1])


MadeRequest = Callable[[int], tuple[RemotingCommand, bytes | None]]
"""What :meth:`Connection.send_made` calls with the request's opaque: the request with that
opaque, and its whole frame (None: the connection encodes it)."""


def _stamped(cmd: RemotingCommand, opaque: int) -> tuple[RemotingCommand, None]:
    """``cmd`` given its opaque, for :meth:`Connection.send_made` to encode."""
    cmd.opaque = opaque
    return cmd, None


_Pending = tuple[Answer, float, RemotingCommand, float]
"""A request waiting for its answer: the waiter, its deadline on the loop's clock, the request
and its timeout (what a :class:`RequestTimeout` names)."""
_NEVER: Final = float("inf")

REQUEST_TASK_NAME: Final = "evq request"
"""The name of every task that answers a peer's request (for debugging and tests)."""


class Dispatcher:
    """The handler table of one side of a connection, and RocketMQ's answers for a request
    no handler takes and for a handler that fails (a connection runs the handlers)."""

    def __init__(self, handlers: Mapping[int, Handler] | None = None, *,
                 eager: bool = False) -> None:
        self._handlers: dict[int, Handler] = dict(handlers or {})
        self.eager = eager
        """Whether a handler's first step runs inside the read callback (see the module's
        docstring for the rule this puts on handlers)."""
        self.handler: Callable[[int], Handler | None] = self._handlers.get
        """The handler of a request code, or None (the table's own ``get``: a lookup every
        request makes, without a Python frame of its own)."""

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[code] = handler

    @staticmethod
    def unsupported(cmd: RemotingCommand) -> RemotingCommand:
        """The answer to a request no handler takes."""
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")

    @staticmethod
    def failed(conn: Connection, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        """The answer to a request whose handler raised ``exc``: a refusal's own code, or
        SYSTEM_ERROR (and a log line with the traceback) for anything else.  Called in the
        ``except`` block that caught it."""
        if isinstance(exc, BrokerError):
            return cmd.response(exc.code, exc.remark)
        log.exception("request handler failed", code=cmd.code, conn=conn.id, peer=conn.peer)
        return cmd.response(ResponseCode.SYSTEM_ERROR, _describe(exc))


async def _resumed(coro: Coroutine[Any, Any, None], suspended_on: object) -> None:
    """The rest of ``coro``, whose first step ran eagerly and suspended on ``suspended_on``:
    what a task runs for an eager handler."""
    await _continue(coro, suspended_on)


@types.coroutine
def _continue(coro: Coroutine[Any, Any, None], suspended_on: object
              ) -> Generator[object, object, None]:
    # Hands the task what the coroutine waits on (a future, or None for a bare yield) and
    # relays what the task sends or throws back (a result, or a cancellation) to it.
    while True:
        try:
            sent = yield suspended_on
        except GeneratorExit:  # the task is being destroyed: so is the coroutine
            coro.close()
            raise
        except BaseException as exc:
            try:
                suspended_on = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                suspended_on = coro.send(sent)
            except StopIteration:
                return


def _loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """What reads ``loop``'s clock (the one its timers run by): :func:`time.monotonic` itself
    where the loop's ``time`` is asyncio's own, which returns just that, so that a request's
    deadline costs no Python frame on the stdlib loop; otherwise the loop's ``time``."""
    if getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def _address(sockaddr: tuple[Any, ...] | None) -> str:
    return f"{sockaddr[0]}:{sockaddr[1]}" if sockaddr else "?"


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _REMARK_LIMIT else text[: _REMARK_LIMIT - 3] + "..."


READ_BUFFER: Final = 256 * 1024
"""Bytes one read may take from a socket (asyncio's and uvloop's own size)."""
_read_buffers = threading.local()


def _read_buffer() -> memoryview:
    """This thread's read buffer, which every connection of its event loop reads into.

    One per thread, not per connection: a read fills it and :meth:`Connection.buffer_updated`
    copies the bytes out to the connection's decoder before the loop does anything else, so
    no two reads ever hold it at once.  asyncio's own read path allocates a new 256 KiB
    ``bytes`` for each read instead, which malloc serves with mmap, mremap and munmap: three
    system calls and fresh pages on every answer an asyncio client receives.
    """
    view: memoryview | None = getattr(_read_buffers, "view", None)
    if view is None:
        view = _read_buffers.view = memoryview(bytearray(READ_BUFFER))
    return view


class ReadPath:
    """A connection's read path: bytes read, frames taken, handlers started within the
    limits, their answers written at once where they answer at once.

    Every request and every answer a connection receives runs this, so it has a compiled
    twin, :mod:`evq.net.read_path` (about 330 bytecodes of the 820 the broker ran for a
    send, issue 18); this one is its reference, and what runs where the twin is not built
    or ``EVQ_PURE_PYTHON`` is set (:data:`COMPILED_READ_PATH`).  Both are a base of
    :class:`Connection` and work on its state; the rare paths (a refusal, a response to a
    pending request, a task for a handler that suspends, pausing and resuming reading) are
    the connection's own methods, which both call.  tests/net/test_read_path.py holds the
    twin to this class.
    """

    __slots__ = ()

    if TYPE_CHECKING:  # the connection's state and methods this works with
        _decoder: FrameDecoder
        _dispatcher: Dispatcher
        _clock: Clock
        _transport: asyncio.Transport | None
        _read_view: memoryview
        _tasks: set[asyncio.Task[None]]
        _held: int
        _partial: int
        _budget_paused: bool
        _max_in_flight: int
        _max_request_bytes: int
        _stopped: bool
        _reading: bool
        _writing_paused: bool
        _pause_on_write: bool
        last_active: float

        def _resolve(self, response: RemotingCommand) -> None: ...
        def _refuse(self, exc: ProtocolError) -> None: ...
        def _update_reading(self) -> None: ...
        def _account(self) -> None: ...
        def _failed(self, exc: BaseException) -> None: ...
        def _unencodable(self, cmd: RemotingCommand, exc: ProtocolError) -> bytes: ...
        def _handle(self, cmd: RemotingCommand) -> Coroutine[Any, Any, None]: ...
        def _finish(self, cmd: RemotingCommand, outcome: Awaitable[Reply]
                    ) -> Coroutine[Any, Any, None]: ...
        def _spawn(self, handling: Coroutine[Any, Any, None], cmd: RemotingCommand,
                   size: int) -> None: ...

    def get_buffer(self, sizehint: int) -> memoryview:
        """The thread's read buffer (:func:`_read_buffer`), whatever the hint: the twin's is
        C, with no Python frame a read."""
        return self._read_view

    def buffer_updated(self, nbytes: int) -> None:
        # data_received's three lines rather than a call to it: one Python frame less a read.
        # The slice is copied into the decoder and dropped on return: no export outlives it.
        self.last_active = self._clock.monotonic()
        self._decoder.feed(self._read_view[:nbytes])
        self._pump()

    def data_received(self, data: bytes | memoryview) -> None:
        self.last_active = self._clock.monotonic()
        self._decoder.feed(data)
        self._pump()

    def _may_take(self) -> bool:
        return (
            not self._stopped
            and not (self._writing_paused and self._pause_on_write)
            and len(self._tasks) < self._max_in_flight
            and self._held < self._max_request_bytes
        )

    def _pump(self) -> None:
        """Decode and start what the limits allow; the rest waits in the decoder's buffer.
        The limits are read once before the first frame and once after each, and reading
        is paused or resumed only when that changes what the transport does."""
        decoder = self._decoder
        take = self._may_take()
        try:
            while take and (before := decoder.buffered):
                if (cmd := decoder.next_command()) is None:
                    break
                if cmd.flag & RESPONSE_FLAG:  # cmd.is_response, without a call a frame
                    self._resolve(cmd)
                else:
                    self._start(cmd, before - decoder.buffered)
                take = self._may_take()
        except ProtocolError as exc:
            self._refuse(exc)
            take = self._may_take()
        if decoder.buffered != self._partial:  # a frame begun or ended: the budget's business
            self._account()
        if (take and not self._budget_paused) != self._reading:
            self._update_reading()

    def _start(self, cmd: RemotingCommand, size: int) -> None:
        """Run ``cmd``'s handler: in a task, or (eager dispatcher) at once, answering at once
        when it does, with a task only for what is left when its coroutine suspends."""
        if not self._dispatcher.eager:
            self._spawn(self._handle(cmd), cmd, size)
            return
        handler = self._dispatcher.handler(cmd.code)
        outcome: Awaitable[Reply] | Reply
        try:
            outcome = Dispatcher.unsupported(cmd) if handler is None else handler(self, cmd)
        except Exception as exc:
            outcome = Dispatcher.failed(self, cmd, exc)
        if outcome is None or isinstance(outcome, _ANSWERS):
            self._answer(cmd, outcome)  # type: ignore[arg-type]
            return
        handling = self._finish(cmd, outcome)
        try:
            suspended_on = handling.send(None)
        except StopIteration:
            return  # answered already: no task, nothing held
        except Exception as exc:
            self._failed(exc)
            return
        self._spawn(_resumed(handling, suspended_on), cmd, size)

    def _answer(self, cmd: RemotingCommand, response: Reply) -> None:
        transport = self._transport
        if (response is None or cmd.flag & ONEWAY_FLAG or transport is None
                or transport.is_closing()):
            return
        try:
            frame = response if isinstance(response, bytes) else response.encode()
        except ProtocolError as exc:
            frame = self._unencodable(cmd, exc)
        transport.write(frame)  # as _write does, its checks made above
        self.last_active = self._clock.monotonic()


def _compiled_read_path() -> type[ReadPath] | None:
    """The compiled read path, bound to this module; None where it was not built, or the frame
    kernels are not built or not wanted (their switch, :data:`evq.net.protocol.COMPILED`)."""
    if protocol.COMPILED is None:
        return None
    try:
        from evq.net import read_path
    except ImportError:
        return None
    read_path.bind(take_frame=protocol.take_frame, protocol_error=ProtocolError,
                   answers=_ANSWERS, unsupported=Dispatcher.unsupported, failed=Dispatcher.failed,
                   resumed=_resumed, response_flag=RESPONSE_FLAG, oneway_flag=ONEWAY_FLAG,
                   decoder=protocol.FrameDecoder)
    return cast(type[ReadPath], read_path.ReadPath)


COMPILED_READ_PATH: Final = _compiled_read_path()
"""The compiled read path, or None where it is not built or not wanted."""
if TYPE_CHECKING:
    _ConnectionBase = ReadPath
else:
    _ConnectionBase = COMPILED_READ_PATH or ReadPath


class Connection(_ConnectionBase, asyncio.BufferedProtocol):
    """One TCP connection speaking remoting frames, either side.

    ``id`` is unique in the process; ``peer`` is the remote ``ip:port``, ``local`` this end's
    (the address a client reached: a broker bound to 0.0.0.0 learns its client-facing address
    here).  Close callbacks run once, when the connection is gone for whatever reason (the
    broker drops the client's channels there).  Reads land in the thread's shared buffer
    (:func:`_read_buffer`) and are copied into the connection's frame decoder at once; what
    happens to them then is its base's, :class:`ReadPath` or the compiled twin.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        config: TransportConfig,
        clock: Clock,
        *,
        pause_on_write: bool,
        security: ClientSecurity | None = None,
        max_header: int = HEADER_LENGTH_MASK,
        budget: ReadBudget | None = None,
    ) -> None:
        """``max_header``: the largest header taken from the peer; a server's connections
        pass ``config.max_header``, a client's take any its frame holds (a batch send's
        answer names every message the batch stored).  ``budget``: the server's, shared by
        its connections (see :mod:`evq.net.read_budget`); a client's have none."""
        self.id = next(_connection_ids)
        self._credentials = security.credentials if security is not None else None
        self.peer = "?"
        self.local = "?"
        self._dispatcher = dispatcher
        self._config = config
        self._clock = clock
        self._decoder = FrameDecoder(config.max_frame, max_header)
        self._opaques = OpaqueCounter()
        self._pending: dict[int, _Pending] = {}
        """This side's requests waiting for an answer, by opaque."""
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = _NEVER  # when ``_expiry`` fires: the earliest deadline it covers
        self._tasks: set[asyncio.Task[None]] = set()
        self._oneway: set[asyncio.Task[None]] = set()  # those of _tasks nobody waits on
        self._close_callbacks: list[CloseCallback] = []
        self._transport: asyncio.Transport | None = None
        # The loop, kept: asyncio.get_running_loop() asks the kernel for the pid on each call.
        self._loop = loop = asyncio.get_running_loop()
        self._loop_time = _loop_clock(loop)
        self._closed = loop.create_future()
        self.is_closed = False
        """Whether the connection is gone (set as it goes, with ``_closed``): a plain value,
        since a producer's every send asks its pool for the open connection."""
        self._pause_on_write = pause_on_write
        self._writing_paused = False
        self._write_waiters: list[asyncio.Future[None]] = []
        self._held = 0  # bytes of the requests running handlers hold
        self._budget = budget
        self._partial = 0  # bytes in the decoder as the budget last heard
        self._budget_paused = False  # not read for want of room in the budget
        # The limits _may_take checks for every frame, read out of the (frozen) config once.
        self._max_in_flight = config.max_in_flight
        self._max_request_bytes = config.max_request_bytes
        self._stopped = False  # no more requests taken: shutting down or framing lost
        self._reading = True
        # The loop thread's read buffer (a connection is made and read on its loop's thread).
        self._read_view = _read_buffer()
        self.last_active = clock.monotonic()

    # -- state the owner looks at -------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests from the peer being handled now."""
        return len(self._tasks)

    @property
    def reading_paused(self) -> bool:
        return not self._reading

    @property
    def held_request_bytes(self) -> int:
        """Bytes of the peer's requests being handled now."""
        return self._held

    @property
    def write_buffer_size(self) -> int:
        """Bytes written and not yet taken by the kernel."""
        return self._transport.get_write_buffer_size() if self._transport else 0

    def idle_seconds(self) -> float:
        """How long nothing has happened here; a connection with work running is never idle."""
        if self._tasks or self._pending:
            return 0.0
        return self._clock.monotonic() - self.last_active

    async def writable(self) -> None:
        """Return once this side's write buffer is under its high-water mark (or the
        connection is gone).  A handler about to build a large answer awaits this first, so
        a peer that stops reading holds at most one such answer beyond the mark."""
        while self._writing_paused and not self.is_closed:
            waiter = asyncio.get_running_loop().create_future()
            self._write_waiters.append(waiter)
            await waiter

    def _wake_writers(self) -> None:
        waiters, self._write_waiters = self._write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def add_close_callback(self, callback: CloseCallback) -> None:
        if self.is_closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # -- requests from this side --------------------------------------------------------------

    def send_request(self, cmd: RemotingCommand, timeout: float
                     ) -> Coroutine[Any, Any, RemotingCommand]:
        """Send ``cmd`` (its opaque is assigned here) and wait for the peer's answer; after
        ``timeout`` seconds without one, :class:`RequestTimeout`.  (:meth:`send_made`'s
        coroutine, returned as it is: a coroutine of this method's around it was one more
        frame every answer passed through on its way to the caller.)"""
        cmd.flag &= ~ONEWAY_FLAG
        return self.send_made(functools.partial(_stamped, cmd), timeout)

    async def send_made(self, make: MadeRequest, timeout: float) -> RemotingCommand:
        """Send the request ``make(opaque)`` makes for this connection's next opaque, and
        wait for the peer's answer as :meth:`send_request` does.

        For a request whose frame is written in one call with its opaque in it (a producer's
        send: :mod:`evq.client.send_kernels`): ``make`` returns the command and its whole
        frame, or None for the frame to be encoded here.  A connection with credentials signs
        the command and encodes it itself, since the signature adds to its fields."""
        opaque = self._opaques()
        cmd, frame = make(opaque)
        if self._credentials is not None:
            self._sign(cmd)
            frame = None
        future = Answer(loop=self._loop)
        deadline = self._loop_time() + timeout
        self._pending[opaque] = (future, deadline, cmd, timeout)
        if deadline < self._expiry_at:
            self._expire_at(deadline)
        try:
            self._write_frame(cmd.encode() if frame is None else frame)
            return await future
        finally:
            self._pending.pop(opaque, None)

    def _expire_at(self, when: float) -> None:
        """(Re)arm the connection's one expiry timer for ``when``.

        Timeouts are swept per connection, as RocketMQ's clients scan their response table,
        rather than given a timer each: a timer handle per request (made, pushed on the
        loop's heap through Python-level comparisons, cancelled, popped) cost more than the
        rest of sending it.  The timer fires at the earliest deadline pending when it was
        armed, so every request still fails at its own deadline; with one timeout for all
        requests it is re-armed about once per timeout, not once per request."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = self._loop.call_at(when, self._expire_due)
        self._expiry_at = when

    def _expire_due(self) -> None:
        """Fail the requests whose deadline has passed; re-arm for the earliest one left."""
        self._expiry, self._expiry_at = None, _NEVER
        now = self._loop_time()
        earliest = _NEVER
        for future, deadline, cmd, timeout in self._pending.values():
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(RequestTimeout(
                    f"request code {cmd.code} opaque {cmd.opaque} to {self.peer}: no response "
                    f"in {timeout:g} s"))
            elif deadline < earliest:
                earliest = deadline
        if earliest < _NEVER:
            self._expire_at(earliest)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send ``cmd`` with the oneway flag; the peer answers nothing."""
        cmd.flag |= ONEWAY_FLAG
        cmd.opaque = self._opaques()
        self._sign(cmd)
        self._write(cmd)

    def close(self) -> None:
        """Close after what is already written has been flushed."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close at once, dropping unsent bytes (a peer that stopped reading)."""
        if self._transport is not None:
            self._transport.abort()

    def running(self) -> list[asyncio.Task[None]]:
        """The tasks handling the peer's requests now (what a graceful shutdown waits for)."""
        return list(self._tasks)

    def stop(self) -> None:
        """Take no further requests from the peer; running ones still answer."""
        self._stopped = True
        self._update_reading()

    def _sign(self, cmd: RemotingCommand) -> None:
        """Sign a request this side sends, as RocketMQ's ``AclClientRPCHook`` does: every
        request of a connection opened with credentials, answers never."""
        if self._credentials is not None:
            cmd.ext_fields = signed_fields(self._credentials, cmd.ext_fields, cmd.body)

    def _write(self, cmd: RemotingCommand) -> None:
        self._write_frame(cmd.encode())

    def _write_frame(self, frame: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosed(f"connection {self.id} to {self.peer} is closed")
        transport.write(frame)
        self.last_active = self._clock.monotonic()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(
            high=self._config.write_high_water, low=self._config.write_low_water
        )
        self.peer = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.last_active = self._clock.monotonic()
        log.debug("connection opened", conn=self.id, peer=self.peer)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writers()
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        log.debug("connection closed", conn=self.id, peer=self.peer, error=exc)
        for task in self._tasks - self._oneway:
            task.cancel()  # nobody is left to read the answer (e.g. a parked long poll)
        # One-way requests run on: their sender counted them as delivered when it wrote them
        # (END_TRANSACTION, offsets), and may well hang up right after.
        closed = ConnectionClosed(f"connection {self.id} to {self.peer} closed")
        for future, *_ in self._pending.values():
            if not future.done():
                future.set_exception(closed)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry, self._expiry_at = None, _NEVER
        self.is_closed = True
        self._closed.set_result(None)
        if self._budget is not None:  # its cancelled handlers give back theirs as they end
            self._budget.forget(self, self._partial)
            self._partial = 0
        self._wake_writers()
        for callback in self._close_callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("close callback failed", conn=self.id, peer=self.peer)
        self._close_callbacks.clear()

    # -- incoming frames ----------------------------------------------------------------------

    def _update_reading(self) -> None:
        transport = self._transport
        want = self._may_take() and not self._budget_paused
        if transport is None or transport.is_closing() or want == self._reading:
            return
        self._reading = want
        if want:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def _account(self) -> None:
        """Tell the budget how many bytes the decoder holds now (a frame begun, grown or
        taken); past the budget, with bytes held, reading waits for room."""
        partial = self._decoder.buffered
        budget = self._budget
        if budget is None:
            self._partial = partial
            return
        delta, self._partial = partial - self._partial, partial
        budget.change(delta)
        if not self._budget_paused and not self.is_closed:
            self._budget_paused = budget.should_wait(self, partial)

    def budget_resumed(self) -> None:
        """Room again (see :class:`~evq.net.read_budget.ReadBudget`): whole frames were taken
        all along, so only reading is to resume."""
        self._budget_paused = False
        self._update_reading()

    def _spawn(self, handling: Coroutine[Any, Any, None], cmd: RemotingCommand,
               size: int) -> None:
        task = self._loop.create_task(handling, name=REQUEST_TASK_NAME)
        self._tasks.add(task)
        self._held += size
        if self._budget is not None:
            self._budget.change(size)
        if cmd.is_oneway:
            self._oneway.add(task)
        task.add_done_callback(functools.partial(self._handled, size))

    def _failed(self, exc: BaseException) -> None:
        log.error("request task failed", conn=self.id, peer=self.peer, error=repr(exc))

    def _resolve(self, response: RemotingCommand) -> None:
        pending = self._pending.get(response.opaque)
        if pending is None or pending[0].done():
            # A late answer to a request that timed out; the Java client drops them as well.
            log.debug("response to no pending request", conn=self.id, opaque=response.opaque)
            return
        pending[0].answer(response)

    async def _handle(self, cmd: RemotingCommand) -> None:
        """A lazy dispatcher's request, all of it in its task: the writer may have paused
        since the request was taken."""
        if self._pause_on_write and self._writing_paused:
            await self.writable()
        handler = self._dispatcher.handler(cmd.code)
        response: Reply
        try:
            response = (Dispatcher.unsupported(cmd) if handler is None
                        else await settled(handler(self, cmd)))
        except Exception as exc:
            response = Dispatcher.failed(self, cmd, exc)
        self._answer(cmd, response)

    async def _finish(self, cmd: RemotingCommand, outcome: Awaitable[Reply]) -> None:
        """The rest of an eager handler that answers later."""
        response: Reply
        try:
            response = await outcome
        except Exception as exc:
            response = Dispatcher.failed(self, cmd, exc)
        self._answer(cmd, response)

    def _unencodable(self, cmd: RemotingCommand, exc: ProtocolError) -> bytes:
        """The frame answering ``cmd`` whose handler's answer cannot be encoded."""
        log.error("response cannot be encoded", conn=self.id, code=cmd.code, error=str(exc))
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"response not encodable: {exc}").encode()

    def _handled(self, size: int, task: asyncio.Task[None]) -> None:
        self._held -= size
        if self._budget is not None:
            self._budget.change(-size)
        self._tasks.discard(task)
        self._oneway.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._failed(exc)
        if not self.is_closed:
            self._pump()

    def _refuse(self, exc: ProtocolError) -> None:
        log.warning("malformed frame, closing", conn=self.id, peer=self.peer, reason=exc.reason)
        self._stopped = True
        answer = exc.response()
        if answer is not None:
            self._write(answer)
        self.close()


class RemotingServer:
    """Accepts remoting connections on ``host:port`` (port 0 picks a free one).

    ``tls`` (None: clear text only, asyncio's own accept path) makes the port permissive or
    enforcing, through a :class:`~evq.net.listener.SniffingListener`; a connection joins
    :attr:`connections` once its handshake is done."""

    def __init__(
        self,
        host: str,
        port: int,
        dispatcher: Dispatcher,
        *,
        config: TransportConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        tls: ServerTls | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.dispatcher = dispatcher
        self.config = config or TransportConfig()
        self.tls = tls
        self._clock = clock
        self._server: asyncio.Server | None = None
        self._listener: SniffingListener | None = None
        self._connections: set[Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.budget = ReadBudget(self.config.max_buffered_bytes)
        """What its connections hold together, and those waiting for room."""
        self.refusals = Refusals("connections refused: the server is full",
                                 self.config.max_connections, clock)
        """Connections closed on arrival because :attr:`TransportConfig.max_connections`
        were open."""

    async def start(self, *, serving: bool = True) -> None:
        """Bind, and listen unless ``serving`` is False; ``port`` is the bound port afterwards.
        Raises OSError.

        A server that must learn its port before it can answer (a broker stamps its address
        into every stored record) binds first and calls :meth:`start_serving` once ready:
        until then the port is held but connections are refused, which every client retries,
        rather than accepted and answered with a code a client gives up on."""
        if self.tls is not None:
            self._listener = SniffingListener(self.host, self.port, self.tls,
                                              self._open, self._track)
            await self._listener.bind()
            self.port = self._listener.port
        else:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                self._new_connection, self.host, self.port, reuse_address=True, backlog=1024,
                start_serving=False,
            )
            self.port = self._server.sockets[0].getsockname()[1]
        if serving:
            await self.start_serving()

    async def start_serving(self) -> None:
        """Listen on the bound port and accept connections."""
        if self._listener is not None:
            await self._listener.start_serving()
        else:
            assert self._server is not None, "start() binds first"
            await self._server.start_serving()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        log.info("listening", host=self.host, port=self.port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._connections)

    def close_idle(self) -> int:
        """Close every connection idle for ``idle_timeout``; how many were closed."""
        idle = [c for c in self._connections if c.idle_seconds() >= self.config.idle_timeout]
        for conn in idle:
            log.info("closing idle connection", conn=conn.id, peer=conn.peer)
            conn.close()
        return len(idle)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop accepting and reading, give running handlers ``grace`` seconds to answer,
        then close every connection (aborting those whose peer does not take the bytes)."""
        if self._server is None and self._listener is None:
            return
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._sweeper is not None:
            self._sweeper.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        connections = list(self._connections)
        for conn in connections:
            conn.stop()
        running = [task for conn in connections for task in conn.running()]
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            if late:
                log.warning("cancelling handlers still running after grace", count=len(late))
                for task in late:
                    task.cancel()
        for conn in connections:
            conn.close()
        closing = [loop.create_task(conn.wait_closed()) for conn in connections]
        if closing:
            await asyncio.wait(closing, timeout=max(0.0, deadline - loop.time()))
        for conn, waiter in zip(connections, closing, strict=True):
            if not waiter.done():
                conn.abort()
                waiter.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        log.info("stopped", host=self.host, port=self.port)

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _new_connection(self) -> asyncio.BaseProtocol:
        """A clear-text port's protocol for an accepted socket, counted at once."""
        conn = self._open()
        self._track(conn)
        return conn

    def _open(self) -> asyncio.BaseProtocol:
        """The protocol for an accepted socket: a connection, or past ``max_connections`` one
        that closes it before a byte is read.  Over TLS this is asked before the handshake and
        the connection counted after it, so handshakes under way (``max_handshakes`` at most)
        may take the count past the bound by as many."""
        return _Refused() if self._full() else self._make_connection()

    def _make_connection(self) -> Connection:
        return Connection(self.dispatcher, self.config, self._clock, pause_on_write=True,
                          max_header=self.config.max_header, budget=self.budget)

    def _track(self, conn: asyncio.BaseProtocol) -> None:
        """Count an open connection (over TLS, once its handshake is done) until it closes."""
        if isinstance(conn, Connection):
            self._connections.add(conn)
            conn.add_close_callback(self._connections.discard)

    def _full(self) -> bool:
        """Whether ``max_connections`` are open, counting one more refusal if so."""
        if len(self._connections) < self.config.max_connections:
            return False
        self.refusals.refuse()
        return True

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.config.idle_check_interval)
            self.close_idle()


class _Refused(asyncio.Protocol):
    """What a connection past ``max_connections`` gets: closed as soon as it is made, before
    any of its bytes are read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class RemotingClient:
    """A connection to one ``host:port``, opened on first use and reopened after a close.

    ``dispatcher`` answers the requests the server sends this side (broker-initiated codes);
    without one every such request gets REQUEST_CODE_NOT_SUPPORTED.
    """

    def __init__(
        self,
        host: str,
        port: int,
        dispatcher: Dispatcher | None = None,
        *,
        config: TransportConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        security: ClientSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.dispatcher = dispatcher or Dispatcher()
        self.config = config or TransportConfig()
        self.security = security
        self._clock = clock
        self._conn: Connection | None = None
        self._connecting = asyncio.Lock()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def connection(self) -> Connection:
        """The open connection, connecting first if there is none.  Only connecting takes
        the lock (callers arriving meanwhile wait for that one connection): an open
        connection is returned without it."""
        if (conn := self._open()) is not None:
            return conn
        async with self._connecting:
            if (conn := self._open()) is None:
                conn = self._conn = await self._connect()
            return conn

    def _open(self) -> Connection | None:
        conn = self._conn
        return conn if conn is not None and not conn.is_closed else None

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and return the answer; raises a :class:`TransportError`."""
        conn = self._open() or await self.connection()
        return await conn.send_request(cmd, timeout)

    async def invoke_oneway(self, cmd: RemotingCommand) -> None:
        conn = await self.connection()
        conn.send_oneway(cmd)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.config.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(
                        self.dispatcher, self.config, self._clock, pause_on_write=False,
                        security=self.security,
                    ),
                    self.host,
                    self.port,
                    ssl=self.security.tls if self.security is not None else None,
                )
        except ssl.SSLError as exc:
            raise ConnectError(
                f"TLS handshake with {self.address} failed: {describe(exc)}") from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"cannot connect to {self.address}: {exc or 'timed out'}") from exc
        return conn


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (several times asyncio's throughput), else asyncio's."""
    return _uvloop_factory() if _uvloop_factory is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` to completion on a fresh :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def run_until_signal(serve: Callable[[asyncio.Event], Awaitable[_T]]) -> _T:
    """Run ``serve(stop)``; SIGTERM or SIGINT sets ``stop``, and ``serve`` shuts down then.

    ``serve`` starts its servers, awaits ``stop.wait()``, then shuts them down (for example
    :meth:`RemotingServer.shutdown`, then flushing the store) and returns the exit status.
    """

    async def main() -> _T:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            log.info("shutting down", signal=sig.name)
            stop.set()

        for sig in SHUTDOWN_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await serve(stop)
        finally:
            for sig in SHUTDOWN_SIGNALS:
                loop.remove_signal_handler(sig)

    return run(main())
