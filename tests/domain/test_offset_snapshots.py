"""Offset snapshots: any number of changed offsets is stored, in records the log takes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.broker import Broker
from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.groups import MAX_GROUP_LENGTH
from evq.domain.metadata import EventKind, offsets_snapshots
from tests.domain.conftest import OpenBroker, close, topic

entries = st.lists(
    st.tuples(st.tuples(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=130),
                        st.integers(0, 2**31 - 1)),
              st.integers(-1, 2**63 - 1)),
    max_size=200)


@given(entries, st.integers(64, 4096))
def test_snapshot_events_keep_every_entry_in_order_and_under_the_budget(
        offsets: list[tuple[tuple[str, str, int], int]], budget: int) -> None:
    events = offsets_snapshots(offsets, budget)
    decoded = [((g, t, q), o) for ev in events for g, t, q, o in json.loads(ev.body())["offsets"]]
    assert decoded == offsets
    for ev in events:
        assert ev.kind is EventKind.OFFSETS
        assert len(ev.body()) <= budget or len(ev.data["offsets"]) == 1  # type: ignore[arg-type]


def test_sixteen_thousand_long_named_offsets_survive_a_restart(
        open_broker: OpenBroker, clock: ManualClock) -> None:
    """Once one 4 MiB-limited record: refused, and every commit of the interval was lost."""
    b = open_broker()
    topic(b, "T", queues=16)
    expected = {}
    for i in range(1000):
        group = f"{i:04d}".ljust(MAX_GROUP_LENGTH, "g")
        for q in range(16):
            b.commit_offset(group, "T", q, q + i)
            expected[(group, "T", q)] = q + i
    clock.advance(b.config.offset_snapshot_interval_ms / 1000)
    b.tick()
    assert b.local_commits() == {}  # every change written, so none is pending
    close(b)
    reopened = open_broker()
    assert reopened.offsets() == expected


def test_a_change_made_while_its_snapshot_is_written_stays_pending(open_broker: OpenBroker
                                                                   ) -> None:
    b = open_broker()
    topic(b)
    b.commit_offset("g", "T", 0, 3)
    assert b.snapshot_offsets() == 1
    b.commit_offset("g", "T", 0, 4)
    assert b.local_commits() == {("g", "T", 0): 4}
    assert b.snapshot_offsets() == 1
    assert b.snapshot_offsets() == 0


@pytest.mark.parametrize("group", ["", "g" * (MAX_GROUP_LENGTH + 1), "g\n", "g h",
                                   "x" * (5 * 1024 * 1024)])
def test_commits_of_illegal_group_names_are_refused(broker: Broker, group: str) -> None:
    topic(broker)
    with pytest.raises(BrokerError) as e:
        broker.commit_offset(group, "T", 0, 1)
    assert e.value.code is ResponseCode.SYSTEM_ERROR
    assert len(e.value.remark) < 300
    with pytest.raises(BrokerError):
        broker.take_newer_offsets({(group, "T", 0): 1})
    assert broker.offsets() == {}
    close(broker)
