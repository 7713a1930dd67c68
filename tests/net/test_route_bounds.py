"""The name server's tables at their bounds: a write past one is refused whole, a heartbeat
never is, and dropping brokers costs what they hold, not what the table holds."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evq.domain.codes import ResponseCode
from evq.domain.topics import TopicConfig
from evq.net.register_broker import DataVersion
from evq.net.routes import (
    BROKER_EXPIRED_MS,
    QueueData,
    Registering,
    Registrant,
    RouteLimits,
    RouteTable,
    TableFull,
    queue_table,
)


def topics(*names: str, queues: int = 4) -> list[TopicConfig]:
    return [TopicConfig(topic_name=n, read_queue_nums=queues, write_queue_nums=queues)
            for n in names]


def register(rt: RouteTable, name: str = "a", port: int = 1, *, broker_id: int = 0,
             cluster: str = "C", serves: list[TopicConfig] | None = None, now: int = 0) -> None:
    rt.register(cluster=cluster, broker_name=name, broker_addr=f"h:{port}", broker_id=broker_id,
                ha_server_addr="", topics=topics("T") if serves is None else serves, now_ms=now)


def state(rt: RouteTable) -> dict[str, Any]:
    """Everything the table holds, indexes and counts too, as a copy to compare with later."""
    return copy.deepcopy(vars(rt))


def check_tables(rt: RouteTable) -> None:
    """The counts are the tables' sizes and the indexes exactly their tables inverted."""
    assert rt.slot_count == sum(len(b.addrs) for b in rt.brokers.values())
    assert rt.listing_count == sum(len(names) for names in rt.clusters.values())
    assert rt.queue_count == sum(len(q) for q in rt.served.values())
    assert rt.kv_count == sum(max(1, len(t)) for t in rt.kv.values())
    topics: dict[str, set[str]] = {}
    for name, served in rt.served.items():
        assert served, name  # no broker name without queue data (one leaving is dropped then)
        for topic, queue in served.items():
            assert queue.broker_name == name
            topics.setdefault(topic, set()).add(name)
    assert {topic: set(names) for topic, names in rt.topics.items()} == topics
    assert all(len(set(names)) == len(names) for names in rt.topics.values())
    slots: dict[str, set[tuple[str, int]]] = {}
    for name, data in rt.brokers.items():
        assert data.addrs, name  # no broker name without an address
        for broker_id, addr in data.addrs.items():
            slots.setdefault(addr, set()).add((name, broker_id))
    assert rt.slots == slots
    listed: dict[str, set[str]] = {}
    for cluster, names in rt.clusters.items():
        assert names, cluster
        for name in names:
            listed.setdefault(name, set()).add(cluster)
    assert rt.listed == listed
    assert set(listed) == set(rt.brokers) and set(rt.served) <= set(rt.brokers) | set(rt.leaving)
    assert set(rt.leaving) <= set(rt.served) and not set(rt.leaving) & set(rt.brokers)


def refused(rt: RouteTable, setting: str, write: Any) -> TableFull:
    """Run ``write``; it must be refused at ``setting`` and change nothing of ``rt``."""
    before = state(rt)
    with pytest.raises(TableFull) as info:
        write()
    assert (info.value.setting, info.value.code) == (setting, ResponseCode.SYSTEM_ERROR)
    assert state(rt) == before
    return info.value


# --- broker addresses -------------------------------------------------------------------------


def test_the_broker_address_bound_refuses_the_next_new_broker_and_never_a_heartbeat() -> None:
    rt = RouteTable(RouteLimits(max_broker_addresses=3))
    for n in range(3):
        register(rt, f"b{n}", n)
    exc = refused(rt, "maxBrokerAddresses", lambda: register(rt, "b3", 3))
    assert exc.remark == "the name server holds 3 broker addresses, its most (maxBrokerAddresses)"
    assert exc.limit == 3
    for n in range(3):  # heartbeats at the bound, a new topic table too
        register(rt, f"b{n}", n, serves=topics("T", f"U{n}"), now=30_000)
    assert rt.route("U0") is not None
    # A slave of b0 on an address of its own is a fourth address; refused too.
    refused(rt, "maxBrokerAddresses", lambda: register(rt, "b0", 9, broker_id=1))
    # b0's master turns slave on the same address: no growth, accepted.
    register(rt, "b0", 0, broker_id=1)
    assert rt.brokers["b0"].addrs == {1: "h:0"}
    rt.unregister(cluster="C", broker_name="b1", broker_addr="h:1", broker_id=0)
    register(rt, "b3", 3)
    assert sorted(rt.brokers) == ["b0", "b2", "b3"]


