"""A small, obviously-correct reference model of a MessageLog, for stateful tests.

It predicts everything the port lets a caller observe from the records appended and the clock:
physical offsets (records never span segments; a record must leave at least 8 bytes of its
segment for the BLANK header, else the log moves to the next segment), dense queue offsets,
store times (the clock, never going backwards), what a pull returns, what a key query returns,
and which segments expiry deletes.  Everything lives in plain lists and dicts; nothing is
indexed, cached or clever.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from evq.domain import sysflag as sf
from evq.domain.log import GetStatus
from evq.domain.message import Message

BLANK_HEADER = 8
SCAN_LIMIT = 800  # RocketMQ scans max(16000, maxMsgNums * 20) ConsumeQueue bytes per pull


@attrs.define
class ModelRecord:
    phys: int
    size: int
    message: Message  # as stored: broker fields filled in
    index_keys: tuple[str, ...]
    tags_code: int

    @property
    def consumable(self) -> bool:
        return sf.has_consume_queue_entry(self.message.sysflag)


@attrs.frozen
class ModelRead:
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[ModelRecord] = attrs.field(factory=list)


@attrs.define
class LogModel:
    segment_size: int
    store_host: tuple[str, int]
    records: list[ModelRecord] = attrs.field(factory=list)  # every record, by phys
    queues: dict[tuple[str, int], list[ModelRecord]] = attrs.field(factory=dict)
    min_phys: int = 0
    end: int = 0
    last_store_ts: int = 0

    # --- writing ---------------------------------------------------------------------------

    def batch_time(self, now: int) -> int:
        """The store time of a batch appended at clock time ``now``: never earlier than the
        previous batch's, even when that one stored nothing."""
        self.last_store_ts = max(self.last_store_ts, now)
        return self.last_store_ts

    def restarted(self) -> None:
        """A reopened log remembers store times only through the records it still holds
        (expiry may have deleted every one)."""
        live = [r for r in self.records if r.phys >= self.min_phys]
        self.last_store_ts = live[-1].message.store_timestamp if live else 0

    def append(
        self, message: Message, size: int, index_keys: tuple[str, ...], tags_code: int, now: int
    ) -> ModelRecord:
        seg = self.segment_size
        used = self.end % seg
        if used + size + BLANK_HEADER > seg:  # does not fit: pad and start the next segment
            self.end += seg - used
        phys = self.end
        self.end += size
        self.last_store_ts = max(self.last_store_ts, now)
        key = (message.topic, message.queue_id)
        consumable = sf.has_consume_queue_entry(message.sysflag)
        queue = self.queues.setdefault(key, []) if consumable else []
        stored = attrs.evolve(
            message,
            queue_offset=len(queue) if consumable else 0,
            commit_log_offset=phys,
            store_timestamp=self.last_store_ts,
            store_host=self.store_host,
        )
        r = ModelRecord(phys, size, stored, index_keys, tags_code)
        self.records.append(r)
        if consumable:
            queue.append(r)
        return r

    def segments(self) -> list[int]:
        """Start offsets of the segments holding live records (the last one always)."""
        seg = self.segment_size
        first = self.min_phys // seg
        last = max(self.end - 1, self.min_phys) // seg
        return [i * seg for i in range(first, last + 1)]

    def expire(self, now: int, keep_ms: int, force: bool) -> int:
        """Delete whole leading segments: a segment goes when the first record of the segment
        after it (newer than anything in it) is older than the retention; ``force`` takes one
        more.  The last segment always stays.  Returns how many went."""
        segs = self.segments()
        count = 0
        for nxt in segs[1:]:
            first = self.first_record_at_or_after(nxt)
            if first is None or first.message.store_timestamp + keep_ms > now:
                break
            count += 1
        if force and count < len(segs) - 1:
            count += 1
        if count:
            self.min_phys = segs[count]
        return count

    def truncate(self, cut: int) -> None:
        """Forget every record at or past ``cut`` (a record boundary); the log ends there."""
        self.records = [r for r in self.records if r.phys < cut]
        self.queues = {k: [r for r in q if r.phys < cut] for k, q in self.queues.items()}
        self.end = min(self.end, cut)

    def first_record_at_or_after(self, phys: int) -> ModelRecord | None:
        return next((r for r in self.records if r.phys >= phys), None)

    # --- reading ---------------------------------------------------------------------------

    def live(self, r: ModelRecord) -> bool:
        return r.phys >= self.min_phys

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        queue = self.queues.get((topic, queue_id), [])
        lo = next((i for i, r in enumerate(queue) if self.live(r)), len(queue))
        return lo, len(queue)

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_filter: Callable[[int], bool] | None = None,
    ) -> ModelRead:
        queue = self.queues.get((topic, queue_id), [])
        lo, hi = self.bounds(topic, queue_id)
        if hi == 0:
            return ModelRead(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset < lo:
            return ModelRead(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return ModelRead(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return ModelRead(GetStatus.OFFSET_OVERFLOW_BADLY, 0 if lo == 0 else hi, lo, hi)
        found: list[ModelRecord] = []
        total = 0
        qo = offset
        while qo < hi and qo - offset < max(SCAN_LIMIT, max_count):
            r = queue[qo]
            if len(found) >= max_count or (found and total + r.size > max_bytes):
                break
            qo += 1
            if tag_filter is not None and not tag_filter(r.tags_code):
                continue
            found.append(r)
            total += r.size
        status = GetStatus.FOUND if found else GetStatus.NO_MATCHED_MESSAGE
        return ModelRead(status, qo, lo, hi, found)

    def lookup(self, phys: int) -> ModelRecord | None:
        return next((r for r in self.records if r.phys == phys and self.live(r)), None)

    def query_keys(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[ModelRecord]:
        hits = [
            r for r in reversed(self.records)
            if self.live(r) and r.message.topic == topic and key in r.index_keys
            and begin_ms <= r.message.store_timestamp <= end_ms
        ]
        return hits[:max_count]

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        queue = self.queues.get((topic, queue_id), [])
        lo, hi = self.bounds(topic, queue_id)
        return next(
            (i for i in range(lo, hi) if queue[i].message.store_timestamp >= timestamp_ms), hi
        )

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        queue = self.queues.get((topic, queue_id), [])
        lo, hi = self.bounds(topic, queue_id)
        return queue[offset].message.store_timestamp if lo <= offset < hi else -1
