"""The broker's logic over a MessageLog and a MetadataStore: embeddable, no I/O of its own.

The network broker and :mod:`evq.embedded` are shells around :class:`Broker`: they decode
requests, call one method, and frame its answer.  Everything that takes time (delay delivery,
deliver-at timers, transaction check-back, offset snapshots) happens in :meth:`Broker.tick`,
which reads the injected clock, so the shells decide the threads and tests decide the time.

Metadata follows tenet 1: every change is a :class:`~evq.domain.metadata.MetaEvent` appended
to the log first and applied by :meth:`Broker.catch_up` from there, the same path a slave
replaying the replicated log takes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from evq import logs
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker_config import BrokerConfig
from evq.domain.clock import Clock
from evq.domain.codes import PUT_STATUS_CODES, BrokerError, ResponseCode
from evq.domain.delay import DelayLevels
from evq.domain.groups import SubscriptionGroupConfig, validate_group
from evq.domain.hashing import tags_code
from evq.domain.locks import RebalanceLockManager
from evq.domain.log import (
    AppendedRecords,
    AppendResult,
    AppendSummary,
    GetStatus,
    MessageLog,
    PutStatus,
)
from evq.domain.message import (
    MAX_PROPERTIES_BYTES,
    Host,
    Message,
    Prop,
    decode_properties,
    encode_properties,
    host_bytes,
    is_ipv6,
    waits_for_store,
)
from evq.domain.metadata import (
    OFFSETS_RECORD_BODY,
    Change,
    MetadataState,
    MetadataStore,
    MetadataWriteError,
    MetaEvent,
    OffsetKey,
    Table,
    Watermark,
    group_delete,
    group_put,
    offsets_snapshots,
    topic_delete,
    topic_put,
)
from evq.domain.record import (
    PutRecord,
    RecordError,
    TagsCodeFn,
    decode,
    encoded_record,
    put_record,
    read_fields,
)
from evq.domain.sent import (
    KeyedSend,
    SentEntry,
    body_too_large,
    cluster_property,
    plain_records,
    properties_too_long,
    sent_messages,
)

if TYPE_CHECKING:
    from evq.domain.filters import Subscription

log = logs.get_logger(__name__)

_META_READ_BATCH = 256


def tags_code_fn(levels: DelayLevels) -> TagsCodeFn:
    """The ConsumeQueue tags code the broker's log must use: the due time for scheduled and
    timed messages (so their services read due times from the queue), the tag hash otherwise."""

    def code(topic: str, props: Mapping[str, str], store_ts: int) -> int:
        try:
            if topic == tp.SCHEDULE_TOPIC:
                return store_ts + levels.delay_ms(max(1, int(props.get(Prop.DELAY, "1"))))
            if topic == tp.TIMER_TOPIC:
                return int(props[Prop.START_DELIVER_TIME])
        except (KeyError, ValueError):
            pass  # a hand-made record in a system topic: fall back to the tag hash
        return tags_code(props.get(Prop.TAGS))

    return code


@attrs.frozen(slots=True)
class SendResult:
    """What a send stored; ``code`` is the RocketMQ response code for ``status``.  The
    summaries come from the log's :class:`~evq.domain.log.AppendedRecords` when it returns
    one (no result object a record), else from the results one by one."""

    status: PutStatus
    topic: str
    queue_id: int
    appended: Sequence[AppendResult]

    @property
    def code(self) -> ResponseCode:
        return PUT_STATUS_CODES[self.status]

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def msg_id(self) -> str:
        """Offset msgIds of every stored message, comma-joined as RocketMQ answers a batch."""
        appended = self.appended
        if isinstance(appended, AppendedRecords):
            return appended.msg_ids()
        return ",".join([a.msg_id for a in appended])

    @property
    def queue_offset(self) -> int:
        return self.appended[0].queue_offset if self.appended else -1

    @property
    def end_offset(self) -> int:
        """The log offset a durability (or slave) wait must reach."""
        appended = self.appended
        if isinstance(appended, AppendedRecords):
            return appended.end_offset()
        return max([a.end_offset for a in appended], default=0)

    @property
    def size(self) -> int:
        """The bytes stored."""
        appended = self.appended
        if isinstance(appended, AppendedRecords):
            return appended.size()
        return sum([a.size for a in appended])

    def summary(self) -> AppendSummary:
        """What a send's answer reads of the results (see :data:`AppendSummary`)."""
        appended = self.appended
        if isinstance(appended, AppendedRecords):
            return appended.summary()
        if not appended:
            return -1, -1, 0, "", 0, 0
        first = appended[0]
        return (first.physical_offset, first.queue_offset, self.end_offset, self.msg_id,
                len(appended), self.size)


@attrs.frozen(slots=True)
class PullResult:
    """A pull answer: the response code and header fields RocketMQ sends, and raw records."""

    code: ResponseCode
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    records: list[memoryview] = attrs.field(factory=list)
    queue_offsets: list[int] = attrs.field(factory=list)

    def messages(self) -> list[Message]:
        return [decode(r, check_crc=False) for r in self.records]


@attrs.frozen(slots=True)
class QueueStat:
    """One row of consume stats (RocketMQ ``OffsetWrapper`` plus the lag it implies)."""

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - max(self.consumer_offset, 0))


