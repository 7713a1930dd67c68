"""Consumer and producer group tables (evq.domain.membership; doc §5.7, seeds 001 and 003)."""

from __future__ import annotations

from collections import Counter

import pytest
import structlog
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evq.domain.clock import ManualClock
from evq.domain.membership import (
    CHANNEL_EXPIRY_MS,
    ConsumerData,
    GroupMembership,
    Heartbeat,
    MembershipError,
)


@pytest.fixture
def tables(clock: ManualClock) -> GroupMembership:
    return GroupMembership(clock=clock)


def consumer(
    group: str = "g", topics: tuple[str, ...] = ("orders",), **subs: object
) -> ConsumerData:
    subscriptions = {t: subs.get(t, "*") for t in topics}
    return ConsumerData(group, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                        subscriptions)


def beat(client_id: str, *consumers: ConsumerData, producers: tuple[str, ...] = ()) -> Heartbeat:
    return Heartbeat(client_id, consumers, producers)


# --- consumers --------------------------------------------------------------------------------


def test_a_new_member_changes_its_group(tables: GroupMembership, clock: ManualClock) -> None:
    assert tables.heartbeat("conn1", beat("c1", consumer())) == {"g"}
    info = tables.consumer_group("g")
    assert info is not None
    assert (info.consume_type, info.message_model) == ("CONSUME_PASSIVELY", "CLUSTERING")
    assert [(m.connection, m.client_id, m.last_seen_ms) for m in info.members] == [
        ("conn1", "c1", clock.now_ms())
    ]
    assert tables.client_ids("g") == ["c1"]


def test_a_repeated_heartbeat_only_refreshes(tables: GroupMembership, clock: ManualClock) -> None:
    tables.heartbeat("conn1", beat("c1", consumer()))
    clock.advance(30)
    assert tables.heartbeat("conn1", beat("c1", consumer())) == frozenset()
    info = tables.consumer_group("g")
    assert info is not None and info.members[0].last_seen_ms == clock.now_ms()


def test_subscribed_topics_gained_or_lost_are_changes(tables: GroupMembership) -> None:
    tables.heartbeat("conn1", beat("c1", consumer(topics=("a",))))
    assert tables.heartbeat("conn1", beat("c1", consumer(topics=("a", "b")))) == {"g"}
    assert tables.heartbeat("conn1", beat("c1", consumer(topics=("b",)))) == {"g"}
    assert tables.heartbeat("conn1", beat("c1", consumer(topics=("b",), b="tagA"))) == set()
    assert tables.subscription("g", "b") == "tagA"
    assert tables.subscription("g", "a") is None
    assert tables.subscription("other", "b") is None


def test_one_heartbeat_registers_every_group_it_names(tables: GroupMembership) -> None:
    changed = tables.heartbeat("conn1", beat("c1", consumer("g1"), consumer("g2")))
    assert changed == {"g1", "g2"}
    assert tables.client_ids("g1") == tables.client_ids("g2") == ["c1"]


def test_a_connection_that_changes_its_client_id_changes_the_group(
    tables: GroupMembership,
) -> None:
    tables.heartbeat("conn1", beat("c1", consumer()))
    assert tables.heartbeat("conn1", beat("c1-renamed", consumer())) == {"g"}
    assert tables.client_ids("g") == ["c1-renamed"]


def test_unregister_drops_the_connection_from_the_named_group(tables: GroupMembership) -> None:
    tables.heartbeat("conn1", beat("c1", consumer()))
    tables.heartbeat("conn2", beat("c2", consumer()))
    assert tables.unregister("conn1", consumer_group="g") == {"g"}
    assert tables.client_ids("g") == ["c2"]
    assert tables.unregister("conn1", consumer_group="g") == frozenset()
    assert tables.unregister("conn2", consumer_group="g") == {"g"}
    assert tables.consumer_group("g") is None
    assert tables.client_ids("g") == []


def test_closing_a_connection_leaves_every_group(tables: GroupMembership) -> None:
    tables.heartbeat("conn1", beat("c1", consumer("g1"), consumer("g2"), producers=("p",)))
    tables.heartbeat("conn2", beat("c2", consumer("g2")))
    assert tables.connection_closed("conn1") == {"g1", "g2"}
    assert tables.client_ids("g2") == ["c2"]
    assert tables.producer_connection("p") is None
    assert tables.connection_closed("conn1") == frozenset()


