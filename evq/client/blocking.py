"""Synchronous wrappers for scripts: the asyncio client on a private loop in a daemon thread.

A script that is not async calls ``SyncProducer(...).send(msg)``; each call runs the
coroutine on the wrapper's own loop and blocks until it finishes, so the client has one
implementation and the wrapper only carries calls across the thread boundary.  The
exceptions are the calls scripts make most, the producer's plain send and the pull consumer's
poll: each is made on the caller's thread when the loop has already worked out where it goes
(:meth:`Producer.send_now`, :meth:`PullConsumer.poll_now`), since crossing to the loop and
back cost more than the request itself.
The consumers' background work (heartbeats, rebalancing, auto-commit, a push consumer's
pulls) runs on that loop between calls; a push consumer's plain-function listener runs in
worker threads.

:meth:`SyncProducer.send_async` is RocketMQ's ``send(msg, SendCallback)`` for such scripts: it
returns a :class:`concurrent.futures.Future` at once, and ``add_done_callback`` on it plays the
part of ``onSuccess``/``onException``.  Asyncio code has no need of it: a task of
:meth:`Producer.send` is already that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from evq.client.consumer import ConsumeResult, PushConsumer
from evq.client.direct import BlockingLines
from evq.client.producer import Producer, QueueSelector, SendResult
from evq.client.pull_consumer import PULL_TIMEOUT_MARGIN_S, PullConsumer
from evq.client.pulling import PullResult
from evq.client.transactions import (
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from evq.net.transport import new_event_loop

_T = TypeVar("_T")


class LoopThread:
    """An event loop running in its own thread until :meth:`stop`."""

    def __init__(self) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="evq-client-loop")
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Start ``coro`` on the loop; its future's callbacks run in the loop's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.submit(coro).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class SyncProducer:
    """:class:`Producer` for synchronous code; started on construction.

    :meth:`send` and :meth:`send_batch` are made on the caller's thread over a blocking
    connection of its own (:mod:`evq.client.direct`) whenever the loop already knows the
    topic's route and has greeted its broker; the loop's thread makes the rest, retries
    included.  Any number of threads may send at once."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        self._thread = LoopThread()
        self._producer = self._new(group, namesrv, **options)
        self._lines = BlockingLines(self._producer.send_timeout, self._producer.security)
        self._thread.run(self._producer.start())

    def _new(self, group: str, namesrv: str, **options: Any) -> Producer:
        return Producer(group, namesrv, **options)

    @property
    def direct_sends(self) -> int:
        """Sends made on the callers' threads and answered (the loop's thread made the rest)."""
        return self._lines.answered

    def lines(self, addr: str) -> int:
        """Blocking connections open to the broker at ``addr``."""
        return self._lines.lines(addr)

    def send(self, msg: Message) -> SendResult:
        # The first attempt here, the rest on the loop (send_batch's three lines, not a
        # shared helper: a sync send waits on every Python frame it runs).
        msgs = (msg,)
        sent = self._producer.send_now(msgs, self._lines)
        if isinstance(sent, SendResult):
            return sent
        return self._thread.run(self._producer.send_after(msgs, sent))

    def send_batch(self, msgs: Sequence[Message]) -> SendResult:
        sent = self._producer.send_now(msgs, self._lines, batch=True)
        if isinstance(sent, SendResult):
            return sent
        return self._thread.run(self._producer.send_after(msgs, sent, batch=True))

    def send_async(self, msg: Message) -> concurrent.futures.Future[SendResult]:
        """Send without waiting: the future holds the :class:`SendResult` or the exception
        :meth:`send` would have raised.  Callbacks added to it run in the client's loop
        thread, between its network work, so they must not block."""
        return self._thread.submit(self._producer.send(msg))

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to ``topic`` may go to (its route, looked up when missing)."""
        return self._thread.run(self._producer.publish_queues(topic))

    def send_orderly(self, msg: Message, key: str,
                     selector: QueueSelector | None = None) -> SendResult:
        return self._thread.run(self._producer.send_orderly(msg, key, selector))

    def send_to_queue(self, msg: Message, queue_id: int) -> SendResult:
        return self._thread.run(self._producer.send_to_queue(msg, queue_id))

    def send_oneway(self, msg: Message) -> None:
        self._thread.run(self._producer.send_oneway(msg))

    def shutdown(self) -> None:
        self._lines.close()
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


class SyncPullConsumer:
    """:class:`PullConsumer` for synchronous code: ``subscribe`` (or, after ``start``,
    ``assign``), then ``poll`` and ``commit``; ``with`` starts and shuts it down.

    :meth:`poll` is made on the caller's thread over a blocking connection of its own
    (:mod:`evq.client.direct`) whenever the queue is assigned and its topic routed; the
    loop's thread makes the rest (a broker that failed, the first poll of a topic) and all
    the background work.  Threads may poll different queues at once."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        self._thread = LoopThread()
        self._consumer = PullConsumer(group, namesrv, **options)
        self._lines: BlockingLines | None = None

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._consumer.subscribe(topic, expression)

    def start(self) -> None:
        self._thread.run(self._consumer.start())
        self._lines = BlockingLines(PULL_TIMEOUT_MARGIN_S, self._consumer.security)

    def shutdown(self) -> None:
        if self._lines is not None:
            self._lines.close()
        self._thread.run(self._consumer.shutdown())
        self._thread.stop()

    @property
    def direct_polls(self) -> int:
        """Polls made on the callers' threads and answered (the loop's thread made the rest)."""
        return 0 if self._lines is None else self._lines.answered

    def lines(self, addr: str) -> int:
        """Blocking connections open to the broker at ``addr``."""
        return 0 if self._lines is None else self._lines.lines(addr)

    def __enter__(self) -> SyncPullConsumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._thread.run(self._consumer.queues(topic))

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        self._thread.run(self._consumer.assign(queues))

    @property
    def assignment(self) -> dict[MessageQueue, int]:
        return self._consumer.assignment

    def poll(self, queue: MessageQueue, max_nums: int = 32, *, wait_ms: int = 0) -> PullResult:
        lines = self._lines
        if lines is not None:
            result = self._consumer.poll_now(queue, max_nums, lines, wait_ms=wait_ms)
            if result is not None:
                return result
        return self._thread.run(self._consumer.poll(queue, max_nums, wait_ms=wait_ms))

    def poll_all(self, max_nums: int = 32, *, wait_ms: int = 0) -> list[Message]:
        return self._thread.run(self._consumer.poll_all(max_nums, wait_ms=wait_ms))

    def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        self._thread.run(self._consumer.commit(offsets))

    def committed(self, queue: MessageQueue) -> int:
        return self._thread.run(self._consumer.committed(queue))

    def seek(self, queue: MessageQueue, offset: int) -> None:
        self._thread.run(self._seek(queue, offset))

    async def _seek(self, queue: MessageQueue, offset: int) -> None:
        self._consumer.seek(queue, offset)  # positions belong to the loop's thread

    def seek_to_begin(self, queue: MessageQueue) -> None:
        self._thread.run(self._consumer.seek_to_begin(queue))

    def seek_to_end(self, queue: MessageQueue) -> None:
        self._thread.run(self._consumer.seek_to_end(queue))

    def seek_to_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> None:
        self._thread.run(self._consumer.seek_to_timestamp(queue, timestamp_ms))