def test_an_unregistration_under_a_wrong_id_leaves_no_slot_behind() -> None:
    """The address is no longer live, so its slots go with it: left behind (as Java leaves
    them) they would never expire, and a client could fill the bound with them for good."""
    rt = RouteTable(RouteLimits(max_broker_addresses=2))
    register(rt, "b0", 0)
    register(rt, "b1", 1)
    for n in range(2):
        rt.unregister(cluster="C", broker_name=f"b{n}", broker_addr=f"h:{n}", broker_id=7)
    assert rt.brokers == {} and rt.live == {} and rt.slots == {} and rt.slot_count == 0
    assert rt.route("T") is None
    register(rt, "b2", 2)
    register(rt, "b3", 3)
    assert sorted(rt.brokers) == ["b2", "b3"]


def test_one_address_under_many_names_or_one_name_in_many_clusters_is_bounded_too() -> None:
    """The (name, id) slots and the cluster listings are held to the bound like addresses:
    one address may fill the first, one broker the second."""
    rt = RouteTable(RouteLimits(max_broker_addresses=2))
    register(rt, "x", 1)
    register(rt, "y", 1)  # h:1 in a second slot
    exc = refused(rt, "maxBrokerAddresses", lambda: register(rt, "z", 1))
    assert "holds 2 broker addresses" in exc.remark
    rt = RouteTable(RouteLimits(max_broker_addresses=2))
    register(rt, "x", 1, cluster="C1")
    register(rt, "x", 1, cluster="C2")
    refused(rt, "maxBrokerAddresses", lambda: register(rt, "x", 1, cluster="C3"))
    # Both listings go with the broker, so its clusters do not outlive it.
    assert rt.expire(BROKER_EXPIRED_MS + 1) == ["h:1"]
    assert rt.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_a_broker_back_on_a_new_address_counts_until_the_old_one_leaves() -> None:
    """Its new address takes the old one's slot, but the old one is live (it may still be
    connected) until it expires or its connection closes."""
    rt = RouteTable(RouteLimits(max_broker_addresses=1))
    register(rt, "a", 1, now=0)
    refused(rt, "maxBrokerAddresses", lambda: register(rt, "a", 2, now=60_000))
    assert rt.expire(BROKER_EXPIRED_MS + 1) == ["h:1"]
    register(rt, "a", 2, now=BROKER_EXPIRED_MS + 1)
    assert rt.brokers["a"].addrs == {0: "h:2"}


# --- topic queues ------------------------------------------------------------------------------


def test_the_topic_queue_bound_counts_net_growth_and_refuses_a_registration_whole() -> None:
    rt = RouteTable(RouteLimits(max_topic_queues=4))
    register(rt, "a", 1, serves=topics("T1", "T2", "T3"))
    register(rt, "b", 2, serves=topics("T1"))
    assert rt.queue_count == 4
    # b's new table changes T1 and adds T2: one queue past the bound, so neither is applied.
    exc = refused(rt, "maxTopicQueues",
                  lambda: register(rt, "b", 2, serves=topics("T1", "T2", queues=8)))
    assert exc.remark == ("the name server holds 4 topic queues and b's registration adds 1, "
                          "past its most, 4 (maxTopicQueues)")
    assert rt.queues("T1")["b"].read_queue_nums == 4
    # Heartbeats at the bound: the same table, a changed one, a smaller one, then all again.
    register(rt, "a", 1, serves=topics("T1", "T2", "T3", queues=8))
    register(rt, "a", 1, serves=topics("T1"))
    register(rt, "a", 1, serves=topics("T3", "T2", "T1"))
    assert rt.queues("T3")["a"].read_queue_nums == 4 and rt.queue_count == 4
    # A slave's table is not routed, so it does not count.
    register(rt, "a", 3, broker_id=1, serves=topics("S1", "S2"))
    # Room made by deleting a topic is room for one more, not two.
    rt.delete_topic("T3")
    assert rt.queue_count == 3
    refused(rt, "maxTopicQueues", lambda: register(rt, "c", 4, serves=topics("V1", "V2")))
    register(rt, "c", 4, serves=topics("V1"))
    assert rt.topic_list() == ["T1", "T2", "V1"] and rt.queue_count == 4


