"""Synchronous wrappers for scripts: the asyncio client on a private loop in a daemon thread.

A script that is not async calls ``SyncProducer(...).send(msg)``; each call runs the
coroutine on the wrapper's own loop and blocks until it finishes, so the client has one
implementation and the wrapper only carries calls across the thread boundary.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from evq.client.producer import Producer, QueueSelector, SendResult
from evq.client.transactions import (
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from evq.domain.message import Message
from evq.net.transport import new_event_loop

_T = TypeVar("_T")


class LoopThread:
    """An event loop running in its own thread until :meth:`stop`."""

    def __init__(self) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="evq-client-loop")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class SyncProducer:
    """:class:`Producer` for synchronous code; started on construction."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        self._thread = LoopThread()
        self._producer = self._new(group, namesrv, **options)
        self._thread.run(self._producer.start())

    def _new(self, group: str, namesrv: str, **options: Any) -> Producer:
        return Producer(group, namesrv, **options)

    def send(self, msg: Message) -> SendResult:
        return self._thread.run(self._producer.send(msg))

    def send_batch(self, msgs: Sequence[Message]) -> SendResult:
        return self._thread.run(self._producer.send_batch(msgs))

    def send_orderly(self, msg: Message, key: str,
                     selector: QueueSelector | None = None) -> SendResult:
        return self._thread.run(self._producer.send_orderly(msg, key, selector))

    def send_to_queue(self, msg: Message, queue_id: int) -> SendResult:
        return self._thread.run(self._producer.send_to_queue(msg, queue_id))

    def send_oneway(self, msg: Message) -> None:
        self._thread.run(self._producer.send_oneway(msg))

    def shutdown(self) -> None:
        self._thread.run(self._producer.shutdown())
        self._thread.stop()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class SyncTransactionProducer(SyncProducer):
    """:class:`TransactionProducer` for synchronous code; the listener's plain methods run in
    worker threads, so they may block on a database."""

    def __init__(self, group: str, namesrv: str, listener: TransactionListener,
                 **options: Any) -> None:
        self._listener = listener
        super().__init__(group, namesrv, **options)

    def _new(self, group: str, namesrv: str, **options: Any) -> TransactionProducer:
        return TransactionProducer(group, namesrv, self._listener, **options)

    def send_in_transaction(self, msg: Message, arg: object = None) -> TransactionSendResult:
        producer = self._producer
        assert isinstance(producer, TransactionProducer)
        return self._thread.run(producer.send_in_transaction(msg, arg))