SyncListener = Callable[[list[Message]], ConsumeResult]
"""A push listener as a plain function; it may block (it runs in a worker thread)."""


class SyncPushConsumer:
    """:class:`PushConsumer` for synchronous code: ``subscribe``, then ``start(listener)``;
    messages are consumed in the background until ``shutdown``.  Options are the push
    consumer's keyword arguments (``model``, ``options``, ...)."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        self._thread = LoopThread()
        self._consumer = PushConsumer(group, namesrv, **options)

    def subscribe(self, topic: str, expression: str = "*",
                  expression_type: str = "TAG") -> None:
        self._consumer.subscribe(topic, expression, expression_type)

    def start(self, listener: SyncListener) -> None:
        async def in_a_thread(msgs: list[Message]) -> ConsumeResult:
            return await asyncio.to_thread(listener, msgs)

        self._consumer.register_listener(in_a_thread)
        self._thread.run(self._consumer.start())

    @property
    def assigned(self) -> set[MessageQueue]:
        return self._consumer.assigned

    def wait(self, timeout: float | None = None) -> None:
        """Block until :meth:`shutdown` (from another thread) or ``timeout`` seconds; raises
        :class:`~evq.client.errors.BackgroundFailed` once the consumer's background work has
        failed for good (see :meth:`PushConsumer.wait`)."""
        waiting = self._thread.submit(self._consumer.wait())
        try:
            waiting.result(timeout)
        except concurrent.futures.TimeoutError:
            waiting.cancel()

    def shutdown(self) -> None:
        self._thread.run(self._consumer.shutdown())
        self._thread.stop()