def test_empty_client_id_is_refused(tables: GroupMembership) -> None:
    with pytest.raises(MembershipError, match="client id"):
        tables.heartbeat("conn1", beat("", consumer()))


# --- duplicate client ids (seed 003) ----------------------------------------------------------


def test_two_connections_with_one_id_are_both_listed(tables: GroupMembership) -> None:
    with structlog.testing.capture_logs() as logs:
        assert tables.heartbeat("conn1", beat("10.0.0.1@A", consumer())) == {"g"}
        assert tables.heartbeat("conn2", beat("10.0.0.1@A", consumer())) == {"g"}
        tables.heartbeat("conn3", beat("10.0.0.2@B", consumer()))
    assert tables.client_ids("g") == ["10.0.0.1@A", "10.0.0.1@A", "10.0.0.2@B"]
    assert tables.duplicate_ids("g") == {"10.0.0.1@A": 2}
    warnings = [e for e in logs if e["event"] == "consumer_client_id_duplicated"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert (warnings[0]["group"], warnings[0]["client_id"]) == ("g", "10.0.0.1@A")


def test_the_duplicate_warning_is_logged_once_while_it_lasts(tables: GroupMembership) -> None:
    def warnings_for(*steps: tuple[str, str]) -> int:
        with structlog.testing.capture_logs() as logs:
            for conn, action in steps:
                if action == "join":
                    tables.heartbeat(conn, beat("dup", consumer()))
                else:
                    tables.connection_closed(conn)
        return sum(e["event"] == "consumer_client_id_duplicated" for e in logs)

    assert warnings_for(("c1", "join"), ("c2", "join"), ("c1", "join"), ("c3", "join")) == 1
    assert warnings_for(("c3", "close")) == 0
    assert tables.duplicate_ids("g") == {"dup": 2}
    assert warnings_for(("c2", "close")) == 0
    assert tables.duplicate_ids("g") == {}
    assert warnings_for(("c2", "join")) == 1


# --- expiry -----------------------------------------------------------------------------------


def test_silent_connections_expire_after_120_seconds(
    tables: GroupMembership, clock: ManualClock
) -> None:
    assert CHANNEL_EXPIRY_MS == 120_000
    tables.heartbeat("conn1", beat("c1", consumer(), producers=("p",)))
    tables.heartbeat("conn2", beat("c2", consumer()))
    clock.advance(60)
    tables.heartbeat("conn2", beat("c2", consumer()))
    clock.advance(60)
    expired = tables.scan_expired()
    assert (expired.connections, expired.groups) == (frozenset(), frozenset())
    clock.advance(0.001)
    expired = tables.scan_expired()
    assert (expired.connections, expired.groups) == ({"conn1"}, {"g"})
    assert tables.client_ids("g") == ["c2"]
    assert tables.producer_connection("p") is None


def test_a_connection_live_in_another_group_is_not_closed(
    tables: GroupMembership, clock: ManualClock
) -> None:
    tables.heartbeat("conn1", beat("c1", consumer("old"), consumer("kept")))
    clock.advance(100)
    tables.heartbeat("conn1", beat("c1", consumer("kept")))
    clock.advance(21)
    expired = tables.scan_expired()
    assert (expired.connections, expired.groups) == (frozenset(), {"old"})
    assert tables.consumer_group("old") is None
    assert tables.client_ids("kept") == ["c1"]


# --- producers --------------------------------------------------------------------------------


def test_producer_check_back_rotates_over_live_connections(
    tables: GroupMembership, clock: ManualClock
) -> None:
    for n in range(3):
        tables.heartbeat(f"conn{n}", beat(f"p{n}", producers=("pg",)))
    picks = [tables.producer_connection("pg") for _ in range(6)]
    assert Counter(picks) == {"conn0": 2, "conn1": 2, "conn2": 2}
    assert picks[:3] != [picks[0]] * 3
    clock.advance(100)
    tables.heartbeat("conn1", beat("p1", producers=("pg",)))
    clock.advance(21)  # conn0 and conn2 are past expiry but not yet scanned
    assert {tables.producer_connection("pg") for _ in range(4)} == {"conn1"}
    assert tables.producer_connection("unknown") is None


def test_unregister_a_producer(tables: GroupMembership) -> None:
    tables.heartbeat("conn1", beat("p1", consumer(), producers=("pg",)))
    assert tables.unregister("conn1", producer_group="pg") == frozenset()
    assert tables.producer_connection("pg") is None
    assert tables.client_ids("g") == ["p1"]


# --- the tables against a model ---------------------------------------------------------------

CONNECTIONS = ["k1", "k2", "k3", "k4"]
GROUPS = ["g1", "g2"]


class MembershipModel(RuleBasedStateMachine):
    """Heartbeats, unregisters, closes and expiry against a per-connection dictionary model;
    every call must report exactly the groups whose id list or topic set it changed."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.tables = GroupMembership(clock=self.clock)
        self.members: dict[str, dict[str, tuple[str, int]]] = {g: {} for g in GROUPS}
        self.topics: dict[str, frozenset[str]] = {}

    def snapshot(self) -> dict[str, tuple[frozenset[tuple[str, str]], frozenset[str]]]:
        """Per group: which connection holds which id, and the subscribed topics."""
        return {
            g: (frozenset((c, cid) for c, (cid, _) in m.items()), self.topics.get(g, frozenset()))
            for g, m in self.members.items()
        }

    def changed_since(self, before: dict) -> set[str]:
        return {g for g, state in self.snapshot().items() if state != before[g]}

    def forget_empty(self, group: str) -> None:
        if not self.members[group]:
            self.topics.pop(group, None)

    @rule(
        conn=st.sampled_from(CONNECTIONS),
        cid=st.sampled_from(["a", "b", "c"]),
        groups=st.sets(st.sampled_from(GROUPS), min_size=1),
        topics=st.sets(st.sampled_from(["t1", "t2"]), max_size=2),
    )
    def heartbeat(self, conn: str, cid: str, groups: set[str], topics: set[str]) -> None:
        before = self.snapshot()
        now = self.clock.now_ms()
        for g in groups:
            self.members[g][conn] = (cid, now)
            self.topics[g] = frozenset(topics)
        data = [consumer(g, tuple(sorted(topics))) for g in sorted(groups)]
        assert self.tables.heartbeat(conn, beat(cid, *data)) == self.changed_since(before)

    @rule(conn=st.sampled_from(CONNECTIONS), group=st.sampled_from(GROUPS))
    def unregister(self, conn: str, group: str) -> None:
        before = self.snapshot()
        self.members[group].pop(conn, None)
        self.forget_empty(group)
        assert self.tables.unregister(conn, consumer_group=group) == self.changed_since(before)

    @rule(conn=st.sampled_from(CONNECTIONS))
    def close(self, conn: str) -> None:
        before = self.snapshot()
        for g in GROUPS:
            self.members[g].pop(conn, None)
            self.forget_empty(g)
        assert self.tables.connection_closed(conn) == self.changed_since(before)

    @rule(seconds=st.sampled_from([10, 30, 60, 119.999, 120.001]))
    def scan(self, seconds: float) -> None:
        self.clock.advance(seconds)
        before = self.snapshot()
        deadline = self.clock.now_ms() - CHANNEL_EXPIRY_MS
        stale = set()
        for g in GROUPS:
            for conn, (_, seen) in list(self.members[g].items()):
                if seen < deadline:
                    stale.add(conn)
                    del self.members[g][conn]
            self.forget_empty(g)
        live = {c for m in self.members.values() for c in m}
        expired = self.tables.scan_expired()
        assert expired.groups == self.changed_since(before)
        assert expired.connections == stale - live

    @invariant()
    def id_lists_agree(self) -> None:
        for g in GROUPS:
            ids = [cid for cid, _ in self.members[g].values()]
            assert Counter(self.tables.client_ids(g)) == Counter(ids)
            assert self.tables.duplicate_ids(g) == {c: n for c, n in Counter(ids).items() if n > 1}


TestMembershipModel = MembershipModel.TestCase
