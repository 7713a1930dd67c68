"""Transactional sends: a half message, the local transaction, then commit or rollback.

``send_in_transaction`` stores the message as a *half* (TRAN_MSG, invisible to consumers),
runs the application's local transaction, and ends the half with END_TRANSACTION: COMMIT makes
the message consumable, ROLLBACK drops it, UNKNOWN leaves it to the broker.  A half that is not
ended (the answer was UNKNOWN, the END_TRANSACTION was lost, or the producer died in between)
is checked back: the broker sends CHECK_TRANSACTION_STATE to a live producer of the same
group, which asks the application's ``check`` and answers with END_TRANSACTION
(``fromTransactionCheck``).  Any member of the group may be asked, so ``check`` must decide
from shared state (a database: :mod:`evq.client.sqltx`), not from the memory of the member
that sent the half.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import attrs

from evq import logs
from evq.client.errors import ClientError
from evq.client.producer import Producer, SendResult, SendStatus
from evq.domain import sysflag as sf
from evq.domain.message import Message, Prop
from evq.domain.record import decode, parse_offset_msg_id
from evq.net.codes import RequestCode
from evq.net.headers.transactions import CheckTransactionStateRequest, EndTransactionRequest
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler, TransportError

log = logs.get_logger(__name__)


class TransactionState(enum.Enum):
    """The local transaction's outcome; values are END_TRANSACTION's ``commitOrRollback``."""

    COMMIT = sf.TRANSACTION_COMMIT_TYPE
    ROLLBACK = sf.TRANSACTION_ROLLBACK_TYPE
    UNKNOWN = sf.TRANSACTION_NOT_TYPE


StateOrAwaitable = TransactionState | Awaitable[TransactionState]


class TransactionListener(Protocol):
    """The application's side.  Either method may be a coroutine function; a plain function
    runs in a worker thread, so it may block (a database call) without stalling the client."""

    def execute(self, msg: Message, arg: object) -> StateOrAwaitable:
        """Run the local transaction for the half message ``msg`` (already stored)."""

    def check(self, msg: Message) -> StateOrAwaitable:
        """Decide a half the broker could not: did its local transaction commit?"""


@attrs.frozen(slots=True)
class TransactionSendResult:
    send: SendResult
    state: TransactionState
    transaction_id: str
    """The half's UNIQ_KEY: what ``check`` is asked about."""


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends in transactions and answers check-backs."""

    def __init__(self, group: str, namesrv: str, listener: TransactionListener,
                 **options: object) -> None:
        super().__init__(group, namesrv, **options)  # type: ignore[arg-type]
        self.listener = listener
        self._checks: set[asyncio.Task[None]] = set()

    def handlers(self) -> Mapping[int, Handler]:
        return {RequestCode.CHECK_TRANSACTION_STATE: self._check_requested}

    async def shutdown(self) -> None:
        for task in list(self._checks):
            task.cancel()
        await super().shutdown()

    async def send_in_transaction(self, msg: Message, arg: object = None
                                  ) -> TransactionSendResult:
        """Store ``msg`` as a half, run ``listener.execute(msg, arg)``, end the half.

        A half the broker refused raises (nothing was stored, the local transaction does not
        run); a listener that raises counts as UNKNOWN and is left to the check-back, since
        its side effects may or may not have happened.
        """
        if Prop.DELAY in msg.properties:
            raise ClientError("a transactional message cannot be delayed")
        msg.properties[Prop.TRAN_MSG] = "true"
        msg.properties[Prop.PGROUP] = self.group
        msg.sysflag = (msg.sysflag & ~sf.TRANSACTION_MASK) | sf.TRANSACTION_PREPARED_TYPE
        sent = await self.send(msg)
        tx_id = msg.properties[Prop.UNIQ_KEY]
        if sent.status is SendStatus.SEND_OK:
            state = await self._ask(self.listener.execute, msg, arg, tx_id=tx_id)
        else:  # stored, but not as durably as asked: Java rolls such a half back
            state = TransactionState.ROLLBACK
        addr = (await self._started()[0].route(sent.queue.topic, fallback=True)
                ).master(sent.queue.broker_name)
        if addr is not None:
            await self._end(self._started()[1].client(addr).invoke_oneway, sent.queue_offset,
                            parse_offset_msg_id(sent.offset_msg_id)[1], state, tx_id,
                            from_check=False)
        return TransactionSendResult(sent, state, tx_id)

    async def _check_requested(self, conn: Connection, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE is one-way: decide in a task and answer on the same
        connection, so a slow ``check`` never holds up the connection's other traffic."""
        task = self._supervised().task("answer a transaction check",
                                       self._answer_check(conn, cmd))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, conn: Connection, cmd: RemotingCommand) -> None:
        h = CheckTransactionStateRequest.read(cmd.ext_fields)
        msg = decode(cmd.body or b"", check_crc=False)
        tx_id = h.transaction_id or msg.properties.get(Prop.UNIQ_KEY, "")
        state = await self._ask(self.listener.check, msg, tx_id=tx_id)

        async def reply(request: RemotingCommand) -> None:
            conn.send_oneway(request)

        await self._end(reply, h.tran_state_table_offset, h.commit_log_offset, state, tx_id,
                        from_check=True, msg_id=h.msg_id)

    @staticmethod
    async def _ask(fn: Callable[..., StateOrAwaitable], *args: object, tx_id: str
                   ) -> TransactionState:
        try:
            if inspect.iscoroutinefunction(fn):
                state = await fn(*args)
            else:
                state = await asyncio.to_thread(fn, *args)
                if inspect.isawaitable(state):
                    state = await state
        except Exception:
            log.exception("transaction listener failed", transaction_id=tx_id)
            return TransactionState.UNKNOWN
        if not isinstance(state, TransactionState):
            log.error("transaction listener answered no TransactionState",
                      transaction_id=tx_id, answer=repr(state))
            return TransactionState.UNKNOWN
        return state

    async def _end(self, send: Callable[[RemotingCommand], Awaitable[None]],
                   queue_offset: int, commit_log_offset: int, state: TransactionState,
                   tx_id: str, *, from_check: bool, msg_id: str | None = None) -> None:
        request = RemotingCommand.request(RequestCode.END_TRANSACTION, EndTransactionRequest.write(
            producer_group=self.group, tran_state_table_offset=queue_offset,
            commit_log_offset=commit_log_offset, commit_or_rollback=state.value,
            from_transaction_check=from_check, msg_id=msg_id or tx_id, transaction_id=tx_id,
        ), oneway=True)
        try:
            await send(request)
        except TransportError as exc:  # lost: the broker's check-back asks again
            log.warning("END_TRANSACTION not sent", transaction_id=tx_id, error=str(exc))
        log.debug("transaction ended", transaction_id=tx_id, state=state.name,
                  from_check=from_check)