def test_topics_a_broker_lost_while_its_table_was_counted_are_counted_back() -> None:
    """Counted a step at a time, a table finds B1 held; B1 is deleted before the count ends,
    and so is new when stored.  Admitted on its count alone (one new queue, to 2 + 1 = 3),
    it would store two and pass the bound; counted back, it is refused, as it would be
    whole: nothing of it applied."""
    rt = RouteTable(RouteLimits(max_topic_queues=3))
    register(rt, "a", 1, serves=topics("A1", "A2"))
    register(rt, "b", 2, serves=topics("B1"))
    who = Registrant(cluster="C", broker_name="b", broker_addr="h:2", broker_id=0,
                     ha_server_addr="", now_ms=0)
    registering = rt.start_register(who, queue_table("b", 0, topics("B1", "B2")))
    assert registering.step(1) is False  # B1: held
    rt.delete_topic("B1")
    assert registering.step(1) is False  # B2: new
    exc = refused(rt, "maxTopicQueues", lambda: registering.step(1))
    assert exc.remark == ("the name server holds 2 topic queues and b's registration adds 2, "
                          "past its most, 3 (maxTopicQueues)")


def test_a_repeated_topic_in_one_table_is_one_queue() -> None:
    rt = RouteTable(RouteLimits(max_topic_queues=1))
    register(rt, "a", 1, serves=[*topics("T"), *topics("T", queues=8)])
    assert rt.served == {"a": {"T": QueueData("a", 8, 8, 6)}} and rt.queue_count == 1


# --- KV config ---------------------------------------------------------------------------------


def test_the_kv_bounds() -> None:
    rt = RouteTable(RouteLimits(max_kv_entries=2, max_kv_bytes=10))
    rt.put_kv("N", "k1", "1234567")  # 1 + 2 + 7: at the size bound
    rt.put_kv("M", "k1", "v")
    exc = refused(rt, "maxKvEntries", lambda: rt.put_kv("N", "k2", "v"))
    assert exc.remark == "the name server holds 2 KV config entries, its most (maxKvEntries)"
    rt.put_kv("N", "k1", "new")  # a new value of a key held is no growth
    exc = refused(rt, "maxKvBytes", lambda: rt.put_kv("N", "k1", "12345678"))
    assert exc.remark == ("a KV config entry of 11 bytes (namespace, key and value) is past "
                          "the most, 10 (maxKvBytes)")
    refused(rt, "maxKvBytes", lambda: rt.put_kv("N", "k1", "é" * 4))  # UTF-8 bytes count
    # A lone surrogate (a JSON header may carry one) counts its three bytes, no error.
    refused(rt, "maxKvBytes", lambda: rt.put_kv("N", "k1", "\ud800" * 3))
    assert rt.get_kv("N", "k1") == "new"
    # An emptied namespace stays, listed empty, as one entry its next key takes over.
    rt.delete_kv("M", "k1")
    assert rt.kv_list("M") == {} and rt.kv_count == 2
    refused(rt, "maxKvEntries", lambda: rt.put_kv("O", "k", "v"))
    rt.put_kv("M", "k2", "v")
    rt.delete_kv("N", "k1")
    rt.delete_kv("N", "nothing")
    rt.put_kv("N", "k3", "v")
    assert rt.kv == {"N": {"k3": "v"}, "M": {"k2": "v"}} and rt.kv_count == 2


# --- dropping brokers --------------------------------------------------------------------------


