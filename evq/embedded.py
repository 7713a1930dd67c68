"""evq inside your own process: a broker on a local store, no network.

    import evq
    with evq.Broker.open("./evq-data") as broker:
        broker.create_topic("orders", queues=4)
        broker.send("orders", b"order #1", tags="created", keys=["o-1"])
        for msg in broker.subscribe("billing", "orders", "created", idle_timeout=1.0):
            print(msg.payload())

This is the shell around :class:`evq.domain.broker.Broker` for embedded use: it opens the
store and the metadata database, runs the broker's timed duties on a background thread, and
offers a producer's and a consumer's conveniences (UNIQ_KEY ids, compression, queue choice by
sharding key, an iterator over new messages).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from pathlib import Path

import attrs

from evq import logs
from evq.backends.config import StoreConfig
from evq.backends.registry import DEFAULT_BACKEND, open_log
from evq.domain import topics as tp
from evq.domain.broker import Broker as BrokerCore
from evq.domain.broker import PullResult, SendResult, tags_code_fn
from evq.domain.broker_config import BrokerConfig
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.delay import DelayLevels
from evq.domain.filters import parse_subscription
from evq.domain.hashing import java_hash
from evq.domain.ids import new_uniq_key_run, new_uniq_keys
from evq.domain.log import Dispatched, MessageLog, StoreUnavailable
from evq.domain.message import (
    Message,
    Prop,
    PropertyError,
    encode_properties,
    new_message,
)
from evq.domain.metadata import MetadataStore
from evq.domain.record import parse_offset_msg_id
from evq.domain.retry import send_back
from evq.domain.schedule import DelayService, TimerService
from evq.domain.sent import KeyedSend, SentEntry, sent_entries
from evq.domain.transactions import TransactionService
from evq.meta.sql import SqlMetadataStore

log = logs.get_logger(__name__)

LocalTransaction = Callable[[Message], bool | None]
"""Runs the producer's local transaction: True commits, False rolls back, None leaves the
outcome to the check-back."""


class _Arrivals:
    """Wakes blocked subscribers when the log dispatches new records.

    It listens to the log only while a :meth:`Broker.subscribe` iterates: the log builds an
    event per appended record only for listeners, which cost a producer-only service about
    a tenth of a single send.
    """

    def __init__(self, log: MessageLog) -> None:
        self.cond = threading.Condition()
        self.generation = 0
        self._log = log
        # Not the condition: the log calls us (taking the condition) from its appending
        # thread, and (un)subscribing must never wait for that thread.
        self._watch_lock = threading.Lock()
        self._watchers = 0
        self._unsubscribe: Callable[[], None] | None = None

    def __call__(self, batch: Sequence[Dispatched]) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Listen to the log while the block runs (nested and concurrent blocks share it)."""
        with self._watch_lock:
            if not self._watchers:
                self._unsubscribe = self._log.subscribe_dispatch(self)
            self._watchers += 1
        try:
            yield
        finally:
            with self._watch_lock:
                self._watchers -= 1
                if not self._watchers and self._unsubscribe is not None:
                    self._unsubscribe()
                    self._unsubscribe = None