def sent_result(topic: str, queue_id: int, results: Sequence[AppendResult]) -> SendResult:
    """A send's :class:`SendResult` from what the log's append returned: the first refusal
    among the records is the send's status."""
    if isinstance(results, AppendedRecords):
        return SendResult(results.status(), topic, queue_id, results)
    status = next((r.status for r in results if r.status is not PutStatus.PUT_OK),
                  PutStatus.PUT_OK)
    return SendResult(status, topic, queue_id, results)


class Broker:
    """One broker's logic.  Thread-safe: metadata and offsets change under one lock, the log
    serializes appends itself."""

    def __init__(
        self,
        message_log: MessageLog,
        metadata: MetadataStore,
        config: BrokerConfig | None = None,
        *,
        clock: Clock,
    ) -> None:
        self.config = config or BrokerConfig()
        self.log = message_log
        self.clock = clock
        self.delay_levels = DelayLevels.parse(self.config.message_delay_level)
        self._code = tags_code_fn(self.delay_levels)
        # The plain put path's CLUSTER entry; None turns that path off (see put_sent).
        self._cluster_entry = (None if is_ipv6(self.config.store_host)
                               else cluster_property(self.config.broker_cluster_name))
        self._store_host = host_bytes(self.config.store_host)
        self._meta = metadata
        self._lock = threading.RLock()
        self._state = MetadataState()
        self.metadata_version = 0
        """Counts the metadata events applied: what :meth:`plain_send_queues` answered holds
        while this stays the same."""
        self._watermark = Watermark()
        self._offsets: dict[OffsetKey, int] = {}
        self._dirty: set[OffsetKey] = set()
        self._pending_resets: dict[OffsetKey, int] = {}
        self._next_snapshot_ms = clock.now_ms() + self.config.offset_snapshot_interval_ms
        self._tick_hooks: list[Callable[[int], None]] = []
        self._closed = False
        self._loop_thread: int | None = None
        # Orderly consumers' queue locks live in memory, as in RocketMQ: after a restart the
        # consumers lock again within their 20 s renewal.
        self.locks = RebalanceLockManager(clock=clock,
                                          max_live_s=self.config.lock_max_live_ms / 1000)
        self._unsaved: list[Change] = []  # applied here, refused by the metadata store
        self._project()
        self._system_topics_missing = not self.config.is_slave and not self._create_system_topics()

    # --- metadata: events in, projection out -------------------------------------------------

    def _project(self) -> None:
        """Load the metadata store and apply the log beyond its watermark: start-up, and a
        rebuild from the log once the store was cleared (as a deleted database is)."""
        with self._lock:
            rows, watermark = self._meta.load()
            self._state = MetadataState.from_rows(rows)
            self._watermark = self._checked_watermark(watermark)
            self._offsets.clear()
            self._dirty.clear()
            self._pending_resets.clear()
            self._unsaved.clear()
            self.catch_up()
            self._offsets.update(self._state.offsets)

    def truncate_log(self, physical_offset: int) -> None:
        """Cut the log back to ``physical_offset``, as a replica drops a divergent tail, and
        the metadata with it.  Events do not run backwards, so a cut below the watermark
        clears the store and replays the remaining log: topics, groups and offsets the cut
        records made are forgotten, the master's replicated next are applied.  Offsets
        consumers committed here are dropped too (they may count messages that were cut);
        consumers commit theirs again within their persist interval.  Metadata events that
        expired from the log cannot be replayed: that case is logged."""
        with self._lock:
            self.log.truncate(physical_offset)
            if physical_offset >= self._watermark.physical_offset:
                return
            expired, _hi = self.log.bounds(tp.META_TOPIC, 0)
            log.warning("metadata_rebuilt_from_log", cut_to=physical_offset,
                        watermark=self._watermark.physical_offset,
                        expired_events=expired)
            self._meta.clear()
            self._project()

    def _checked_watermark(self, w: Watermark) -> Watermark:
        """A projection ahead of the log means the log lost its tail (power loss on an
        unflushed write): keep the richer projection, and apply new events from the log end."""
        _lo, hi = self.log.bounds(tp.META_TOPIC, 0)
        if w.queue_offset > hi:
            log.warning("metadata_ahead_of_log", watermark=w.queue_offset, log_end=hi)
            return Watermark(hi, self.log.max_physical_offset)
        return w

    def catch_up(self) -> int:
        """Apply metadata events the log holds beyond the watermark; returns how many."""
        applied = 0
        with self._lock:
            while True:
                w = self._watermark
                r = self.log.read(tp.META_TOPIC, 0, w.queue_offset, max_count=_META_READ_BATCH,
                                  max_bytes=4 * 1024 * 1024)
                if r.status is GetStatus.OFFSET_TOO_SMALL:  # events expired: the projection
                    self._watermark = Watermark(r.next_offset, w.physical_offset)  # holds them
                    continue
                if r.status is not GetStatus.FOUND:
                    return applied
                changes: list[Change] = []
                for view, qo in zip(r.records, r.queue_offsets, strict=True):
                    m = decode(view, check_crc=False)
                    try:
                        ev = MetaEvent.decode(m.tags, m.body)
                    except ValueError as exc:
                        log.error("bad_metadata_event", queue_offset=qo, error=str(exc))
                    else:
                        applied_changes = self._state.apply(ev)
                        self.metadata_version += 1
                        self._follow_offsets(applied_changes)
                        changes += applied_changes
                    w = Watermark(qo + 1, m.commit_log_offset + len(view))
                self._save(changes, w)
                self._watermark = w
                applied += len(r.records)

    def _save(self, changes: Sequence[Change], watermark: Watermark) -> None:
        """Commit ``changes`` to the metadata store, with any it refused before.  A refusal
        (its disk is full) costs nothing: the state here has them, the log holds their
        events, and the next commit that succeeds (a later event, or the tick) writes them
        all; the broker starts and serves meanwhile."""
        pending = [*self._unsaved, *changes]
        try:
            self._meta.commit(pending, watermark)
        except MetadataWriteError as exc:
            if not self._unsaved:
                log.warning("metadata_commit_deferred", error=str(exc))
            self._unsaved = pending
            return
        if self._unsaved:
            log.info("metadata_commit_resumed", changes=len(pending))
        self._unsaved = []

    def _follow_offsets(self, changes: Sequence[Change]) -> None:
        """Offsets applied from the log reach the live table unless a newer commit is pending
        here (a master applying its own snapshot must not move a consumer back).  On a slave
        a pending commit (made while the master was away) ends once the master's log carries
        the same offset or a later one: the master took it over."""
        for c in changes:
            if c.table is not Table.OFFSETS:
                continue
            key = (str(c.key[0]), str(c.key[1]), int(c.key[2]))
            if key in self._dirty:
                if not (self.config.is_slave and c.value is not None
                        and int(c.value) >= self._offsets.get(key, -1)):  # type: ignore[call-overload]
                    continue
                self._dirty.discard(key)
            if c.value is None:
                self._offsets.pop(key, None)
            else:
                self._offsets[key] = int(c.value)  # type: ignore[call-overload]

    def record_events(self, events: Sequence[MetaEvent], messages: Sequence[Message] = ()
                      ) -> list[AppendResult]:
        """Append ``messages`` then ``events`` in one batch, make them durable, and apply the
        events.  Services pass their progress here with the messages it covers, so a crash
        between the two redelivers at most that batch."""
        if self.config.is_slave:
            raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                              "a slave takes no writes; send to the master")
        if threading.get_ident() == self._loop_thread:
            log.error("metadata_write_on_event_loop", events=[e.kind.value for e in events],
                      stack_info=True)
        now = self.clock.now_ms()
        records = [self._record(m) for m in messages]
        records += [self._record(self._meta_message(ev, now)) for ev in events]
        results = self.log.append(records)
        failed = [r for r in results if r.status is not PutStatus.PUT_OK]
        if failed:
            raise BrokerError(PUT_STATUS_CODES[failed[0].status],
                              f"storing broker records failed: "
                              f"{self.refusal_remark(failed[0].status)}")
        if events:
            self.log.wait_durable(results[-1].end_offset, self.config.sync_flush_timeout_ms / 1000)
            self.log.make_readable(results[-1].end_offset)
            self.catch_up()
        return results

    def declare_event_loop_thread(self) -> None:
        """The calling thread runs an event loop, which must never wait on disk: a metadata
        write from it (it waits for durability and a SQL commit) is logged as an error naming
        the caller, so a path that misses :meth:`put_writes_metadata` shows in any test."""
        self._loop_thread = threading.get_ident()

    def _meta_message(self, ev: MetaEvent, now: int) -> Message:
        return Message(topic=tp.META_TOPIC, body=ev.body(),
                       properties={Prop.TAGS: ev.kind.value}, born_timestamp=now,
                       born_host=self.config.store_host, store_host=self.config.store_host)

    def _record(self, m: Message) -> PutRecord:
        m.store_host = self.config.store_host
        return put_record(m, tags_code_fn=self._tags_code)

    def _tags_code(self, topic: str, props: Mapping[str, str], _unstored: int) -> int:
        """A message being sent has no store time yet; the log stamps about now."""
        return self._code(topic, props, self.clock.now_ms())

    def _create_system_topics(self) -> bool:
        """Create the system topics the broker needs; False if the store refused them (a
        full disk at start-up: the broker starts all the same, serves reads, and the tick
        creates them once the disk takes writes)."""
        levels = self.delay_levels.max_level
        wanted = [
            tp.TopicConfig(topic_name=tp.SCHEDULE_TOPIC, read_queue_nums=levels,
                           write_queue_nums=levels),
            *(tp.TopicConfig(topic_name=name, read_queue_nums=1, write_queue_nums=1)
              for name in (tp.TRANS_HALF_TOPIC, tp.TRANS_OP_HALF_TOPIC, tp.SELF_TEST_TOPIC)),
        ]
        if self.config.auto_create_topic_enable:
            n = self.config.default_topic_queue_nums
            wanted.append(tp.TopicConfig(topic_name=tp.AUTO_CREATE_TOPIC, read_queue_nums=n,
                                         write_queue_nums=n, perm=tp.PERM_RW | tp.PERM_INHERIT))
        missing = [t for t in wanted if t.topic_name not in self._state.topics]
        if missing:
            try:
                self.record_events([topic_put(t) for t in missing])
            except BrokerError as exc:
                if exc.code is not ResponseCode.SERVICE_NOT_AVAILABLE:
                    raise
                log.warning("system_topics_deferred", topics=[t.topic_name for t in missing],
                            reason=exc.remark)
                return False
        return True

    def progress(self, service: str) -> object:
        """A service's last recorded progress (see :func:`evq.domain.metadata.progress`)."""
        with self._lock:
            return self._state.progress.get(service)

    # --- topics and groups ------------------------------------------------------------------

    def topic(self, name: str) -> tp.TopicConfig | None:
        with self._lock:
            return self._state.topics.get(name)

    def topics(self) -> dict[str, tp.TopicConfig]:
        with self._lock:
            return dict(self._state.topics)

    def create_topic(self, config: tp.TopicConfig) -> tp.TopicConfig:
        """Create or update a topic (RocketMQ's UPDATE_AND_CREATE_TOPIC)."""
        if config.topic_name in tp.NOT_ALLOWED_SEND or config.topic_name == tp.AUTO_CREATE_TOPIC:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"The topic[{config.topic_name}] is conflict with system topic.")
        self.record_events([topic_put(config)])
        return config

    def delete_topic(self, name: str) -> None:
        if self.topic(name) is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{name}] not exist")
        self.record_events([topic_delete(name)])

    def group(self, name: str) -> SubscriptionGroupConfig | None:
        with self._lock:
            return self._state.groups.get(name)

    def groups(self) -> dict[str, SubscriptionGroupConfig]:
        with self._lock:
            return dict(self._state.groups)

    def create_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        self.record_events([group_put(config)])
        return config

    def delete_group(self, name: str) -> None:
        if self.group(name) is None:
            raise BrokerError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                              f"subscription group[{name}] not exist")
        with self._lock:
            for key in [k for k in self._offsets if k[0] == name]:
                del self._offsets[key]
                self._dirty.discard(key)
        self.record_events([group_delete(name)])

    def ensure_group(self, name: str) -> SubscriptionGroupConfig:
        """The group's config, auto-created with defaults when the broker allows it."""
        found = self.group(name)
        if found is not None:
            return found
        if not self.config.auto_create_subscription_group:
            raise BrokerError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                              f"subscription group [{name}] does not exist")
        if self.config.is_slave:  # the master records it; until then serve with the defaults
            return SubscriptionGroupConfig(group_name=name)
        try:
            return self.create_group(SubscriptionGroupConfig(group_name=name))
        except BrokerError as exc:
            if exc.code is not ResponseCode.SERVICE_NOT_AVAILABLE:
                raise
            # The disk is full (the store said so once): reads go on with the defaults, and
            # a later request records the group once there is room.
            return SubscriptionGroupConfig(group_name=name)

    def ensure_topic(self, name: str, queues: int = 1, perm: int = tp.PERM_RW) -> tp.TopicConfig:
        """A broker-made topic (retry, DLQ): created on first use."""
        found = self.topic(name)
        if found is not None:
            return found
        config = tp.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues,
                                perm=perm)
        self.record_events([topic_put(config)])
        return config

    def put_writes_metadata(self, topic: str) -> bool:
        """Whether :meth:`put` to ``topic`` may create a topic or group first, and so wait on
        disk (a metadata record made durable, a SQL commit): the network shell runs such puts
        off its event loop.  Conservative: a retry topic counts while its group or its DLQ
        is missing, although only a message past its retries goes to the DLQ."""
        if self.topic(topic) is None:
            return True
        if topic.startswith(tp.RETRY_PREFIX):
            group = topic[len(tp.RETRY_PREFIX):]
            return self.group(group) is None or self.topic(tp.dlq_topic(group)) is None
        return False

    def pull_writes_metadata(self, group: str) -> bool:
        """Whether :meth:`pull` for ``group`` may create the group first (see
        :meth:`put_writes_metadata`)."""
        return self.group(group) is None and not self.config.is_slave

    def _topic_for_send(self, topic: str, default_topic: str, default_queue_nums: int
                        ) -> tp.TopicConfig:
        found = self.topic(topic)
        if found is not None:
            return found
        if topic.startswith(tp.RETRY_PREFIX):
            group = self.ensure_group(topic[len(tp.RETRY_PREFIX):])
            return self.ensure_topic(topic, max(1, group.retry_queue_nums))
        template = self.topic(default_topic) if self.config.auto_create_topic_enable else None
        if template is None or not template.perm & tp.PERM_INHERIT:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST,
                              f"topic[{topic}] not exist, apply first please!")
        n = max(1, min(default_queue_nums, template.write_queue_nums))
        log.info("topic_auto_created", topic=topic, queues=n, template=default_topic)
        return self.ensure_topic(topic, n, template.perm & ~tp.PERM_INHERIT)

    # --- sending ------------------------------------------------------------------------------

    def put(
        self,
        messages: Sequence[Message],
        *,
        default_topic: str = tp.AUTO_CREATE_TOPIC,
        default_topic_queue_nums: int = 4,
        max_reconsume_times: int | None = None,
    ) -> SendResult:
        """Store one message, or a batch (same topic and queue), as a send request does.

        Durability is not awaited: wait on :attr:`SendResult.end_offset` per the flush policy
        (:meth:`send` does).  Raises :class:`BrokerError` for refusals.
        """
        if not messages:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "nothing to send")
        first = messages[0]
        queue_id = self._send_queue(first.topic, first.queue_id, default_topic,
                                    default_topic_queue_nums)
        batch = len(messages) > 1
        retry = self._retry_limit(first.topic, max_reconsume_times)
        now = self.clock.now_ms()
        stored: list[Message] = []
        for m in messages:
            if m.topic != first.topic:
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                                  "every message of a batch must have the same topic")
            self._check_body_size(len(m.body))
            m.queue_id = queue_id
            props = m.properties
            if batch and ((Prop.DELAY in props and props[Prop.DELAY] not in ("", "0"))
                          or (Prop.TRAN_MSG in props and _is_half(m))):
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                                  "a batch may not hold delayed or transactional messages")
            stored.append(self._route(m, retry, now))
        return self._appended(stored[0].topic, stored[0].queue_id,
                              self._sent_records(stored, now))

    def _send_queue(self, topic: str, queue_id: int, default_topic: str,
                    default_topic_queue_nums: int) -> int:
        """The checks every send passes before its messages are looked at (the broker takes
        writes, the topic may be sent to, exists or is created, is writable), and the queue
        it goes to: ``queue_id``, or a random one when that is negative."""
        self._check_writable()
        tp.check_send_allowed(topic)
        config = self._topic_for_send(topic, default_topic, default_topic_queue_nums)
        if not config.writable:
            raise BrokerError(ResponseCode.NO_PERMISSION,
                              f"the topic[{topic}] sending message is forbidden")
        if queue_id < 0:
            # random() scaled: a third of randrange's cost, and any bias is far below 2**-40
            queue_id = int(random.random() * max(1, config.write_queue_nums))
        if queue_id >= config.queue_count:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"request queueId[{queue_id}] is illegal, {config} "
                              f"Producer: {self.config.store_host}")
        return queue_id

    def _sent_records(self, stored: Sequence[Message], now: int) -> list[PutRecord]:
        """The records of routed sent messages, each properties string joined once: measured
        against the limit (what is stored is what counts, routing's additions included),
        then encoded."""
        host, code = self.config.store_host, self._code
        records = []
        for m in stored:
            m.store_host = host
            text = encode_properties(m.properties)
            _check_properties_size(text)
            records.append(encoded_record(m, text, code(m.topic, m.properties, now)))
        return records

    def put_sent(
        self,
        topic: str,
        entries: Sequence[SentEntry] | KeyedSend,
        *,
        queue_id: int,
        born_timestamp: int,
        born_host: Host,
        reconsume_times: int = 0,
        default_topic: str = tp.AUTO_CREATE_TOPIC,
        default_topic_queue_nums: int = 4,
        max_reconsume_times: int | None = None,
    ) -> tuple[SendResult, bool]:
        """A send request's messages as sent (header values are the protocol's, Java ints
        and longs), stored as :meth:`put` stores them, and whether the producer waits for the
        store (``WAIT``, read before routing drops it).

        The plain path (:func:`~evq.domain.sent.plain_records`) takes the send when no
        message needs routing; else the Message path does, on the queue already chosen.  Not
        for a retry topic (its messages may go to the DLQ), an IPv6 host or a cluster name
        the properties string cannot carry.
        """
        if not entries:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "nothing to send")
        queue_id = self._send_queue(topic, queue_id, default_topic, default_topic_queue_nums)
        cluster_entry = self._cluster_entry
        if not (cluster_entry is None or topic.startswith(tp.RETRY_PREFIX)
                or is_ipv6(born_host)):
            plain = plain_records(entries, topic, queue_id, born_timestamp,
                                  host_bytes(born_host), self._store_host, reconsume_times,
                                  cluster_entry, self.config.max_message_size)
            if plain is not None:
                records, wait = plain
                return self._appended(topic, queue_id, records), wait
        messages = sent_messages(topic, entries, queue_id=queue_id,
                                 born_timestamp=born_timestamp, born_host=born_host,
                                 reconsume_times=reconsume_times)
        wait = any([waits_for_store(m.properties) for m in messages])
        return self.put(messages, default_topic=default_topic,
                        default_topic_queue_nums=default_topic_queue_nums,
                        max_reconsume_times=max_reconsume_times), wait

    def _appended(self, topic: str, queue_id: int, records: list[PutRecord]) -> SendResult:
        """Append a send's records; the first refusal among them is the send's status."""
        return sent_result(topic, queue_id, self.log.append(records))

    def plain_send_queues(self, topic: str) -> int:
        """How many queues a send to ``topic`` may name when it is a plain put (see
        :func:`~evq.domain.sent.plain_records`): the broker takes writes, the topic may be sent
        to, exists, is writable and is no retry topic (:meth:`put_sent`'s checks, passed);
        0 when a send to it must take those checks.  The answer holds while
        :attr:`metadata_version` does (the config never changes): the network broker's send
        lane keeps it that long."""
        if self._cluster_entry is None or topic.startswith(tp.RETRY_PREFIX):
            return 0
        try:
            self._check_writable()
            tp.check_send_allowed(topic)
        except BrokerError:
            return 0
        config = self.topic(topic)
        return config.queue_count if config is not None and config.writable else 0

    def plain_send_terms(self) -> tuple[bytes, str, int] | None:
        """What :func:`~evq.domain.sent.plain_records` takes of this broker for any send:
        the store host as stored, the CLUSTER property entry and the largest body; None when
        the plain path is off (an IPv6 store host)."""
        if self._cluster_entry is None:
            return None
        return self._store_host, self._cluster_entry, self.config.max_message_size

    def send(self, messages: Message | Sequence[Message], **kwargs: object) -> SendResult:
        """:meth:`put` and wait for durability per the log's flush policy (embedded use)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        return self.durable(self.put(batch, **kwargs))  # type: ignore[arg-type]

    def durable(self, result: SendResult) -> SendResult:
        """``result`` once the log is durable to its end per the flush policy, or marked
        FLUSH_DISK_TIMEOUT (embedded use: the network broker waits without blocking)."""
        if result.ok and not self.log.wait_durable(
            result.end_offset, self.config.sync_flush_timeout_ms / 1000
        ):
            return attrs.evolve(result, status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    def refusal_remark(self, status: PutStatus) -> str:
        """The remark a put the store refused is answered with.  A full disk says so, with its
        ratio and path, where RocketMQ names the disk ratios."""
        refused = self.log.disk_status.refused if status is PutStatus.SERVICE_NOT_AVAILABLE else ""
        if refused:
            return f"service not available now: {refused}"
        return f"store put failed: {status.value}"

    def _check_writable(self) -> None:
        if self.config.is_slave:
            raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                              "the broker is a slave and takes no sends; send to the master")
        if not self.config.broker_permission & tp.PERM_WRITE:
            raise BrokerError(ResponseCode.NO_PERMISSION,
                              f"the broker[{self.config.broker_name}] sending message is forbidden")

    def _check_body_size(self, size: int) -> None:
        if size > self.config.max_message_size:
            raise body_too_large(size, self.config.max_message_size)

    def route(self, m: Message, max_reconsume_times: int | None = None) -> Message:
        """Where a sent message is really stored: retry overflow goes to the DLQ, half
        messages to the half topic, deliver-at and delayed messages to their services."""
        return self._route(m, self._retry_limit(m.topic, max_reconsume_times),
                           self.clock.now_ms())

    def _retry_limit(self, topic: str, max_reconsume_times: int | None
                     ) -> tuple[str, int] | None:
        """For a retry topic: its group (created if need be) and the reconsume count from
        which a message goes to the group's DLQ.  Worked out once a put, not per message."""
        if not topic.startswith(tp.RETRY_PREFIX):
            return None
        group = self.ensure_group(topic[len(tp.RETRY_PREFIX):])
        limit = group.retry_max_times if max_reconsume_times is None else max_reconsume_times
        return group.group_name, limit

    def _route(self, m: Message, retry: tuple[str, int] | None, now: int) -> Message:
        """:meth:`route` given the topic's retry limit and the time.  Each property is
        looked at only when the message has it: most have none of them."""
        props = m.properties
        props.pop(Prop.WAIT, None)
        props[Prop.CLUSTER] = self.config.broker_cluster_name
        if retry is not None and m.reconsume_times >= retry[1]:
            return self.to_dlq(m, retry[0])
        if Prop.TRAN_MSG in props and _is_half(m):
            if self.config.reject_transaction_message:
                raise BrokerError(ResponseCode.NO_PERMISSION,
                                  f"the broker[{self.config.broker_name}] sending transaction "
                                  "message is forbidden")
            return self._redirect(m, tp.TRANS_HALF_TOPIC, 0,
                                  sysflag=m.sysflag & ~sf.TRANSACTION_MASK)
        if Prop.START_DELIVER_TIME in props:
            if _int_prop(props, Prop.START_DELIVER_TIME) > now:
                return self._redirect(m, tp.TIMER_TOPIC, 0)
            del props[Prop.START_DELIVER_TIME]
        if Prop.DELAY in props:
            level = _int_prop(props, Prop.DELAY)
            if level > 0 and m.sysflag & sf.TRANSACTION_MASK in (
                sf.TRANSACTION_NOT_TYPE, sf.TRANSACTION_COMMIT_TYPE
            ):
                return self.delayed(m, level)
        return m

    def delayed(self, m: Message, level: int) -> Message:
        """``m`` parked in SCHEDULE_TOPIC_XXXX until its delay level has passed."""
        level = self.delay_levels.clamp(level)
        m.properties[Prop.DELAY] = str(level)
        return self._redirect(m, tp.SCHEDULE_TOPIC, self.delay_levels.queue_of(level))

    def to_dlq(self, m: Message, group: str) -> Message:
        topic = tp.dlq_topic(group)
        self.ensure_topic(topic, 1)
        log.info("message_dead_lettered", group=group, reconsume_times=m.reconsume_times)
        m.properties.pop(Prop.DELAY, None)
        m.topic, m.queue_id = topic, 0
        return m

    @staticmethod
    def _redirect(m: Message, topic: str, queue_id: int, sysflag: int | None = None) -> Message:
        m.properties[Prop.REAL_TOPIC] = m.topic
        m.properties[Prop.REAL_QID] = str(m.queue_id)
        m.topic, m.queue_id = topic, queue_id
        if sysflag is not None:
            m.sysflag = sysflag
        return m

    def store(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append broker-made messages as they are (services re-putting due messages)."""
        return self.log.append([self._record(m) for m in messages])

    # --- pulling ------------------------------------------------------------------------------

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_count: int = 32,
        subscription: Subscription | None = None,
        commit_offset: int | None = None,
    ) -> PullResult:
        """One pull as PullMessageProcessor answers it: pre-checks, commit-on-pull, the store
        read with tag-hash filtering, the exact filter, and the response code and next offset
        the clients act on."""
        group_config = self.ensure_group(group)
        if not self.config.broker_permission & tp.PERM_READ:
            raise BrokerError(ResponseCode.NO_PERMISSION,
                              f"the broker[{self.config.broker_name}] pulling message is forbidden")
        if not group_config.consume_enable:
            raise BrokerError(ResponseCode.NO_PERMISSION,
                              f"subscription group no permission, {group}")
        config = self.topic(topic)
        if config is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST,
                              f"topic[{topic}] not exist, apply first please!")
        if not config.readable:
            raise BrokerError(ResponseCode.NO_PERMISSION,
                              f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < config.read_queue_nums:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                              f"topicConfig.readQueueNums:[{config.read_queue_nums}]")
        if commit_offset is not None and not self.config.is_slave:
            self.commit_offset(group, topic, queue_id, commit_offset)
        key = (group, topic, queue_id)
        with self._lock:
            reset = self._pending_resets.get(key)
            if reset is not None and reset != offset:
                lo, hi = self.log.bounds(topic, queue_id)
                return PullResult(ResponseCode.PULL_OFFSET_MOVED, GetStatus.OFFSET_TOO_SMALL,
                                  reset, lo, hi, 0)
            self._pending_resets.pop(key, None)
        tag_filter = subscription.tag_filter if subscription is not None else None
        r = self.log.read(topic, queue_id, offset, max_count=max_count, tag_filter=tag_filter)
        records, qos, status = r.records, r.queue_offsets, r.status
        if records and subscription is not None and subscription.needs_exact_check:
            kept = [(v, q) for v, q in zip(records, qos, strict=True)
                    if _exact_match(subscription, v)]
            records, qos = [v for v, _ in kept], [q for _, q in kept]
            if not records:
                status = GetStatus.NO_MATCHED_MESSAGE
        code, next_offset = self._pull_code(status, offset, r.next_offset)
        suggest = self._suggest_broker(group_config, r.last_physical_offset)
        if self.config.is_slave and not self.config.slave_read_enable:
            code, suggest, records, qos = ResponseCode.PULL_RETRY_IMMEDIATELY, 0, [], []
            next_offset = offset
        return PullResult(code, status, next_offset, r.min_offset, r.max_offset, suggest,
                          records, qos)

    def _pull_code(self, status: GetStatus, offset: int, next_offset: int
                   ) -> tuple[ResponseCode, int]:
        """Response code and nextBeginOffset; a slave does not correct offsets (RocketMQ's
        ``offsetCheckInSlave`` off)."""
        if status is GetStatus.FOUND:
            return ResponseCode.SUCCESS, next_offset
        if status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
            return ResponseCode.PULL_RETRY_IMMEDIATELY, next_offset
        if status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.OFFSET_FOUND_NULL) or (
            status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)
            and offset == 0
        ):
            return ResponseCode.PULL_NOT_FOUND, next_offset
        if self.config.is_slave:
            return ResponseCode.PULL_NOT_FOUND, offset
        return ResponseCode.PULL_OFFSET_MOVED, next_offset

    def _suggest_broker(self, group: SubscriptionGroupConfig, last_physical: int) -> int:
        """Seed 000: read from a slave when the pull is further behind the log head than the
        share of memory the page cache is expected to hold."""
        if not self.config.slave_read_enable:
            return 0
        behind = self.log.max_physical_offset - last_physical if last_physical >= 0 else 0
        in_memory = (self.config.total_memory_bytes
                     * self.config.access_message_in_memory_max_ratio // 100)
        return group.which_broker_when_consume_slowly if behind > in_memory else group.broker_id

    # --- consumer offsets -----------------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Raises BrokerError for a group name RocketMQ would refuse: every commit becomes part
        of a snapshot record, and one oversized name must not make a snapshot unstorable."""
        validate_group(group)
        key = (group, topic, queue_id)
        with self._lock:
            if self._offsets.get(key) != offset:
                self._offsets[key] = offset
                self._dirty.add(key)

    def take_newer_offsets(self, entries: Mapping[OffsetKey, int]) -> int:
        """A master taking the commits a slave kept while the master was down: each one
        counts where it is ahead of this broker's own; returns how many did."""
        taken = 0
        for group, _topic, _qid in entries:
            validate_group(group)
        with self._lock:
            for key, offset in entries.items():
                if offset > self._offsets.get(key, -1):
                    self._offsets[key] = offset
                    self._dirty.add(key)
                    taken += 1
        return taken

    def local_commits(self) -> dict[OffsetKey, int]:
        """On a slave: the offsets consumers committed here that its master's log does not
        carry yet (see :meth:`_follow_offsets`)."""
        with self._lock:
            return {k: self._offsets[k] for k in self._dirty if k in self._offsets}

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for this queue."""
        with self._lock:
            return self._offsets.get((group, topic, queue_id), -1)

    def offsets(self, group: str | None = None) -> dict[OffsetKey, int]:
        with self._lock:
            return {k: v for k, v in self._offsets.items() if group is None or k[0] == group}

    def snapshot_offsets(self) -> int:
        """Record changed offsets as metadata events (as many records as their size needs);
        returns how many.  A change is forgotten only once its record is durable, and only if
        no newer commit came meanwhile: a failed snapshot (full disk, flush timeout) leaves
        every change to the next.  A slave records nothing and keeps its commits pending
        until its master's log carries them."""
        if self.config.is_slave:
            return 0
        with self._lock:
            self._dirty.intersection_update(self._offsets)
            entries = [(k, self._offsets[k]) for k in sorted(self._dirty)]
        if entries:
            # Half a record for the JSON leaves the header and properties ample room.
            budget = min(OFFSETS_RECORD_BODY, self.log.max_record_size // 2)
            self.record_events(offsets_snapshots(entries, budget))
        with self._lock:
            for key, offset in entries:
                if self._offsets.get(key) == offset:
                    self._dirty.discard(key)
        return len(entries)

    def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int, *,
                             force: bool = True) -> dict[int, int]:
        """Seed 002: per queue, the first offset stored at or after ``timestamp_ms``.

        Without ``force`` a queue only moves back.  The new offsets are committed and snapshot
        at once, and the next pull of the group on each queue at another offset is answered
        PULL_OFFSET_MOVED to the new one, so push and pull consumers alike take it even when
        nobody tells them (the open question at the end of seed 002).
        """
        config = self.topic(topic)
        if config is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        self.ensure_group(group)
        moved: dict[int, int] = {}
        with self._lock:
            for qid in range(config.read_queue_nums):
                target = self.log.offset_for_time(topic, qid, timestamp_ms)
                current = self._offsets.get((group, topic, qid), -1)
                if force or current < 0 or target < current:
                    key = (group, topic, qid)
                    self._offsets[key] = target
                    self._dirty.add(key)
                    self._pending_resets[key] = target
                    moved[qid] = target
        self.snapshot_offsets()
        log.info("offsets_reset", group=group, topic=topic, timestamp=timestamp_ms, queues=moved)
        return moved

    def consume_stats(self, group: str, topic: str | None = None,
                      subscribed: Iterable[str] = ()) -> list[QueueStat]:
        """Lag on every readable queue of every topic the group has offsets in or (for its
        online members) ``subscribed`` to, or of the one topic named: a queue the group never
        committed on counts from offset 0, as RocketMQ's GET_CONSUME_STATS does, so its
        messages are in the lag total rather than left out."""
        with self._lock:
            committed = {k: v for k, v in self._offsets.items() if k[0] == group}
        names = {t for _g, t, _q in committed} | set(subscribed)
        if topic is not None:
            names = {topic}
        stats = []
        for t in sorted(names):
            config = self.topic(t)
            queues = (range(config.read_queue_nums) if config is not None
                      else sorted(q for _g, ct, q in committed if ct == t))
            for q in queues:
                off = max(committed.get((group, t, q), 0), 0)
                _lo, hi = self.log.bounds(t, q)
                last = self.log.store_time_at(t, q, off - 1) if off > 0 else -1
                stats.append(QueueStat(t, q, hi, off, max(last, 0)))
        return stats

    # --- queries ------------------------------------------------------------------------------

    def view_by_offset(self, physical_offset: int) -> Message:
        view = self.log.lookup(physical_offset)
        if view is None:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"no message at commit log offset {physical_offset}")
        return decode(view)

    def query_by_key(self, topic: str, key: str, max_count: int = 32, begin_ms: int = 0,
                     end_ms: int = 2**63 - 1) -> list[Message]:
        r = self.log.query_keys(topic, key, max_count, begin_ms, end_ms)
        return [decode(v) for v in r.records]

    # --- background duties --------------------------------------------------------------------

    def add_tick_hook(self, hook: Callable[[int], None]) -> None:
        """Services (delay, timers, transaction checks) run from :meth:`tick`."""
        self._tick_hooks.append(hook)

    def tick(self) -> None:
        """Run whatever is due at the clock's current time; the shells call this often
        (every 100 ms or so), tests after advancing a ManualClock."""
        if self.config.is_slave:
            self.catch_up()
            return
        if self._unsaved:
            with self._lock:
                self._save([], self._watermark)
        if not self.log.disk_status.writable:
            return  # nothing due could be stored: services and offsets wait for room
        if self._system_topics_missing:
            self._system_topics_missing = not self._create_system_topics()
        now = self.clock.now_ms()
        for hook in self._tick_hooks:
            hook(now)
        if now >= self._next_snapshot_ms:
            self._next_snapshot_ms = now + self.config.offset_snapshot_interval_ms
            self.snapshot_offsets()

    def close(self) -> None:
        """Snapshot offsets and close the metadata store (the shell closes the log);
        closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if not self.config.is_slave:
            try:
                self.snapshot_offsets()
            except BrokerError as exc:  # a full disk: consumers commit them again
                log.warning("offsets_not_snapshot_at_close", reason=exc.remark)
        self._meta.close()


def _check_properties_size(text: str) -> None:
    """What is stored is what counts: routing's additions (CLUSTER, REAL_TOPIC, ...) too."""
    # A code point is at most 4 UTF-8 bytes: short texts need no encoding to be measured.
    if len(text) * 4 > MAX_PROPERTIES_BYTES and len(text.encode()) > MAX_PROPERTIES_BYTES:
        raise properties_too_long()


def _is_half(m: Message) -> bool:
    return m.properties.get(Prop.TRAN_MSG, "").lower() == "true"


def _int_prop(props: Mapping[str, str], name: str) -> int:
    try:
        return int(props.get(name) or 0)
    except ValueError:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                          f"property {name}={props.get(name)!r} is not an integer") from None


def _exact_match(subscription: Subscription, view: memoryview) -> bool:
    try:
        props = decode_properties(read_fields(view, 0, check_crc=False).properties)
    except RecordError:
        return False
    return subscription.matches(props.get(Prop.TAGS), props)