class Watched(dict[str, Any]):
    """A table that counts the keys a call touches and fails the call that walks it whole."""

    touched = 0

    def _touch(self) -> None:
        self.touched += 1

    def __getitem__(self, key: str) -> Any:
        self._touch()
        return super().__getitem__(key)

    def __delitem__(self, key: str) -> None:
        self._touch()
        super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        self._touch()
        return super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._touch()
        return super().get(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._touch()
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._touch()
        return super().setdefault(key, default)

    def walk(self, *args: object) -> Iterator[Any]:
        raise AssertionError(f"walked all {len(self)} entries")

    __iter__ = keys = values = items = walk  # type: ignore[assignment]


def test_expiring_brokers_touches_their_own_topics_not_the_table() -> None:
    """200,000 topics on two brokers, 500 brokers of one topic each: expiring the 500 touches
    each of their topics and broker entries a few times, and never walks the table (scanning
    it a dropped broker made expiring them 500 x 200,000 steps, seconds of a stalled loop)."""
    rt = RouteTable()
    big = topics(*(f"topic-{n}" for n in range(200_000)))
    register(rt, "big-a", 1, serves=big, now=BROKER_EXPIRED_MS)
    register(rt, "big-b", 2, serves=big, now=BROKER_EXPIRED_MS)
    for n in range(500):
        register(rt, f"small-{n}", 1000 + n, serves=topics(f"small-{n}", "topic-0"))
    rt.topics, rt.brokers = Watched(rt.topics), Watched(rt.brokers)  # type: ignore[assignment]
    gone = rt.expire(BROKER_EXPIRED_MS + 1)
    assert len(gone) == 500
    assert rt.topics.touched <= 4 * 1000  # type: ignore[attr-defined]  # 1,000 (topic, broker)
    assert rt.brokers.touched <= 4 * 500  # type: ignore[attr-defined]
    assert len(rt.topics) == 200_000 and rt.queue_count == 400_000
    assert sorted(rt.topics["topic-0"]) == ["big-a", "big-b"]


# --- against a model ---------------------------------------------------------------------------

LIMITS = RouteLimits(max_broker_addresses=3, max_topic_queues=5, max_kv_entries=3, max_kv_bytes=6)
NAMES = ["a", "b", "c"]
ADDRS = ["h:1", "h:2", "h:3", "h:4"]
CLUSTERS = ["C1", "C2"]
CHANNELS = ["k1", "k2"]
TOPICS = ["T1", "T2", "T3", "T4"]


VERSIONS = [None, DataVersion(0, 1), DataVersion(0, 2)]


class Model:
    """The tables as plainly as they can be said: whole-table scans, no indexes, no counts
    kept; a write past a bound is found by applying it to a copy and counting."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[int, str]] = {}  # addr -> (time, channel)
        self.versions: dict[str, DataVersion] = {}  # addr -> that of the last table applied
        self.digests: dict[str, bytes] = {}  # addr -> the last body applied or refreshed
        self.slots: dict[tuple[str, int], str] = {}  # (name, id) -> addr
        self.cluster_of: dict[str, str] = {}  # name -> the cluster it first registered in
        self.listings: set[tuple[str, str]] = set()  # (cluster, name)
        self.queues: dict[tuple[str, str], QueueData] = {}  # (topic, name) ->
        self.kv: dict[str, dict[str, str]] = {}

    def fits(self, limits: RouteLimits) -> bool:
        most = limits.max_broker_addresses
        return (max(len(self.live), len(self.slots), len(self.listings)) <= most
                and len(self.queues) <= limits.max_topic_queues
                and sum(max(1, len(t)) for t in self.kv.values()) <= limits.max_kv_entries
                and all(len(f"{ns}{k}{v}".encode()) <= limits.max_kv_bytes
                        for ns, t in self.kv.items() for k, v in t.items()))

    def heartbeat(self, cluster: str, name: str, addr: str, broker_id: int,
                  version: DataVersion | None, now: int, channel: str,
                  digest: bytes | None = None) -> bool:
        """Refresh the broker if the registration is a heartbeat: its version that of the
        last table applied for its address, or its body the last one applied or refreshed,
        live in the same slot and cluster."""
        if (not ((version is not None and self.versions.get(addr) == version)
                 or (digest is not None and self.digests.get(addr) == digest))
                or self.slots.get((name, broker_id)) != addr
                or (cluster, name) not in self.listings):
            return False
        self.live[addr] = (now, channel)
        if digest is not None:
            self.digests[addr] = digest
        return True

    def admit(self, cluster: str, name: str, addr: str, broker_id: int, now: int,
              channel: str) -> None:
        """A registration's all but its topics."""
        self.listings.add((cluster, name))
        if not any(n == name for n, _ in self.slots):
            self.cluster_of[name] = cluster
        for slot in [s for s, a in self.slots.items() if s[0] == name and a == addr]:
            del self.slots[slot]
        self.slots[name, broker_id] = addr
        self.live[addr] = (now, channel)
        self.versions.pop(addr, None)
        self.digests.pop(addr, None)

    def store(self, name: str, serves: Iterable[TopicConfig]) -> None:
        for t in serves:
            self.queues[t.topic_name, name] = QueueData(
                name, t.read_queue_nums, t.write_queue_nums, t.perm, t.topic_sys_flag)

    def register(self, cluster: str, name: str, addr: str, broker_id: int,
                 serves: list[TopicConfig], now: int, channel: str,
                 version: DataVersion | None = None) -> None:
        self.admit(cluster, name, addr, broker_id, now, channel)
        if broker_id == 0:
            self.store(name, serves)
        if version is not None:
            self.versions[addr] = version

    def served_by(self, name: str) -> set[str]:
        return {t for t, n in self.queues if n == name}

    def drop(self, name: str, broker_id: int) -> None:
        del self.slots[name, broker_id]
        if any(n == name for n, _ in self.slots):
            return
        del self.cluster_of[name]
        self.listings = {(c, n) for c, n in self.listings if n != name}
        self.queues = {(t, n): q for (t, n), q in self.queues.items() if n != name}

    def drop_addr(self, addr: str) -> None:
        self.live.pop(addr, None)
        self.versions.pop(addr, None)
        self.digests.pop(addr, None)
        for slot in [s for s, a in self.slots.items() if a == addr]:
            self.drop(*slot)

    def route(self, topic: str) -> dict[str, object] | None:
        names = sorted(n for t, n in self.queues if t == topic)
        if not names:
            return None
        return {
            "brokerDatas": [{"brokerAddrs": {str(i): a for (n, i), a in sorted(self.slots.items())
                                             if n == name},
                             "brokerName": name, "cluster": self.cluster_of[name]}
                            for name in names],
            "filterServerTable": {},
            "queueDatas": [self.queues[topic, name].to_json() for name in names],
        }

    def clusters(self) -> dict[str, list[str]]:
        return {c: sorted(n for c2, n in self.listings if c2 == c)
                for c in sorted({c for c, _ in self.listings})}


@attrs.define
class Pending:
    """A registration under way, as :class:`RouteTableModel` follows it."""

    who: Registrant
    table: dict[str, TopicConfig]  # a master's topics by name, the last config winning
    registering: Registering
    served: set[str]  # the topics its broker served when it began
    taken: set[str] = attrs.field(factory=set)  # the topics its steps took (stored or dropped)


registrations = {"cluster": st.sampled_from(CLUSTERS), "name": st.sampled_from(NAMES),
                 "addr": st.sampled_from(ADDRS), "broker_id": st.sampled_from([0, 0, 1]),
                 "serves": st.lists(st.sampled_from(TOPICS), max_size=4),
                 "queues": st.integers(1, 2), "channel": st.sampled_from(CHANNELS),
                 "version": st.sampled_from(VERSIONS)}


MOST = st.none() | st.integers(1, 3)  # topics a drop leaves at once (None: all)


class RouteTableModel(RuleBasedStateMachine):
    """Registrations (whole, or a step at a time with any other write between steps),
    heartbeats, unregistrations, expiry, closed channels, topic deletion and KV writes with
    small bounds, against :class:`Model`: the same refusals, the same routes, and indexes
    that are exactly their tables inverted after every call."""

    def __init__(self) -> None:
        super().__init__()
        self.rt = RouteTable(LIMITS)
        self.model = Model()
        self.now = 0
        self.pending: Pending | None = None
        self.last: dict[str, Any] | None = None  # the last registration sent

    def apply(self, write: Any, model_write: Any) -> None:
        """``write`` to the table, ``model_write`` to a copy of the model: the table refuses
        exactly when the copy no longer fits, and then the model stays as it was."""
        after = copy.deepcopy(self.model)
        model_write(after)
        before = state(self.rt)
        if after.fits(LIMITS):
            write()
            self.model = after
        else:
            with pytest.raises(TableFull):
                write()
            assert state(self.rt) == before

    @precondition(lambda self: self.pending is None)  # the name server's lock
    @rule(**registrations)
    def register(self, cluster: str, name: str, addr: str, broker_id: int, serves: list[str],
                 queues: int, channel: str, version: DataVersion | None) -> None:
        self.last = {k: v for k, v in locals().items() if k in registrations}
        table = topics(*serves, queues=queues)
        heartbeats = self.rt.heartbeats
        heartbeat = copy.deepcopy(self.model).heartbeat(cluster, name, addr, broker_id, version,
                                                        self.now, channel)
        self.apply(
            lambda: self.rt.register(cluster=cluster, broker_name=name, broker_addr=addr,
                                     broker_id=broker_id, ha_server_addr="", topics=table,
                                     now_ms=self.now, channel=channel, data_version=version),
            lambda m: m.heartbeat(cluster, name, addr, broker_id, version, self.now, channel)
            or m.register(cluster, name, addr, broker_id, table, self.now, channel, version))
        assert self.rt.heartbeats == heartbeats + heartbeat

    @precondition(lambda self: self.pending is None)
    @rule(**registrations)
    def begin(self, cluster: str, name: str, addr: str, broker_id: int, serves: list[str],
              queues: int, channel: str, version: DataVersion | None) -> None:
        """What the name server does: a heartbeat at once, else a registration in steps.
        The body's digest stands for its bytes: the same topics, queues and version."""
        self.last = {k: v for k, v in locals().items() if k in registrations}
        table = topics(*serves, queues=queues)
        digest = repr((serves, queues, version)).encode()
        who = Registrant(cluster=cluster, broker_name=name, broker_addr=addr,
                         broker_id=broker_id, ha_server_addr="", now_ms=self.now,
                         channel=channel, data_version=version, body_digest=digest)
        heartbeat = self.rt.refresh(who)
        assert (heartbeat is not None) == self.model.heartbeat(
            cluster, name, addr, broker_id, version, self.now, channel, digest)
        if heartbeat is None:
            self.pending = Pending(
                who, {t.topic_name: t for t in table} if broker_id == 0 else {},
                self.rt.start_register(who, queue_table(name, broker_id, table)),
                self.model.served_by(name))

    @precondition(lambda self: self.pending is None and self.last is not None)
    @rule(in_steps=st.booleans(), serves=st.none() | registrations["serves"])
    def again(self, in_steps: bool, serves: list[str] | None) -> None:
        """The last registration sent again (a broker's heartbeat), its table changed or not
        (a broker that does not move its version when it should)."""
        assert self.last is not None
        sent = {**self.last, "serves": self.last["serves"] if serves is None else serves}
        (self.begin if in_steps else self.register)(**sent)

    def fits_whole(self, p: Pending) -> bool:
        """Whether ``p``'s registration, applied whole now, leaves the model within bounds."""
        after = copy.deepcopy(self.model)
        w = p.who
        after.register(w.cluster, w.broker_name, w.broker_addr, w.broker_id,
                       list(p.table.values()), w.now_ms, str(w.channel))
        return after.fits(LIMITS)

    @precondition(lambda self: self.pending is not None)
    @rule(most=st.integers(1, 3))
    def step(self, most: int) -> None:
        p = self.pending
        assert p is not None
        w = p.who
        admitted = p.registering.live is not None
        before = state(self.rt)
        try:
            done = p.registering.step(most)
        except TableFull:
            assert state(self.rt) == before
            # Refused only if it does not fit, or if its broker lost topics while it was
            # counted (then it may count them back, conservatively).
            assert not self.fits_whole(p) or p.served - self.model.served_by(w.broker_name)
            self.pending = None
            return
        if not admitted and p.registering.live is not None:
            assert self.fits_whole(p)  # admitted: it fits
            self.model.admit(w.cluster, w.broker_name, w.broker_addr, w.broker_id, w.now_ms,
                             str(w.channel))
        taken = p.table.keys() - p.registering.queues.keys() - p.taken
        p.taken |= taken
        ours = w.broker_addr in self.model.live  # dropped since admitted, or not
        if ours:
            self.model.store(w.broker_name, (p.table[name] for name in taken))
        if done:
            assert p.taken == p.table.keys()
            if ours and w.data_version is not None:
                self.model.versions[w.broker_addr] = w.data_version
            if ours and w.body_digest is not None:
                self.model.digests[w.broker_addr] = w.body_digest
            self.pending = None

    # A drop leaves its brokers' topics all at once (most=None) or a few now and the rest to
    # step_leaving; either way no lookup names them from the drop on (the model's view).

    @rule(cluster=st.sampled_from(CLUSTERS), name=st.sampled_from(NAMES),
          addr=st.sampled_from(ADDRS), broker_id=st.sampled_from([0, 1]), most=MOST)
    def unregister(self, cluster: str, name: str, addr: str, broker_id: int,
                   most: int | None) -> None:
        self.rt.unregister(cluster=cluster, broker_name=name, broker_addr=addr,
                           broker_id=broker_id, most=most)
        self.model.drop_addr(addr)  # every slot of the address: none left unexpirable

    @rule(seconds=st.sampled_from([30, 60, 120, 121]), most=MOST)
    def expire(self, seconds: int, most: int | None) -> None:
        self.now += seconds * 1000
        gone = [a for a, (t, _) in self.model.live.items() if self.now - t > BROKER_EXPIRED_MS]
        for addr in gone:
            self.model.drop_addr(addr)
        assert self.rt.expire(self.now, most=most) == gone

    @rule(channel=st.sampled_from(CHANNELS), most=MOST)
    def close(self, channel: str, most: int | None) -> None:
        gone = [a for a, (_, c) in self.model.live.items() if c is channel]
        for addr in gone:
            self.model.drop_addr(addr)
        assert self.rt.channel_closed(channel, most) == gone

    @rule(most=st.integers(1, 3))
    def step_leaving(self, most: int) -> None:
        held = self.rt.queue_count
        done = self.rt.step_leaving(most)
        assert done == (not self.rt.leaving)
        assert held - self.rt.queue_count <= most
        assert done or held - self.rt.queue_count == most

    @rule(topic=st.sampled_from(TOPICS), cluster=st.sampled_from([None, *CLUSTERS]))
    def delete_topic(self, topic: str, cluster: str | None) -> None:
        self.rt.delete_topic(topic, cluster)
        self.model.queues = {(t, n): q for (t, n), q in self.model.queues.items()
                             if t != topic or (cluster is not None
                                               and (cluster, n) not in self.model.listings)}

    @rule(namespace=st.sampled_from(["N", "M"]), key=st.sampled_from(["k1", "k2"]),
          value=st.sampled_from(["", "v", "vvvv"]))
    def put_kv(self, namespace: str, key: str, value: str) -> None:
        self.apply(lambda: self.rt.put_kv(namespace, key, value),
                   lambda m: m.kv.setdefault(namespace, {}).__setitem__(key, value))

    @rule(namespace=st.sampled_from(["N", "M"]), key=st.sampled_from(["k1", "k2"]))
    def delete_kv(self, namespace: str, key: str) -> None:
        self.rt.delete_kv(namespace, key)
        self.model.kv.get(namespace, {}).pop(key, None)

    @invariant()
    def a_registration_admitted_holds_the_address_live(self) -> None:
        p = self.pending
        if p is not None and p.registering.live is not None:
            live = self.rt.live.get(p.who.broker_addr)
            assert (live is p.registering.live) == (p.who.broker_addr in self.model.live)

    @invariant()
    def counts_and_indexes_are_the_tables_and_within_the_bounds(self) -> None:
        rt = self.rt
        check_tables(rt)
        most = LIMITS.max_broker_addresses
        assert max(len(rt.live), rt.slot_count, rt.listing_count) <= most
        assert rt.queue_count <= LIMITS.max_topic_queues
        assert rt.kv_count <= LIMITS.max_kv_entries

    @invariant()
    def routes_and_clusters_are_the_models(self) -> None:
        for topic in TOPICS:
            assert self.rt.route(topic) == self.model.route(topic)
        assert self.rt.cluster_info()["clusterAddrTable"] == self.model.clusters()
        assert list(self.rt.live) == list(self.model.live)
        assert self.rt.kv == self.model.kv
        for cluster in CLUSTERS:
            assert self.rt.topics_by_cluster(cluster) == sorted(
                {t for t, n in self.model.queues if (cluster, n) in self.model.listings})


TestRouteTableModel = RouteTableModel.TestCase
