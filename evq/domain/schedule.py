"""Delayed delivery: RocketMQ's delay levels, and deliver-at timers (which RocketMQ 4.x lacks).

Both services park messages in a system topic and re-put them to their real topic when due.
Their progress is a metadata event appended *in the same log batch* as the messages it covers,
so after a crash a service resumes exactly where the log says it was: nothing is lost and at
most the one batch that was being written is delivered twice.

* Delay levels: SCHEDULE_TOPIC_XXXX queue ``level - 1``; within a queue, due times grow with
  store times, so each level is a FIFO and progress is one queue offset per level.
* Timers: EVQ_SYS_TIMER queue 0 holds messages with any ``__STARTDELIVERTIME``; due times are
  in no order, so pending entries live in a heap and progress is the lowest undelivered queue
  offset plus the delivered offsets above it.
"""

from __future__ import annotations

import heapq

from evq import logs
from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.log import GetStatus, ReadResult
from evq.domain.message import Message, Prop, decode_properties
from evq.domain.metadata import progress
from evq.domain.record import RecordError, decode, read_fields

log = logs.get_logger(__name__)

_BATCH = 32
DELAY_PROGRESS = "delay"
TIMER_PROGRESS = "timer"


def released(m: Message, *drop: str) -> Message | None:
    """The message as its real topic gets it: topic and queue from REAL_TOPIC / REAL_QID (left
    in the properties, as RocketMQ leaves them), ``drop`` properties removed; None when the
    record does not say where it belongs."""
    props = dict(m.properties)
    try:
        topic, queue_id = props[Prop.REAL_TOPIC], int(props[Prop.REAL_QID])
    except (KeyError, ValueError):
        log.error("scheduled_message_without_real_topic", offset=m.commit_log_offset)
        return None
    for name in drop:
        props.pop(name, None)
    return Message(
        topic=topic, body=m.body, flag=m.flag, properties=props, queue_id=queue_id,
        sysflag=m.sysflag, born_timestamp=m.born_timestamp, born_host=m.born_host,
        reconsume_times=m.reconsume_times,
        prepared_transaction_offset=m.prepared_transaction_offset,
    )


def _read(broker: Broker, topic: str, queue_id: int, offset: int) -> tuple[ReadResult, int]:
    """A read that skips past expired entries; returns the result and the offset it read."""
    while True:
        r = broker.log.read(topic, queue_id, offset, max_count=_BATCH)
        if r.status is not GetStatus.OFFSET_TOO_SMALL:
            return r, offset
        offset = r.next_offset


class DelayService:
    """Delivers SCHEDULE_TOPIC_XXXX messages when their level's delay has passed."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        stored = broker.progress(DELAY_PROGRESS)
        self._offsets: dict[int, int] = (
            {int(k): int(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
        )
        self._next_run_ms = 0
        broker.add_tick_hook(self.run)

    def run(self, now: int) -> int:
        """Deliver everything due; returns how many messages were re-put."""
        if now < self._next_run_ms:
            return 0
        self._next_run_ms = now + self._broker.config.delay_poll_interval_ms
        levels = self._broker.delay_levels
        return sum(self._deliver(level, now) for level in range(1, levels.max_level + 1))

    def _deliver(self, level: int, now: int) -> int:
        delay = self._broker.delay_levels.delay_ms(level)
        queue_id = self._broker.delay_levels.queue_of(level)
        delivered = 0
        while True:
            r, offset = _read(self._broker, tp.SCHEDULE_TOPIC, queue_id,
                              self._offsets.get(level, 0))
            if r.status is not GetStatus.FOUND:
                return delivered
            due: list[Message] = []
            for view, qo in zip(r.records, r.queue_offsets, strict=True):
                m = decode(view, check_crc=False)
                if m.store_timestamp + delay > now:
                    break
                offset = qo + 1
                out = released(m, Prop.DELAY)
                if out is not None:
                    due.append(out)
            if offset == self._offsets.get(level, 0):
                return delivered
            moved = {**self._offsets, level: offset}
            # Progress moves once the delivery is stored: a refused one (a full disk) raises
            # and the same messages are due again at the next run.
            self._broker.record_events(
                [progress(DELAY_PROGRESS, {str(k): v for k, v in sorted(moved.items())})], due)
            self._offsets[level] = offset
            delivered += len(due)

    def backlog(self) -> dict[int, int]:
        """Messages waiting per level (RocketMQ's delay offset table, as a lag)."""
        out = {}
        for level in range(1, self._broker.delay_levels.max_level + 1):
            _lo, hi = self._broker.log.bounds(tp.SCHEDULE_TOPIC, level - 1)
            out[level] = max(0, hi - self._offsets.get(level, 0))
        return out


class TimerService:
    """Delivers EVQ_SYS_TIMER messages at their ``__STARTDELIVERTIME``."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        stored = broker.progress(TIMER_PROGRESS)
        state = stored if isinstance(stored, dict) else {}
        self._low = int(state.get("low", 0))
        self._done: set[int] = {int(x) for x in state.get("done", [])}
        self._scanned = self._low
        self._heap: list[tuple[int, int, int]] = []  # (deliver at, queue offset, log offset)
        broker.add_tick_hook(self.run)

    def run(self, now: int) -> int:
        self._scan()
        delivered = 0
        while self._heap and self._heap[0][0] <= now:
            batch = []
            while self._heap and self._heap[0][0] <= now and len(batch) < _BATCH:
                batch.append(heapq.heappop(self._heap))
            due: list[Message] = []
            for _at, _qo, phys in batch:
                view = self._broker.log.lookup(phys)
                out = released(decode(view, check_crc=False), Prop.START_DELIVER_TIME) \
                    if view is not None else None
                if out is not None:
                    due.append(out)
            low = min((qo for _at, qo, _p in self._heap), default=self._scanned)
            done = {qo for qo in self._done | {qo for _at, qo, _p in batch} if qo >= low}
            try:
                self._broker.record_events(
                    [progress(TIMER_PROGRESS, {"low": low, "done": sorted(done)})], due)
            except BaseException:  # not stored (a full disk): due again at the next run
                for entry in batch:
                    heapq.heappush(self._heap, entry)
                raise
            self._low, self._done = low, done
            delivered += len(due)
        return delivered

    def _scan(self) -> None:
        """Load timer entries appended since the last scan into the heap."""
        while True:
            r, offset = _read(self._broker, tp.TIMER_TOPIC, 0, self._scanned)
            if r.status is not GetStatus.FOUND:
                return
            for view, qo in zip(r.records, r.queue_offsets, strict=True):
                self._scanned = qo + 1
                if qo in self._done:
                    continue
                try:
                    f = read_fields(view, 0, check_crc=False)
                    at = int(decode_properties(f.properties)[Prop.START_DELIVER_TIME])
                except (RecordError, KeyError, ValueError):
                    log.error("timer_entry_unreadable", queue_offset=qo)
                    continue
                heapq.heappush(self._heap, (at, qo, f.physical_offset))
            if offset == self._scanned:
                return

    @property
    def pending(self) -> int:
        self._scan()
        return len(self._heap)
