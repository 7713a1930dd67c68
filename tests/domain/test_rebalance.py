"""Queue allocation strategies (evq.domain.rebalance; seed 001 rebalance, seed 003)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from evq.domain.queues import MessageQueue
from evq.domain.rebalance import (
    STRATEGIES,
    AllocateStrategy,
    AllocationError,
    Averagely,
    AveragelyByCircle,
    ByConfig,
    ByMachineRoom,
    ConsistentHash,
    DuplicateClientIds,
    MachineRoomNearby,
    RoomPrefix,
    UnknownStrategy,
    allocate,
    broker_room,
    check_allocation,
    java_order,
    strategy_named,
)
from tests.strategies import client_id_lists, queue_lists

GOLDEN = Path(__file__).parent / "data" / "rocketmq_allocations.json"
"""Allocations computed by RocketMQ 4.9.7's own strategy classes (client and common modules at
tag rocketmq-all-4.9.7, on OpenJDK 17, ``-Dfile.encoding=UTF-8``): every distinct id of each
case's id list allocated from ``Collections.sort``-ed copies of the case's inputs; Nearby with a
resolver taking the text before the first ``@`` of broker names and client ids."""


def queues_of(rows: list[list[Any]]) -> list[MessageQueue]:
    return [MessageQueue(t, b, i) for t, b, i in rows]


def topic_queues(n: int, broker: str = "broker-a", topic: str = "TopicTest") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def whole_group(strategy: AllocateStrategy, queues: list[MessageQueue], ids: list[str]) -> dict:
    return {cid: allocate(strategy, "g", cid, queues, ids) for cid in ids}


# --- the Java client's results ----------------------------------------------------------------


def golden_cases() -> list[dict[str, Any]]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def golden_id(case: dict[str, Any]) -> str:
    return f"{case['strategy']}-{len(case['queues'])}q-{len(case['ids'])}ids"


@pytest.mark.parametrize("case", golden_cases(), ids=golden_id)
def test_allocations_match_the_java_client(case: dict[str, Any]) -> None:
    strategy = strategy_named(case["strategy"], **case["options"])
    assert strategy.name == case["java_name"]
    assert sorted(case["ids"], key=java_order) == case["sorted_ids"]
    report = check_allocation(strategy, "g", queues_of(case["queues"]), case["ids"])
    expected = {cid: tuple(queues_of(rows)) for cid, rows in case["result"].items()}
    assert dict(report.assignments) == expected


def test_golden_cases_cover_every_computing_strategy() -> None:
    """CONFIG computes nothing: Java's hands each process its own list, evq's looks the list
    up in a table of them (tested below)."""
    covered = {case["strategy"].partition("-")[0] for case in golden_cases()}
    assert covered == set(STRATEGIES) - {"CONFIG"}


# --- Java ordering ----------------------------------------------------------------------------


def utf16_units(s: str) -> list[int]:
    return list(array("H", s.encode("utf-16-le", "surrogatepass")))


@given(st.text(), st.text())
def test_java_order_compares_utf16_code_units(a: str, b: str) -> None:
    assert (java_order(a) < java_order(b)) == (utf16_units(a) < utf16_units(b))


def test_java_order_differs_from_python_above_the_bmp() -> None:
    emoji, fullwidth_a = "\U0001f600", "\uff21"
    assert emoji > fullwidth_a
    assert java_order(emoji) < java_order(fullwidth_a)


# --- every queue to exactly one member --------------------------------------------------------


@st.composite
def partitioning_cases(
    draw: st.DrawFn,
) -> tuple[AllocateStrategy, list[MessageQueue], list[str]]:
    """A strategy with a configuration that covers every queue, its queues and ids."""
    queues = draw(queue_lists)
    ids = draw(client_id_lists)
    name = draw(st.sampled_from(sorted(STRATEGIES)))
    strategy: AllocateStrategy
    if name == "CONSISTENT_HASH":
        strategy = ConsistentHash(draw(st.integers(1, 12)))
    elif name == "CONFIG":
        owners = draw(st.lists(st.sampled_from(ids), min_size=len(queues), max_size=len(queues)))
        table: dict[str, list[MessageQueue]] = {}
        for q, cid in zip(queues, owners, strict=True):
            table.setdefault(cid, []).append(q)
        strategy = ByConfig(table)
    elif name == "MACHINE_ROOM":
        strategy = ByMachineRoom({broker_room(q.broker_name) for q in queues})
    elif name == "MACHINE_ROOM_NEARBY":
        inner = draw(st.sampled_from([Averagely(), AveragelyByCircle(), ConsistentHash()]))
        strategy = MachineRoomNearby(inner)
    else:
        strategy = strategy_named(name)
    return strategy, queues, ids


@given(partitioning_cases())
def test_every_queue_goes_to_exactly_one_member(
    case: tuple[AllocateStrategy, list[MessageQueue], list[str]],
) -> None:
    strategy, queues, ids = case
    shares = whole_group(strategy, queues, ids)
    taken = [q for share in shares.values() for q in share]
    assert sorted(taken) == sorted(queues)  # union is everything, and nothing twice
    report = check_allocation(strategy, "g", queues, ids)
    assert report.ok
    assert {cid: list(qs) for cid, qs in report.assignments.items()} == shares


@pytest.mark.parametrize("strategy", [Averagely(), AveragelyByCircle()], ids=lambda s: s.name)
@given(queues=queue_lists, ids=client_id_lists)
def test_average_strategies_counts_differ_by_at_most_one(
    strategy: AllocateStrategy, queues: list[MessageQueue], ids: list[str]
) -> None:
    counts = [len(share) for share in whole_group(strategy, queues, ids).values()]
    assert max(counts) - min(counts) <= 1


@given(queues=queue_lists, ids=client_id_lists)
def test_machine_room_splits_its_rooms_evenly(queues: list[MessageQueue], ids: list[str]) -> None:
    strategy = ByMachineRoom({broker_room(q.broker_name) for q in queues})
    counts = [len(share) for share in whole_group(strategy, queues, ids).values()]
    assert max(counts) - min(counts) <= 1


@given(queues=queue_lists, ids=client_id_lists, virtual_nodes=st.integers(1, 12), data=st.data())
def test_consistent_hash_moves_only_the_leavers_queues(
    queues: list[MessageQueue], ids: list[str], virtual_nodes: int, data: st.DataObject
) -> None:
    """The bound: when one member leaves, exactly the queues it held change owner (every
    other queue keeps its consumer), so at most ``len(leaver's share)`` queues move."""
    assume(len(ids) >= 2)
    strategy = ConsistentHash(virtual_nodes)
    leaver = data.draw(st.sampled_from(ids))
    before = owners(whole_group(strategy, queues, ids))
    after = owners(whole_group(strategy, queues, [cid for cid in ids if cid != leaver]))
    moved = {q for q in queues if before[q] != after[q]}
    assert moved == {q for q in queues if before[q] == leaver}


@given(queues=queue_lists, ids=client_id_lists, data=st.data())
def test_consistent_hash_joiner_only_takes_queues(
    queues: list[MessageQueue], ids: list[str], data: st.DataObject
) -> None:
    assume(len(ids) >= 2)
    joiner = data.draw(st.sampled_from(ids))
    strategy = ConsistentHash()
    before = owners(whole_group(strategy, queues, [cid for cid in ids if cid != joiner]))
    after = owners(whole_group(strategy, queues, ids))
    assert {q for q in queues if before[q] != after[q]} == {
        q for q in queues if after[q] == joiner
    }


def owners(shares: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    return {q: cid for cid, share in shares.items() for q in share}


def test_averagely_splits_as_the_seed_describes() -> None:
    """Seed 003: eight queues, three consumers: [0, 1, 2], [3, 4, 5], [6, 7]."""
    queues = topic_queues(8)
    shares = whole_group(Averagely(), queues, ["1", "0", "2"])
    assert shares == {"0": queues[0:3], "1": queues[3:6], "2": queues[6:8]}


def test_circle_deals_round_robin() -> None:
    queues = topic_queues(5)
    shares = whole_group(AveragelyByCircle(), queues, ["A", "B"])
    assert shares == {"A": [queues[0], queues[2], queues[4]], "B": [queues[1], queues[3]]}


def test_more_members_than_queues_leaves_the_last_members_idle() -> None:
    queues = topic_queues(2)
    for strategy in (Averagely(), AveragelyByCircle()):
        shares = whole_group(strategy, queues, ["a", "b", "c"])
        assert shares == {"a": [queues[0]], "b": [queues[1]], "c": []}


def test_inputs_are_sorted_and_queues_taken_as_a_set() -> None:
    queues = topic_queues(4)
    shuffled = [queues[3], queues[1], queues[1], queues[0], queues[2]]
    assert allocate("AVG", "g", "a", shuffled, ["b", "a"]) == queues[:2]


# --- configuration strategies -----------------------------------------------------------------


def test_config_hands_each_member_its_configured_queues_still_in_the_topic() -> None:
    queues = topic_queues(4)
    gone = MessageQueue("TopicTest", "broker-a", 9)
    strategy = ByConfig({"a": [queues[2], gone], "b": queues[:2]})
    assert allocate(strategy, "g", "a", queues, ["a", "b"]) == [queues[2]]
    report = check_allocation(strategy, "g", queues, ["a", "b"])
    assert report.unassigned == (queues[3],)
    assert not report.ok


def test_config_overlap_is_reported_as_shared() -> None:
    queues = topic_queues(2)
    report = check_allocation(ByConfig({"a": queues, "b": queues[1:]}), "g", queues, ["a", "b"])
    assert dict(report.shared) == {queues[1]: ("a", "b")}


def test_machine_room_leaves_other_rooms_to_other_groups() -> None:
    local = topic_queues(3, broker="room1@broker-a")
    remote = topic_queues(2, broker="room2@broker-b")
    unroomed = topic_queues(1, broker="broker-c")
    report = check_allocation(
        ByMachineRoom({"room1"}), "g", local + remote + unroomed, ["x", "y"]
    )
    assert report.assignments == {"x": (local[0], local[2]), "y": (local[1],)}
    assert set(report.unassigned) == set(remote + unroomed)


@pytest.mark.parametrize(
    ("name", "room"),
    [("room1@broker-a", "room1"), ("@b", ""), ("a@b@@", "a"), ("broker-a", None),
     ("room@", None), ("a@b@c", None)],
)
def test_broker_room_reads_names_as_java_splits_them(name: str, room: str | None) -> None:
    assert broker_room(name) == room


def test_nearby_keeps_queues_in_rooms_with_members_and_shares_the_rest() -> None:
    room1 = topic_queues(4, broker="room1@broker-a")
    room3 = topic_queues(2, broker="room3@broker-c")
    ids = ["room1@c1", "room2@c2"]
    shares = whole_group(MachineRoomNearby(), room1 + room3, ids)
    assert shares == {"room1@c1": [*room1, room3[0]], "room2@c2": [room3[1]]}


@pytest.mark.parametrize(
    ("queue", "client_id"),
    [(MessageQueue("t", "broker-a", 0), "room1@c"), (MessageQueue("t", "room1@b", 0), "c1")],
)
def test_nearby_needs_a_room_for_every_broker_and_client(
    queue: MessageQueue, client_id: str
) -> None:
    with pytest.raises(AllocationError, match="no machine room"):
        allocate(MachineRoomNearby(rooms=RoomPrefix()), "g", client_id, [queue], [client_id])


# --- duplicate client ids (seed 003) ----------------------------------------------------------


@given(partitioning_cases(), st.data())
def test_a_repeated_id_is_refused_by_every_strategy(
    case: tuple[AllocateStrategy, list[MessageQueue], list[str]], data: st.DataObject
) -> None:
    strategy, queues, ids = case
    twin = data.draw(st.sampled_from(ids))
    listed = [*ids, twin]
    with pytest.raises(DuplicateClientIds) as caught:
        allocate(strategy, "g", ids[0], queues, listed)
    assert caught.value.duplicates == {twin: 2}
    assert caught.value.distinct_ids == sorted(ids, key=java_order)
    assert not check_allocation(strategy, "g", queues, listed).ok


def test_seed_003_circle_with_ids_0_2_2() -> None:
    """Consumers 0, 2, 2 over eight queues: both "2"s take queues 1, 4, 7; 2 and 5 starve."""
    queues = topic_queues(8, topic="topic-test")
    report = check_allocation("AVG_BY_CIRCLE", "g", queues, ["0", "2", "2"])
    assert report.assignments == {"0": (queues[0], queues[3], queues[6]),
                                  "2": (queues[1], queues[4], queues[7])}
    assert dict(report.shared) == {q: ("2", "2") for q in (queues[1], queues[4], queues[7])}
    assert report.unassigned == (queues[2], queues[5])
    assert dict(report.duplicate_ids) == {"2": 2}


def test_seed_003_two_consumers_named_consumer_a() -> None:
    """Two processes with instance name ConsumerA on one host: both take queues 0 and 1."""
    queues = topic_queues(4)
    cid = "192.168.1.5@ConsumerA"
    report = check_allocation("AVG", "g", queues, [cid, cid])
    assert report.assignments == {cid: (queues[0], queues[1])}
    assert report.unassigned == (queues[2], queues[3])
    with pytest.raises(DuplicateClientIds, match="ConsumerA' x2"):
        allocate("AVG", "g", cid, queues, [cid, cid])


def test_allocating_over_the_distinct_ids_leaves_no_queue_behind() -> None:
    queues = topic_queues(8)
    with pytest.raises(DuplicateClientIds) as caught:
        allocate("AVG", "g", "0", queues, ["0", "2", "2"])
    assert check_allocation("AVG", "g", queues, caught.value.distinct_ids).ok


# --- bad input --------------------------------------------------------------------------------


def test_unknown_strategy_lists_the_choices() -> None:
    with pytest.raises(UnknownStrategy, match=r"'avg'.*AVG, AVG_BY_CIRCLE, CONSISTENT_HASH"):
        strategy_named("avg")
    with pytest.raises(UnknownStrategy, match="MACHINE_ROOM_NEARBY-<inner>"):
        strategy_named("AVG-AVG")


@pytest.mark.parametrize(
    "strategy",
    [Averagely(), AveragelyByCircle(), ConsistentHash(3), MachineRoomNearby(AveragelyByCircle()),
     MachineRoomNearby(MachineRoomNearby(ConsistentHash()))],
    ids=lambda s: s.name,
)
def test_strategy_names_round_trip(strategy: AllocateStrategy) -> None:
    rebuilt = strategy_named(strategy.name)
    assert rebuilt.name == strategy.name
    assert type(rebuilt) is type(strategy)


def test_strategies_that_need_configuration_say_so() -> None:
    with pytest.raises(AllocationError, match=r"CONFIG.*queues_by_id"):
        strategy_named("CONFIG")
    with pytest.raises(AllocationError, match=r"MACHINE_ROOM.*consumer_rooms"):
        allocate("MACHINE_ROOM", "g", "a", topic_queues(1), ["a"])
    assert strategy_named("MACHINE_ROOM", consumer_rooms=["r1"]).name == "MACHINE_ROOM"


def test_consistent_hash_needs_a_virtual_node() -> None:
    with pytest.raises(AllocationError, match="virtual_nodes"):
        ConsistentHash(0)


@pytest.mark.parametrize(
    ("current", "queues", "ids", "message"),
    [("", topic_queues(1), ["a"], "current client id is empty"),
     ("a", [], ["a"], "no queues"),
     ("a", topic_queues(1), [], "no client ids")],
)
def test_empty_inputs_are_errors(
    current: str, queues: list[MessageQueue], ids: list[str], message: str
) -> None:
    with pytest.raises(AllocationError, match=message):
        allocate("AVG", "g", current, queues, ids)


@pytest.mark.parametrize("name", sorted({"AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"}))
def test_a_member_not_yet_listed_gets_nothing(name: str) -> None:
    assert allocate(name, "g", "newcomer", topic_queues(4), ["a", "b"]) == []
