"""The SQL projection: whatever events are applied, the database reloads the same state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import evq
from evq.backends.config import StoreConfig
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.metadata import (
    MemoryMetadataStore,
    MetadataState,
    MetadataStore,
    MetaEvent,
    Watermark,
    group_delete,
    group_put,
    offsets_snapshot,
    progress,
    topic_delete,
    topic_put,
)
from evq.domain.topics import TopicConfig
from evq.meta.sql import SqlMetadataStore

names = st.sampled_from(["A", "B", "%RETRY%g", "t_1", "x-y"])
groups = st.sampled_from(["g1", "g2", "CID_RMQ_SYS_TRANS"])
topic_configs = st.builds(
    TopicConfig, topic_name=names, read_queue_nums=st.integers(0, 1024),
    write_queue_nums=st.integers(0, 1024), perm=st.integers(0, 15), order=st.booleans(),
)
group_configs = st.builds(
    SubscriptionGroupConfig, group_name=groups, retry_max_times=st.integers(-1, 32),
    broker_id=st.integers(0, 3), consume_enable=st.booleans(),
)
events = st.one_of(
    topic_configs.map(topic_put),
    names.map(topic_delete),
    group_configs.map(group_put),
    groups.map(group_delete),
    st.lists(st.tuples(st.tuples(groups, names, st.integers(0, 15)), st.integers(0, 2**62)),
             max_size=5).map(offsets_snapshot),
    st.tuples(st.sampled_from(["delay", "timer"]),
              st.dictionaries(st.text(max_size=3), st.integers(0, 2**40), max_size=3))
    .map(lambda p: progress(*p)),
)


def replay(store: MetadataStore, evs: list[MetaEvent], batch: int) -> MetadataState:
    state = MetadataState()
    for start in range(0, len(evs), batch):
        changes = [c for ev in evs[start:start + batch] for c in state.apply(ev)]
        store.commit(changes, Watermark(start + batch, start * 100))
    return state


@given(evs=st.lists(events, max_size=30), batch=st.integers(1, 5))
def test_sql_store_reloads_exactly_the_applied_state(evs: list[MetaEvent], batch: int) -> None:
    store = SqlMetadataStore("sqlite://")
    state = replay(store, evs, batch)
    rows, watermark = store.load()
    assert MetadataState.from_rows(rows) == state
    if evs:
        assert watermark.queue_offset >= len(evs)
    store.close()


@given(evs=st.lists(events, max_size=30))
def test_sql_and_reference_stores_agree(evs: list[MetaEvent]) -> None:
    sql, ref = SqlMetadataStore("sqlite://"), MemoryMetadataStore()
    replay(sql, evs, 3)
    replay(ref, evs, 3)
    (sql_rows, sql_w), (ref_rows, ref_w) = sql.load(), ref.load()
    assert MetadataState.from_rows(sql_rows) == MetadataState.from_rows(ref_rows)
    assert sql_w == ref_w
    sql.close()


def test_events_round_trip_through_their_record_form() -> None:
    ev = topic_put(TopicConfig(topic_name="A", read_queue_nums=3, write_queue_nums=2))
    assert MetaEvent.decode(ev.kind.value, ev.body()) == ev
    for tag, body in (("nope", b"{}"), ("offsets", b"not json"), ("offsets", b"[1]")):
        with pytest.raises(ValueError):
            MetaEvent.decode(tag, body)


def test_database_file_keeps_rows_and_watermark_across_engines(tmp_path: Path) -> None:
    store = SqlMetadataStore.in_dir(tmp_path)
    state = MetadataState()
    changes = state.apply(topic_put(TopicConfig(topic_name="A")))
    store.commit(changes, Watermark(1, 120))
    store.close()
    again = SqlMetadataStore.in_dir(tmp_path)
    rows, watermark = again.load()
    assert MetadataState.from_rows(rows) == state and watermark == Watermark(1, 120)
    again.close()


def test_changes_the_database_refused_reach_it_with_the_next_commit_that_succeeds(
    tmp_path: Path,
) -> None:
    """The metadata database is a projection of the log: a commit it refuses (a full disk;
    here another connection holds it locked) costs the broker nothing, and the changes reach
    the database once it takes writes again."""
    db = tmp_path / "meta.sqlite"
    with evq.Broker.open(tmp_path / "data", metadata=f"sqlite:///{db}?timeout=0.05",
                         store_config=StoreConfig(commitlog_segment_size=1 << 20),
                         background=False) as b:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        b.create_topic("Deferred", 2)  # recorded in the log; the database refuses the commit
        assert b.core.topic("Deferred") is not None
        blocker.execute("ROLLBACK")
        blocker.close()
        b.tick()
    store = SqlMetadataStore(f"sqlite:///{db}")
    rows, _watermark = store.load()
    store.close()
    assert "Deferred" in MetadataState.from_rows(rows).topics
