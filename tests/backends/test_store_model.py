"""The store against the reference model in :mod:`tests.model`, driven by Hypothesis.

Random batches over a few topics and queues, with bodies big enough to roll 8 KiB segments now
and then (and, rarely, too big to store at all), interleaved with pulls, key queries, lookups,
time searches, clock moves (backwards too), expiry, truncation and restarts.  After every step
the bounds, queues and log offsets must agree with the model; every answer is compared in full,
records byte for byte against the model's message re-encoded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from evq.domain import sysflag as sf
from evq.domain.clock import ManualClock
from evq.domain.hashing import tags_code
from evq.domain.log import MessageLog, PutStatus
from evq.domain.message import Message, Prop
from evq.domain.record import encode, offset_msg_id, put_record
from tests.model import LogModel, ModelRecord

SEG = 8192
HOST = ("127.0.0.1", 10911)
KEEP_HOURS = 1
TOPICS = ["A", "B", "C"]
TAGS = ["a", "b", "c"]
KEYS = ["k1", "k2", "k3"]

OpenLog = Callable[..., MessageLog]


@st.composite
def messages(draw: st.DrawFn) -> Message:
    props: dict[str, str] = {}
    tag = draw(st.sampled_from([None, *TAGS]))
    if tag:
        props[Prop.TAGS] = tag
    words = draw(st.lists(st.sampled_from(KEYS), max_size=2))
    if words:
        props[Prop.KEYS] = " ".join(words)
    uniq = draw(st.sampled_from([None, None, "u1", "u2"]))
    if uniq:
        props[Prop.UNIQ_KEY] = uniq
    size = draw(st.one_of(st.integers(0, 300), st.integers(300, 3000), st.just(SEG)))
    kind = draw(st.sampled_from([0, 0, 0, 0, sf.TRANSACTION_COMMIT_TYPE,
                                 sf.TRANSACTION_PREPARED_TYPE, sf.TRANSACTION_ROLLBACK_TYPE]))
    return Message(
        topic=draw(st.sampled_from(TOPICS)),
        body=bytes([draw(st.integers(0, 255))]) * size,
        properties=props,
        queue_id=draw(st.integers(0, 2)),
        sysflag=kind,
        born_host=draw(st.sampled_from([("10.0.0.1", 4000), ("2001:db8::7", 4001)])),
        born_timestamp=draw(st.integers(0, 2**41)),
    )


def index_keys(m: Message) -> tuple[str, ...]:
    """RocketMQ indexes UNIQ_KEY and each KEYS word, for every record but rollbacks."""
    if m.sysflag & sf.TRANSACTION_MASK == sf.TRANSACTION_ROLLBACK_TYPE:
        return ()
    uniq = m.properties.get(Prop.UNIQ_KEY)
    words = [w for w in m.properties.get(Prop.KEYS, "").split(" ") if w]
    return ((uniq,) if uniq else ()) + tuple(words)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, open_log: OpenLog, root: Path):
        super().__init__()
        self.clock = ManualClock()
        self.root = root
        self.open_log = open_log
        self.model = LogModel(SEG, HOST)
        self.positions: list[int] = []  # every offset a record ever started at
        self.log = self._open()
        self.replica: MessageLog | None = None  # follows self.log as an HA slave would
        self.replica_cut: int | None = None  # lowest truncation since the replica last synced

    def _open(self, root: Path | None = None) -> MessageLog:
        return self.open_log(root or self.root, self.clock, commitlog_segment_size=SEG,
                             file_reserved_hours=KEEP_HOURS, store_host=HOST)

    def teardown(self) -> None:
        self.log.close()
        if self.replica is not None:
            self.replica.close()

    # --- comparisons -----------------------------------------------------------------------

    def check_record(self, view: memoryview | None, want: ModelRecord) -> None:
        assert view is not None, want.phys
        assert bytes(view) == bytes(encode(want.message)), want.phys

    # --- rules -----------------------------------------------------------------------------

    @initialize(batch=st.lists(messages(), min_size=1, max_size=4))
    def first_batch(self, batch: list[Message]) -> None:
        self.append_batch(batch)

    @rule(batch=st.lists(messages(), min_size=1, max_size=8))
    def append_batch(self, batch: list[Message]) -> None:
        limit = SEG - 8
        now = self.model.batch_time(self.clock.now_ms())
        results = self.log.append([put_record(m) for m in batch])
        assert len(results) == len(batch)
        for m, r in zip(batch, results, strict=True):
            size = len(encode(m))
            if size > limit:
                assert r.status is PutStatus.MESSAGE_ILLEGAL
                continue
            want = self.model.append(m, size, index_keys(m), tags_code(m.tags), now)
            assert r.status is PutStatus.PUT_OK
            assert (r.physical_offset, r.size, r.queue_offset, r.store_timestamp) == (
                want.phys, want.size, want.message.queue_offset, want.message.store_timestamp)
            assert r.msg_id == offset_msg_id(HOST, want.phys)
            self.positions.append(want.phys)

    @rule(data=st.data(), topic=st.sampled_from(TOPICS), queue_id=st.integers(0, 3),
          max_count=st.sampled_from([1, 2, 5, 32]),
          max_bytes=st.sampled_from([1, 500, 4000, 256 * 1024]),
          tags=st.sampled_from([None, ("a",), ("b", "c"), ("zz",)]))
    def read(self, data: st.DataObject, topic: str, queue_id: int, max_count: int,
             max_bytes: int, tags: tuple[str, ...] | None) -> None:
        lo, hi = self.model.bounds(topic, queue_id)
        offset = data.draw(st.one_of(st.integers(0, hi + 2), st.sampled_from([lo, hi])))
        codes = {tags_code(t) for t in tags} if tags is not None else None
        tag_filter = (lambda c: c in codes) if codes is not None else None
        got = self.log.read(topic, queue_id, offset, max_count, max_bytes, tag_filter)
        want = self.model.read(topic, queue_id, offset, max_count, max_bytes, tag_filter)
        assert (got.status, got.next_offset, got.min_offset, got.max_offset) == (
            want.status, want.next_offset, want.min_offset, want.max_offset)
        assert got.queue_offsets == [r.message.queue_offset for r in want.records]
        assert len(got.records) == len(want.records)
        for view, r in zip(got.records, want.records, strict=True):
            self.check_record(view, r)

    @precondition(lambda self: self.model.records)
    @rule(data=st.data(), topic=st.sampled_from(TOPICS),
          key=st.sampled_from([*KEYS, "u1", "u2", "nope"]), max_count=st.integers(1, 6))
    def query_key(self, data: st.DataObject, topic: str, key: str, max_count: int) -> None:
        stamps = sorted({r.message.store_timestamp for r in self.model.records})
        near = st.sampled_from(stamps).flatmap(lambda t: st.sampled_from([t - 1, t, t + 1]))
        begin = data.draw(st.one_of(st.just(0), near))
        end = data.draw(st.one_of(st.just(2**62), near))
        got = self.log.query_keys(topic, key, max_count, begin, end)
        want = self.model.query_keys(topic, key, max_count, begin, end)
        assert got.physical_offsets == [r.phys for r in want]
        for view, r in zip(got.records, want, strict=True):
            self.check_record(view, r)

    @precondition(lambda self: self.positions)
    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        """At record starts (live, expired or truncated away) and just beside them."""
        phys = data.draw(st.sampled_from(self.positions)) + data.draw(
            st.sampled_from([0, 0, 0, 1, -1]))
        got = self.log.lookup(phys)
        want = self.model.lookup(phys)
        if want is None:
            assert got is None, phys
        else:
            self.check_record(got, want)

    @precondition(lambda self: self.model.records)
    @rule(data=st.data(), topic=st.sampled_from(TOPICS), queue_id=st.integers(0, 2))
    def offset_for_time(self, data: st.DataObject, topic: str, queue_id: int) -> None:
        lo, hi = self.model.bounds(topic, queue_id)
        if hi == 0:
            return
        stamps = [r.message.store_timestamp for r in self.model.records]
        ts = data.draw(st.sampled_from(stamps).flatmap(
            lambda t: st.sampled_from([t - 1, t, t + 1])) | st.sampled_from([0, 2**62]))
        assert self.log.offset_for_time(topic, queue_id, ts) == self.model.offset_for_time(
            topic, queue_id, ts)
        offset = data.draw(st.integers(max(lo - 1, 0), hi))
        assert self.log.store_time_at(topic, queue_id, offset) == self.model.store_time_at(
            topic, queue_id, offset)

    @rule(seconds=st.sampled_from([0.001, 0.4, 1.5, 60, 1800, 3600, -5, -7200]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(force=st.booleans())
    def expire(self, force: bool) -> None:
        now = self.clock.now_ms()
        report = self.log.expire(force=force)
        count = self.model.expire(now, KEEP_HOURS * 3600 * 1000, force)
        assert report.deleted_segments == count
        assert report.min_physical_offset == self.model.min_phys

    @precondition(lambda self: any(self.model.live(r) for r in self.model.records))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """As a replica dropping a divergent tail: cut at a record boundary (the start of a
        record, or the end of one, where BLANK padding may follow)."""
        live = [r for r in self.model.records if self.model.live(r)]
        r = data.draw(st.sampled_from(live[-6:]))
        cut = r.phys + data.draw(st.sampled_from([0, r.size]))
        self.log.truncate(cut)
        self.model.truncate(cut)
        self.replica_cut = cut if self.replica_cut is None else min(self.replica_cut, cut)

    @precondition(lambda self: self.model.records)
    @rule(chunk=st.sampled_from([7, 1000, 3000, SEG]))
    def sync_replica(self, chunk: int) -> None:
        """Bring the replica up to the log's end through read_log, in chunks that split
        records; it drops a tail the log no longer has first.  It never expires anything, so
        it answers like the model with nothing expired."""
        if self.replica is None:
            self.replica = self._open(self.root.with_name(self.root.name + "-replica"))
        b = self.replica
        if self.replica_cut is not None and self.replica_cut < b.max_physical_offset:
            b.truncate(self.replica_cut)
        self.replica_cut = None
        if b.max_physical_offset < self.log.min_physical_offset:
            return  # expiry outran the replica: it can never catch up (nor can RocketMQ's)
        while data := self.log.read_log(b.max_physical_offset, chunk):
            b.append_replicated(b.max_physical_offset, data)
        assert b.max_physical_offset == self.model.end
        view = attrs.evolve(self.model, min_phys=b.min_physical_offset)
        for topic in TOPICS:
            for q in range(3):
                assert b.bounds(topic, q) == view.bounds(topic, q)
                lo = view.bounds(topic, q)[0]
                got = b.read(topic, q, lo, 64, 1 << 30)
                want = view.read(topic, q, lo, 64, 1 << 30)
                assert (got.status, got.next_offset) == (want.status, want.next_offset)
                for v, r in zip(got.records, want.records, strict=True):
                    self.check_record(v, r)
            for key in [*KEYS, "u1", "u2"]:
                hits = b.query_keys(topic, key, 100, 0, 2**62).physical_offsets
                assert hits == [r.phys for r in view.query_keys(topic, key, 100, 0, 2**62)]
        pos = self.log.min_physical_offset
        while pos < self.model.end:
            mine = self.log.read_log(pos, 1 << 20)
            assert b.read_log(pos, 1 << 20) == mine
            pos += len(mine)

    @precondition(lambda self: self.model.records)
    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = self._open()
        self.model.restarted()

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def offsets_agree(self) -> None:
        assert self.log.max_physical_offset == self.model.end
        assert self.log.min_physical_offset == self.model.min_phys
        want = {k: len(v) for k, v in self.model.queues.items() if v}
        assert {k: v for k, v in self.log.queues().items() if v} == want
        for topic in TOPICS:
            for q in range(4):
                assert self.log.bounds(topic, q) == self.model.bounds(topic, q), (topic, q)


def test_store_matches_the_model(open_log: OpenLog, tmp_path: Path) -> None:
    runs = itertools.count()
    run_state_machine_as_test(
        lambda: StoreMachine(open_log, tmp_path / f"run{next(runs)}"),
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


def test_model_predicts_a_segment_roll() -> None:
    """The model's own arithmetic, pinned: 8 spare bytes fit, 7 roll."""
    model = LogModel(4096, HOST)
    m = Message(topic="T")
    a = model.append(m, 4096 - 8, (), 0, 1)
    b = model.append(m, 100, (), 0, 1)
    c = model.append(m, 4096 - 100 - 7, (), 0, 1)
    assert (a.phys, b.phys, c.phys) == (0, 4096, 8192)
    assert model.end == 8192 + 4096 - 107
    assert attrs.evolve(c.message, commit_log_offset=0).queue_offset == 2