class Broker:
    """An embedded evq broker.  Open it with :meth:`open`; close it (or use ``with``)."""

    def __init__(self, core: BrokerCore, *, background: bool, tick_interval: float = 0.1) -> None:
        self.core = core
        self.transactions = TransactionService(core)
        self.delays = DelayService(core)
        self.timers = TimerService(core)
        self._arrivals = _Arrivals(core.log)
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if background:
            self._ticker = threading.Thread(target=self._run, args=(tick_interval,),
                                            name="evq-broker-tick", daemon=True)
            self._ticker.start()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] = "./evq-data",
        backend: str = DEFAULT_BACKEND,
        *,
        store_config: StoreConfig | None = None,
        broker_config: BrokerConfig | None = None,
        metadata: MetadataStore | str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        background: bool = True,
    ) -> Broker:
        """Open (recovering if needed) the broker whose data lives at ``path``.

        ``metadata`` is a SQLAlchemy URL or a store; by default a SQLite file under
        ``path/config``.  With ``background=False`` nothing runs on its own: call
        :meth:`tick` (tests with a ManualClock do).  Raises
        :class:`~evq.domain.log.StoreUnavailable` when ``path`` cannot be opened (a file in
        the way, no permission, a read-only file system).
        """
        root = Path(path)
        config = broker_config or BrokerConfig()
        store = store_config or StoreConfig()
        if broker_config is not None and store_config is None:
            store = attrs.evolve(store, store_host=config.store_host)
        levels = DelayLevels.parse(config.message_delay_level)
        try:
            message_log = open_log(backend, root, store, clock=clock,
                                   tags_code_fn=tags_code_fn(levels), background=background)
        except OSError as exc:
            raise StoreUnavailable(root, exc) from exc
        try:
            if metadata is None:
                try:
                    meta: MetadataStore = SqlMetadataStore.in_dir(root / "config")
                except OSError as exc:
                    raise StoreUnavailable(root / "config", exc) from exc
            elif isinstance(metadata, str):
                meta = SqlMetadataStore(metadata)
            else:
                meta = metadata
            core = BrokerCore(message_log, meta, config, clock=clock)
        except BaseException:
            message_log.close()
            raise
        return cls(core, background=background)

    # --- lifecycle --------------------------------------------------------------------------

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.core.tick()
            except Exception:
                log.exception("broker_tick_failed")

    def tick(self) -> None:
        self.core.tick()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        try:
            self.core.close()
        finally:
            self.core.log.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- topics -----------------------------------------------------------------------------

    def create_topic(self, topic: str, queues: int = 4, *, order: bool = False) -> tp.TopicConfig:
        return self.core.create_topic(tp.TopicConfig(
            topic_name=topic, read_queue_nums=queues, write_queue_nums=queues, order=order))

    def delete_topic(self, topic: str) -> None:
        self.core.delete_topic(topic)

    # --- producing --------------------------------------------------------------------------

    def message(
        self,
        topic: str,
        body: bytes | str,
        *,
        tags: str | None = None,
        keys: Iterable[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        deliver_at_ms: int | None = None,
    ) -> Message:
        """A message as a producer builds it: UNIQ_KEY set, large bodies compressed."""
        (m,) = self.messages(topic, (body,), tags=tags, keys=keys, properties=properties,
                             delay_level=delay_level, deliver_at_ms=deliver_at_ms)
        return m

    def messages(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        *,
        tags: str | None = None,
        keys: Iterable[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        deliver_at_ms: int | None = None,
    ) -> list[Message]:
        """:meth:`message` for each of ``bodies``, sharing what they share: the clock is
        read once and the UNIQ_KEYs are made together."""
        timing: dict[str, str] = {}
        if delay_level:
            timing[Prop.DELAY] = str(delay_level)
        if deliver_at_ms is not None:
            timing[Prop.START_DELIVER_TIME] = str(deliver_at_ms)
        batch = [new_message(topic, body.encode() if isinstance(body, str) else body,
                             tags=tags, keys=keys, properties=properties) for body in bodies]
        now = self.core.clock.now_ms()
        host = self.core.config.store_host
        for m, key in zip(batch, new_uniq_keys(now, len(batch)), strict=True):
            props = m.properties
            props.setdefault(Prop.UNIQ_KEY, key)
            if timing:
                props.update(timing)
            m.born_timestamp = now
            m.born_host = host
        return batch

    def send(
        self, topic: str, body: bytes | str, *, queue_id: int = -1,
        sharding_key: str | None = None, **fields: object,
    ) -> SendResult:
        """Send one message; ``sharding_key`` keeps all messages of a key in one queue, in
        order (RocketMQ's orderly send with a hash selector)."""
        return self._send(topic, [body], self._queue_for(topic, queue_id, sharding_key), fields)

    def send_batch(self, topic: str, bodies: Iterable[bytes | str], *, queue_id: int = -1,
                   **fields: object) -> SendResult:
        """Several messages in one append: one queue, consecutive offsets."""
        return self._send(topic, list(bodies), queue_id, fields)

    def _send(self, topic: str, bodies: list[bytes | str], queue_id: int,
              fields: Mapping[str, object]) -> SendResult:
        """Messages as :meth:`messages` makes them, put as a producer's request is (the plain
        path when nothing routes them: no Message, no property map per message), then the
        flush policy awaited."""
        sent = self._sent(bodies, **fields)  # type: ignore[arg-type]
        if sent is None:
            batch = self.messages(topic, bodies, **fields)  # type: ignore[arg-type]
            if batch:
                batch[0].queue_id = queue_id  # the broker puts the whole batch in its queue
            return self._checked(self.core.send(batch))
        entries, now = sent
        result, _ = self.core.put_sent(topic, entries, queue_id=queue_id, born_timestamp=now,
                                       born_host=self.core.config.store_host)
        return self._checked(self.core.durable(result))

    def _sent(
        self,
        bodies: list[bytes | str],
        *,
        tags: str | None = None,
        keys: Iterable[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        deliver_at_ms: int | None = None,
    ) -> tuple[list[SentEntry] | KeyedSend, int] | None:
        """:meth:`messages`' messages as a send request's entries, and their born time; None
        for a delay or a deliver-at time (they route), or properties the string cannot carry
        (the Message path refuses them, where it always has)."""
        if delay_level or deliver_at_ms is not None:
            return None
        shared = new_message("", b"", tags=tags, keys=keys, properties=properties).properties
        try:
            text = encode_properties(shared)
        except PropertyError:
            return None
        now = self.core.clock.now_ms()
        if Prop.UNIQ_KEY not in shared:  # each message's key, last, as messages() sets it
            return KeyedSend(bodies, text, new_uniq_key_run(now, len(bodies))), now
        encoded = [b.encode() if isinstance(b, str) else b for b in bodies]
        return sent_entries(zip(repeat(0), encoded, repeat(text))), now

    def send_transactional(
        self, topic: str, body: bytes | str, producer_group: str,
        local_transaction: LocalTransaction, **fields: object,
    ) -> SendResult | None:
        """Half message, local transaction, then commit or rollback.  Returns the committed
        message's result, or None when rolled back or left to the check-back."""
        m = self.message(topic, body, **fields)  # type: ignore[arg-type]
        m.properties[Prop.TRAN_MSG] = "true"
        m.properties[Prop.PGROUP] = producer_group
        m.queue_id = self._queue_for(topic, -1, None)
        half = self._checked(self.core.send(m))
        (stored,) = half.appended
        try:
            outcome = local_transaction(m)
        except Exception:
            log.exception("local_transaction_failed", topic=topic)
            outcome = None
        return self.transactions.end(producer_group, stored.queue_offset,
                                     stored.physical_offset, outcome)

    def _queue_for(self, topic: str, queue_id: int, sharding_key: str | None) -> int:
        if sharding_key is None:
            return queue_id
        config = self.core.topic(topic)
        n = config.write_queue_nums if config else 4
        return abs(java_hash(sharding_key)) % max(1, n)

    @staticmethod
    def _checked(result: SendResult) -> SendResult:
        if result.code is not ResponseCode.SUCCESS and not result.appended:
            raise BrokerError(result.code, result.status.value)
        return result

    # --- consuming --------------------------------------------------------------------------

    def pull(self, group: str, topic: str, queue_id: int, offset: int, *,
             expression: str = "*", expression_type: str = "TAG", max_count: int = 32
             ) -> PullResult:
        sub = parse_subscription(topic, expression, expression_type)
        return self.core.pull(group, topic, queue_id, offset, max_count=max_count,
                              subscription=sub)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.core.commit_offset(group, topic, queue_id, offset)

    def subscribe(
        self, group: str, topic: str, expression: str = "*", *, expression_type: str = "TAG",
        from_beginning: bool = True, idle_timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[Message]:
        """Every new message of ``topic`` (and of the group's retry topic) for one consumer
        of ``group``, in queue order, committing as it goes; ends after ``idle_timeout``
        seconds without a message, or when ``stop`` is set.

        A message is committed when the next one is asked for (at least once): a consumer
        that dies while handling one gets it again.
        """
        sub = parse_subscription(topic, expression, expression_type)
        retry = parse_subscription(tp.retry_topic(group), "*")
        self.core.ensure_group(group)
        with self._arrivals.watching():
            while stop is None or not stop.is_set():
                with self._arrivals.cond:
                    seen = self._arrivals.generation
                got = False
                for name, s in ((topic, sub), (tp.retry_topic(group), retry)):
                    config = self.core.topic(name)
                    for qid in range(config.read_queue_nums if config else 0):
                        for m in self._drain(group, name, qid, s, from_beginning):
                            got = True
                            yield m
                if got:
                    continue
                with self._arrivals.cond:
                    if self._arrivals.generation == seen and not self._arrivals.cond.wait(
                        idle_timeout if idle_timeout is not None else 1.0
                    ) and idle_timeout is not None:
                        return

    def _drain(self, group: str, topic: str, queue_id: int, sub: object,
               from_beginning: bool) -> Iterator[Message]:
        offset = self.core.query_offset(group, topic, queue_id)
        if offset < 0:
            lo, hi = self.core.log.bounds(topic, queue_id)
            offset = lo if from_beginning else hi
        while True:
            r = self.core.pull(group, topic, queue_id, offset, subscription=sub)  # type: ignore[arg-type]
            if r.code is ResponseCode.PULL_OFFSET_MOVED:
                offset = r.next_begin_offset
                continue
            for m, qo in zip(r.messages(), r.queue_offsets, strict=True):
                if m.topic.startswith(tp.RETRY_PREFIX):
                    m.topic = m.properties.get(Prop.RETRY_TOPIC, m.topic)
                yield m
                self.core.commit_offset(group, topic, queue_id, qo + 1)
            if r.next_begin_offset != offset:
                self.core.commit_offset(group, topic, queue_id, r.next_begin_offset)
            if r.code is ResponseCode.PULL_NOT_FOUND:
                return
            offset = r.next_begin_offset

    def reconsume_later(self, group: str, message: Message, delay_level: int = 0) -> None:
        """Give a message back: it returns through ``%RETRY%<group>`` after its delay."""
        send_back(self.core, group, message.commit_log_offset, delay_level=delay_level)

    def reset_offsets(self, group: str, topic: str, timestamp_ms: int) -> dict[int, int]:
        return self.core.reset_offset_by_time(group, topic, timestamp_ms)

    # --- queries ----------------------------------------------------------------------------

    def query_by_key(self, topic: str, key: str, max_count: int = 32) -> list[Message]:
        return self.core.query_by_key(topic, key, max_count)

    def view(self, msg_id: str) -> Message:
        """A message by its offset msgId (the id a send returns)."""
        _host, offset = parse_offset_msg_id(msg_id)
        return self.core.view_by_offset(offset)
