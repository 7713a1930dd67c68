"""The name server's tables (RocketMQ ``RouteInfoManager``), pure: no sockets, no clock.

Brokers register every 30 s with their topic configs; the tables answer route lookups in the
JSON shape the clients parse (§2.3.1).  Callers pass the time in, so expiry (120 s without a
registration, scanned every 10 s) is tested by moving a number.

    cluster ──< broker name ──< broker id -> "ip:port"          (BrokerData)
    broker name ──< topic -> read/write queue nums, perm         (QueueData, master's view)
    "ip:port" -> last registration time, HA address, channel     (BrokerLive)

Without an ACL anyone who reaches the port may register brokers and put KV config, so every
table has a bound (:class:`RouteLimits`).  A write that would take a table past its bound is
refused whole, before any of it is applied (:class:`TableFull`).  What a broker's heartbeat
re-sends is counted by its net growth only, so a broker already registered is never refused its
heartbeat.  Dropping a broker costs its own slots and topics, found through an index
(address -> its slots) and its own queue data, not a scan of the tables: a name server
dropping many brokers of a big table must not stall its loop.  The broker goes from every
lookup at once, and its topics can go a few thousand a step (:attr:`RouteTable.leaving`),
as a registration is applied.

The queue data are kept by broker, in a few large dicts, and a topic's index entry names its
brokers as the keys of a dict of strings to None.  CPython's cycle collector never tracks a
dict that holds only such atoms, so a million topics add no object to the full collections,
which hold the loop while they walk every object tracked: 25 ms at the bound, where a dict a
topic holding queue data (topic -> broker -> queue data) made one take 290 ms, and a large
registration set several off.  A dict rather than a tuple of the names, because a broker
leaves each of its topics in one step however many brokers serve it: with tuples, rebuilt
without it, one connection's 4,096 brokers serving the same 244 topics took 212 s to drop
when it closed.

A registration costs the loop nothing per topic when its table's DataVersion is the one last
applied for that address (:meth:`RouteTable.refresh`: every 30 s heartbeat of an unchanged
broker), as in Java.  A changed table is applied by a :class:`Registering`, a few thousand
topics a step, so that its owner can let the loop turn between steps: a table at the bound (a
million topics, about a second of work) would otherwise hold every other client's lookups for
that long.  The steps keep the tables and their indexes consistent at each step's end, and the
bounds whole: the topics a registration adds are counted before any is applied, and it is
refused, or admitted with all of them, in one step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Final

import attrs

from evq import logs
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.config_json import camel
from evq.domain.topics import TopicConfig
from evq.net.register_broker import DataVersion

log = logs.get_logger(__name__)

MASTER_ID: Final = 0
BROKER_EXPIRED_MS = 120_000  # BROKER_CHANNEL_EXPIRED_TIME
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


@attrs.frozen(slots=True, kw_only=True)
class RouteLimits:
    """The most a name server holds (evq's: RocketMQ's name server has no bounds).  Each is a
    setting of the name server under its camelCase name: ``maxBrokerAddresses=8192`` in the
    ``--config`` file of ``evq namesrv`` (or ``evq serve``), ``EVQ_MAX_BROKER_ADDRESSES`` in
    its environment.  Memory figures are tracemalloc's, CPython 3.11 on 64 bits.
    """

    max_broker_addresses: int = attrs.field(default=4096, validator=attrs.validators.ge(1))
    """Broker addresses: each of the three broker tables (addresses with their last
    registration, (broker name, id) -> address, cluster -> broker names) holds at most this
    many entries.  A RocketMQ cluster runs tens to hundreds of broker processes, each one
    entry in each table; 4,096 leaves room for the largest and for a restart wave (a broker
    back on a new address while its old one has not expired yet).  A broker costs 1.2 KB
    without its topics: 4.6 MiB at the bound."""
    max_topic_queues: int = attrs.field(default=1_000_000, validator=attrs.validators.ge(1))
    """(topic, broker name) pairs over all topics, one queue-data entry each.  A broker of
    100,000 topics is a large one, and a cluster of several such groups stays under the
    bound.  An entry costs 413 bytes when each topic (named in 20 characters) is on one
    broker group, 520 with 127-character names, 195 when four groups share a topic: 0.4-0.5
    GiB at the bound."""
    max_kv_entries: int = attrs.field(default=10_000, validator=attrs.validators.ge(1))
    """KV config entries over all namespaces (a namespace whose keys were all deleted stays,
    as in RocketMQ, and counts as one).  RocketMQ keeps one entry an ordered topic
    (``ORDER_TOPIC_CONFIG``) and a few of its own."""
    max_kv_bytes: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    """UTF-8 bytes of one KV entry: namespace, key and value together.  An ordered topic's
    value (``broker-a:8;broker-b:8``) takes about 11 bytes a broker group, so 1 KiB holds
    some 90 groups.  All entries at their most hold 10.7 MiB; kept small because every
    registration's answer carries the whole ``ORDER_TOPIC_CONFIG`` namespace, serialized on
    the loop (0.38 s for 10 MiB of it; at 16 KiB an entry it was 3.6 s)."""

    def bounds(self) -> dict[str, int]:
        """Each bound by its setting name (``maxBrokerAddresses``)."""
        return {camel(f.name): getattr(self, f.name) for f in attrs.fields(RouteLimits)}


MAX_BROKER_ADDRESSES: Final = camel(attrs.fields(RouteLimits).max_broker_addresses.name)
MAX_TOPIC_QUEUES: Final = camel(attrs.fields(RouteLimits).max_topic_queues.name)
MAX_KV_ENTRIES: Final = camel(attrs.fields(RouteLimits).max_kv_entries.name)
MAX_KV_BYTES: Final = camel(attrs.fields(RouteLimits).max_kv_bytes.name)


class TableFull(BrokerError):
    """A write refused because it would take a table past a bound of :class:`RouteLimits`;
    nothing of it was applied.  SYSTEM_ERROR, what RocketMQ answers a request it cannot
    serve; the remark names the bound and its setting, for the operator who reads it in the
    broker's log."""

    def __init__(self, setting: str, limit: int, remark: str) -> None:
        super().__init__(ResponseCode.SYSTEM_ERROR, remark)
        self.setting = setting
        """The bound's setting name (``maxBrokerAddresses``)."""
        self.limit = limit


@attrs.define(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    addrs: dict[int, str] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}


@attrs.frozen(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, object]:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}


@attrs.define(slots=True)
class BrokerLive:
    """A live broker address.  A :class:`Registering` tells by this object's identity whether
    the address it registers is still the one it admitted."""

    last_update_ms: int
    ha_server_addr: str
    channel: object
    data_version: DataVersion | None = None
    """The version of the last registration applied whole for this address (None: none yet,
    or one still being applied): a registration with the same one is a heartbeat."""
    body_digest: bytes | None = None
    """The :func:`~evq.net.register_broker.body_digest` of the last body applied whole or
    refreshed for this address (None as for ``data_version``): a registration with the same
    one is a heartbeat, told before its body is decoded."""


@attrs.frozen(slots=True)
class Registration:
    """What REGISTER_BROKER answers: a slave learns its master's address and HA address."""

    master_addr: str | None
    ha_server_addr: str | None
    order_topic_config: dict[str, str]


@attrs.frozen(slots=True, kw_only=True)
class Registrant:
    """Who registers, and when: the REGISTER_BROKER header, the DataVersion of its topic
    table and the digest of its body (either None: not known, so it tells nothing) and the
    connection it came on."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str
    now_ms: int
    channel: object = None
    data_version: DataVersion | None = None
    body_digest: bytes | None = None


def queue_table(broker_name: str, broker_id: int,
                topics: Iterable[TopicConfig]) -> dict[str, QueueData]:
    """The queue data a registration's topic table puts in the tables: a master's topics, the
    last config of a name winning (a compressed body may repeat one); none of a slave's, which
    are not routed.  It reads no table, so a large one is built in the worker thread that
    decodes the body, and a registration's step on the loop only stores what is built.

    Topics of the same queue counts, perm and flag share one (immutable) QueueData: a broker's
    table holds a few distinct ones, not one a topic.  Each would be one more object for the
    cycle collector to walk at every full collection, which holds the GIL and so the loop, and
    a changed table of a million new ones set such a collection off (370 ms at the bound, with
    a QueueData and a dict a topic)."""
    if broker_id != MASTER_ID:
        return {}
    shared: dict[tuple[int, int, int, int], QueueData] = {}
    table = {}
    for t in topics:
        key = (t.read_queue_nums, t.write_queue_nums, t.perm, t.topic_sys_flag)
        queue = shared.get(key)
        if queue is None:
            queue = shared[key] = QueueData(broker_name, *key)
        table[t.topic_name] = queue
    return table


@attrs.define(slots=True, eq=False)
class Registering:
    """A registration under way (:meth:`RouteTable.start_register`), carried on by
    :meth:`step`, at most ``most`` topics a call.  Its owner may run other calls on the tables
    between steps (lookups, unregistrations, expiry, topic deletions), but not another
    registration: the name server runs them one at a time.

    First it finishes dropping the queue data of brokers that went (:attr:`RouteTable.leaving`),
    a step's worth at a time, so that the room they free is counted and a broker name coming
    back never meets its old queue data.  Then it counts the topics of its table the broker
    does not serve yet, reading only.  Then,
    in one step, it is refused (:class:`TableFull`, nothing of it applied) or admitted: the
    broker placed in its slot and cluster, its address live.  Then the queue data are taken
    out of ``queues`` and stored, a step's worth at a time (the last topics first), so that
    ``queues`` ends empty: freeing a million entries at once is one C call that holds the
    loop for 90 ms.  A broker dropped meanwhile (unregistered, its connection closed) takes
    what was stored of its table with it, and the rest is dropped, still a step at a time:
    nothing is left served by a broker that is gone.  The address records the table's
    version and body digest only once all of it is stored, so a registration stopped half-way
    is never taken for a heartbeat.

    The count may run stale while the loop turns: topics this broker serves that are deleted
    during it count as held, though they are new when stored.  So the topics it lost while
    being counted are counted back at admission: the bound is never passed, and at worst a
    registration is refused for the room its own broker's topics left, which its next
    heartbeat finds.
    """

    table: RouteTable
    who: Registrant
    queues: dict[str, QueueData]
    _uncounted: Iterator[str] = attrs.field(init=False)
    _served_at_start: int = attrs.field(default=-1, init=False)
    """The broker's topics when counting began (-1: not begun)."""
    new_queues: int = attrs.field(default=0, init=False)
    """Topics of the table not served by the broker when counted."""
    live: BrokerLive | None = attrs.field(default=None, init=False)
    """The address's live entry once admitted; None before."""
    stored: int = attrs.field(default=0, init=False)
    """Topics whose queue data are stored so far."""
    result: Registration | None = attrs.field(default=None, init=False)
    """The answer, once complete."""

    def __attrs_post_init__(self) -> None:
        self._uncounted = iter(self.queues)

    def step(self, most: int) -> bool:
        """Carry the registration on by up to ``most`` topics counted or stored (``most`` at
        least 1); True once it is complete.  A table whose topics, counted and then stored,
        fit in ``most`` completes in one step: a broker's registration of the topic a send
        just created is answered without the loop turning, as when tables were applied whole,
        so a client asking for the new route right after is told it is unknown no longer than
        then.  Raises :class:`TableFull`, having applied nothing of it, at the step that
        admits."""
        table, name = self.table, self.who.broker_name
        if self.live is None:
            if table.leaving:  # the drops before it first: the room they free, and its own name
                held = table.queue_count
                done = table.step_leaving(most)
                most -= held - table.queue_count
                if not done or most < 1:
                    return False
            if self._served_at_start < 0:
                self._served_at_start = len(table.served.get(name, ()))
            counting = list(islice(self._uncounted, most))
            if counting:
                served = table.served.get(name, {})
                self.new_queues += len(counting) - sum(map(served.__contains__, counting))
                if len(counting) == most:
                    return False  # more may be left to count: the loop turns first
                most -= len(counting)
            lost = self._served_at_start - len(table.served.get(name, ()))
            self.live = table._admit(self.who, self.new_queues + lost)
        ours = table.live.get(self.who.broker_addr) is self.live
        queues = self.queues
        if queues:
            taken = dict(queues.popitem() for _ in range(min(most, len(queues))))
            if ours:
                table._serve(name, taken)
                self.stored += len(taken)
            if queues:
                return False
        if ours:
            self.live.data_version = self.who.data_version
            self.live.body_digest = self.who.body_digest
        else:
            log.info("broker_dropped_while_registering", broker=name, addr=self.who.broker_addr,
                     stored=self.stored)
        self.result = table._answer(name, self.who.broker_id)
        return True

    def finish(self) -> Registration:
        """Run the registration to its end at once (nothing may run between its steps)."""
        while not self.step(len(self.queues) + 1):
            pass
        assert self.result is not None
        return self.result


class RouteTable:
    """The tables, their indexes and their bounds (``limits``, the defaults unless given)."""

    def __init__(self, limits: RouteLimits | None = None) -> None:
        self.limits = RouteLimits() if limits is None else limits
        self.brokers: dict[str, BrokerData] = {}  # broker name ->
        self.clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self.served: dict[str, dict[str, QueueData]] = {}  # broker name -> topic ->
        self.live: dict[str, BrokerLive] = {}  # broker addr ->
        self.kv: dict[str, dict[str, str]] = {}  # namespace -> key -> value
        # The indexes: each is the inverse of a table above, kept with it.
        self.topics: dict[str, dict[str, None]] = {}
        """Topic -> the broker names with queue data of it, as keys (``served`` inverted)."""
        self.slots: dict[str, set[tuple[str, int]]] = {}
        """Broker address -> the (broker name, id) slots of ``brokers`` holding it."""
        self.listed: dict[str, set[str]] = {}
        """Broker name -> the clusters listing it (``clusters`` inverted)."""
        self.leaving: dict[str, None] = {}
        """Broker names whose last address went while their queue data are still being
        dropped, a step at a time (:meth:`step_leaving`), in the order they went.  No lookup
        names them (they have no broker data, and :meth:`queues` passes them over), and a
        registration finishes dropping them before it is admitted."""
        # The tables' sizes, counted as they change, for the bounds.
        self.slot_count = 0
        self.listing_count = 0
        self.queue_count = 0
        self.kv_count = 0
        self.listing_version = 0
        """Moves on whenever a topic list could change (a topic served or no longer, a broker
        listed in a cluster or no longer): answers built from them are kept until it does."""
        # What registrations cost, for metrics: each one not refused is one or the other.
        self.applied = 0
        """Registrations admitted to apply their table (:meth:`start_register`)."""
        self.heartbeats = 0
        """Registrations that only refreshed a broker (:meth:`refresh`)."""

    # --- brokers --------------------------------------------------------------------------

    def register(
        self, *, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
        ha_server_addr: str, topics: Iterable[TopicConfig], now_ms: int,
        channel: object = None, data_version: DataVersion | None = None,
    ) -> Registration:
        """Apply a registration whole, or raise :class:`TableFull` having applied none of it.
        A heartbeat of an unchanged table (``data_version``) only refreshes the broker."""
        who = Registrant(cluster=cluster, broker_name=broker_name, broker_addr=broker_addr,
                         broker_id=broker_id, ha_server_addr=ha_server_addr, now_ms=now_ms,
                         channel=channel, data_version=data_version)
        heartbeat = self.refresh(who)
        if heartbeat is not None:
            return heartbeat
        return self.start_register(who, queue_table(broker_name, broker_id, topics)).finish()

    def refresh(self, who: Registrant) -> Registration | None:
        """Answer a registration that changes nothing but the broker's liveness, at a cost
        that does not grow with its table; None when it must be applied (:meth:`start_register`).

        That is Java's rule: a table whose DataVersion is the one last applied for the address
        is not read again.  A body the same as the last one applied or refreshed for the
        address (its digest) is not read either: that is told before it is decoded, which for
        a million topics is most of ten seconds of a worker's CPU every 30 s heartbeat.  Here
        the address must also be live and hold the same slot (broker name and id) in the same
        cluster: a broker that moved, or came back after it was dropped, is applied whole.  A
        topic deleted here since (:meth:`delete_topic`) stays deleted until the broker's table
        changes, as in Java."""
        live = self.live.get(who.broker_addr)
        data = self.brokers.get(who.broker_name)
        if (live is None
                or not ((live.data_version is not None
                         and live.data_version == who.data_version)
                        or (who.body_digest is not None
                            and live.body_digest == who.body_digest))
                or data is None or data.addrs.get(who.broker_id) != who.broker_addr
                or who.cluster not in self.listed[who.broker_name]):
            return None
        live.last_update_ms, live.ha_server_addr, live.channel = (
            who.now_ms, who.ha_server_addr, who.channel)
        if who.body_digest is not None:  # the same table as sent now: its next copy is too
            live.body_digest = who.body_digest
        self.heartbeats += 1
        return self._answer(who.broker_name, who.broker_id)

    def start_register(self, who: Registrant, queues: dict[str, QueueData]) -> Registering:
        """Begin a registration of the queue data ``queues`` (:func:`queue_table`), to be
        carried on by :meth:`Registering.step`; one at a time."""
        return Registering(self, who, queues)

    def _admit(self, who: Registrant, new_queues: int) -> BrokerLive:
        """Place a registering broker, its topics left to store, or raise :class:`TableFull`
        if what it adds, ``new_queues`` topic queues with it, would pass a bound."""
        name, addr, broker_id = who.broker_name, who.broker_addr, who.broker_id
        data = self.brokers.get(name)
        moved = [i for n, i in self.slots.get(addr, ()) if n == name and i != broker_id]
        self._check_addresses(
            live=addr not in self.live,
            slots=(data is None or broker_id not in data.addrs) - len(moved),
            listings=who.cluster not in self.listed.get(name, ()))
        if self.queue_count + new_queues > self.limits.max_topic_queues:
            raise TableFull(MAX_TOPIC_QUEUES, self.limits.max_topic_queues,
                            f"the name server holds {self.queue_count} topic queues and "
                            f"{name}'s registration adds {new_queues}, past its most, "
                            f"{self.limits.max_topic_queues} ({MAX_TOPIC_QUEUES})")

        listing = self.listed.setdefault(name, set())
        if who.cluster not in listing:
            listing.add(who.cluster)
            self.clusters.setdefault(who.cluster, set()).add(name)
            self.listing_count += 1
            self.listing_version += 1
        if data is None:
            data = self.brokers[name] = BrokerData(who.cluster, name)
        for other_id in moved:  # a slave became master (or back)
            self._unplace(data, other_id)
        first = addr not in self.live
        self._place(data, broker_id, addr)
        live = self.live[addr] = BrokerLive(who.now_ms, who.ha_server_addr, who.channel)
        self.applied += 1
        if first:
            log.info("broker_registered", cluster=who.cluster, broker=name, id=broker_id,
                     addr=addr)
        return live

    def _serve(self, broker_name: str, queues: dict[str, QueueData]) -> None:
        """Store ``broker_name``'s queue data of some topics (at least one).  It makes no
        object a topic that the cycle collector keeps tracking (see the module's docstring):
        a (topic, queue data) pair a topic, living only a step, still set off a full
        collection every few steps."""
        served = self.served.setdefault(broker_name, {})
        added = [topic for topic in queues if topic not in served]
        served.update(queues)
        topics = self.topics
        for topic in added:
            names = topics.get(topic)
            if names is None:
                topics[topic] = {broker_name: None}
            else:
                names[broker_name] = None
        if added:
            self.queue_count += len(added)
            self.listing_version += 1

    def _answer(self, broker_name: str, broker_id: int) -> Registration:
        data = self.brokers.get(broker_name)
        master = None if data is None else data.addrs.get(MASTER_ID)
        if broker_id != MASTER_ID and master is not None and master in self.live:
            return Registration(master, self.live[master].ha_server_addr, self.order_topics())
        return Registration(None, None, self.order_topics())

    def unregister(self, *, cluster: str, broker_name: str, broker_addr: str,
                   broker_id: int, most: int | None = None) -> None:
        """Drop the broker at ``broker_addr`` with every slot the address holds.  Java's name
        server drops only the slot the request names, and the address's live entry whatever
        the name and id: a slot under another name or id stays, no longer live, so never
        expired.  Under bounds such slots would fill the table for good (a client could
        register addresses and unregister them under a wrong id until no broker could
        register), and a route would name an address that left.

        A broker name left without addresses leaves its queue data: all of them now, or (with
        ``most``, as for :meth:`expire` and :meth:`channel_closed`) at most ``most`` topics
        now and the rest to :meth:`step_leaving`."""
        if broker_addr not in self.live and broker_addr not in self.slots:
            return
        self._drop_addr(broker_addr)
        self._leave(most)
        log.info("broker_unregistered", cluster=cluster, broker=broker_name, id=broker_id,
                 addr=broker_addr)

    def expire(self, now_ms: int, max_silence_ms: int = BROKER_EXPIRED_MS,
               most: int | None = None) -> list[str]:
        """Drop brokers whose last registration is older than ``max_silence_ms``."""
        gone = [a for a, live in self.live.items() if now_ms - live.last_update_ms > max_silence_ms]
        for addr in gone:
            self._drop_addr(addr)
            log.warning("broker_expired", addr=addr)
        self._leave(most)
        return gone

    def channel_closed(self, channel: object, most: int | None = None) -> list[str]:
        gone = [a for a, live in self.live.items() if live.channel is channel]
        for addr in gone:
            self._drop_addr(addr)
        self._leave(most)
        return gone

    def step_leaving(self, most: int) -> bool:
        """Drop up to ``most`` topics (at least 1) of the :attr:`leaving` broker names, the
        first gone first; True once none is left."""
        for name in list(self.leaving):
            topics = list(islice(self.served[name], most))
            for topic in topics:
                self._unserve(topic, name)
            most -= len(topics)
            if name in self.served:
                return False
        return True

    def _leave(self, most: int | None) -> None:
        """Drop the leaving queue data: all, or up to ``most`` topics of them."""
        self.step_leaving(self.queue_count + 1 if most is None else most)

    def _drop_addr(self, addr: str) -> None:
        self.live.pop(addr, None)
        for broker_name, broker_id in sorted(self.slots.get(addr, ())):
            self._drop(broker_name, broker_id)

    def _drop(self, broker_name: str, broker_id: int) -> None:
        """Remove one address; a broker name left without addresses takes the clusters left
        empty with it, and is left to take its queue data and the topics left without
        queue data (:attr:`leaving`)."""
        data = self.brokers[broker_name]
        self._unplace(data, broker_id)
        if data.addrs:
            return
        del self.brokers[broker_name]
        for cluster in self.listed.pop(broker_name):
            names = self.clusters[cluster]
            names.remove(broker_name)
            self.listing_count -= 1
            self.listing_version += 1
            if not names:
                del self.clusters[cluster]
        if broker_name in self.served:  # its topics go after (step_leaving), till none is left
            self.leaving[broker_name] = None

    def _place(self, data: BrokerData, broker_id: int, addr: str) -> None:
        """Put ``addr`` in slot ``broker_id`` of ``data``, in place of what held it."""
        old = data.addrs.get(broker_id)
        if old == addr:
            return
        if old is None:
            self.slot_count += 1
        else:
            self._forget_slot(old, (data.broker_name, broker_id))
        data.addrs[broker_id] = addr
        self.slots.setdefault(addr, set()).add((data.broker_name, broker_id))

    def _unplace(self, data: BrokerData, broker_id: int) -> None:
        self._forget_slot(data.addrs.pop(broker_id), (data.broker_name, broker_id))
        self.slot_count -= 1

    def _forget_slot(self, addr: str, slot: tuple[str, int]) -> None:
        slots = self.slots[addr]
        slots.remove(slot)
        if not slots:
            del self.slots[addr]

    def _unserve(self, topic: str, broker_name: str) -> None:
        """Remove ``broker_name``'s queue data of ``topic``, and the topic if none is left."""
        served = self.served[broker_name]
        del served[topic]
        if not served:
            del self.served[broker_name]
            self.leaving.pop(broker_name, None)  # left whole
        names = self.topics[topic]
        del names[broker_name]
        if not names:
            del self.topics[topic]
        self.queue_count -= 1
        self.listing_version += 1

    def _check_addresses(self, *, live: bool, slots: int, listings: bool) -> None:
        """Raise :class:`TableFull` unless each broker table has room for what a registration
        adds to it: a new address, a net new (name, id) slot, a new (cluster, name) listing."""
        most = self.limits.max_broker_addresses
        if (len(self.live) + live > most or self.slot_count + slots > most
                or self.listing_count + listings > most):
            raise TableFull(MAX_BROKER_ADDRESSES, most,
                            f"the name server holds {most} broker addresses, its most "
                            f"({MAX_BROKER_ADDRESSES})")

    # --- lookups ----------------------------------------------------------------------------

    def queues(self, topic: str) -> dict[str, QueueData]:
        """``topic``'s queue data by broker name, in name order; none for an unknown topic."""
        return {name: self.served[name][topic] for name in sorted(self.topics.get(topic, ()))
                if name not in self.leaving}

    def route(self, topic: str) -> dict[str, object] | None:
        """TopicRouteData for ``topic``; None unless it has queue data and a broker."""
        queues = self.queues(topic)
        brokers = [self.brokers[name] for name in queues if name in self.brokers]
        if not brokers:
            return None
        route: dict[str, object] = {
            "brokerDatas": [b.to_json() for b in brokers],
            "filterServerTable": {},
            "queueDatas": [queue.to_json() for queue in queues.values()],
        }
        order_conf = self.kv.get(ORDER_TOPIC_CONFIG, {}).get(topic)
        if order_conf:
            route["orderTopicConf"] = order_conf
        return route

    def cluster_info(self) -> dict[str, object]:
        return {
            "brokerAddrTable": {n: b.to_json() for n, b in sorted(self.brokers.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.clusters.items())},
        }

    def topic_list(self) -> list[str]:
        return sorted(self.topic_names())

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """Topics with queues on a broker of ``cluster`` (none for an unknown cluster)."""
        return sorted(self.topic_names(cluster))

    def topic_names(self, cluster: str | None = None) -> list[str]:
        """The topics (of ``cluster``'s brokers), unsorted: a copy to sort elsewhere."""
        if cluster is None:
            return list(self.topics)
        names = self.clusters.get(cluster, set())
        return list(set().union(*(self.served.get(name, ()) for name in names)))

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """Drop ``topic``'s queue data: all of it, or that of ``cluster``'s brokers.  A broker
        that still has the topic serves it again only once its table changes: its heartbeats
        of the same DataVersion are not applied (:meth:`refresh`), as in Java."""
        names = set(self.topics.get(topic, ()))
        if cluster is not None:
            names &= self.clusters.get(cluster, set())
        for name in names:
            self._unserve(topic, name)

    # --- KV config ----------------------------------------------------------------------------

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        """Set one entry, or raise :class:`TableFull` having set nothing."""
        # surrogatepass: a JSON header may carry a lone surrogate, which is no error here
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in (namespace, key, value))
        if size > self.limits.max_kv_bytes:
            raise TableFull(MAX_KV_BYTES, self.limits.max_kv_bytes,
                            f"a KV config entry of {size} bytes (namespace, key and value) is "
                            f"past the most, {self.limits.max_kv_bytes} ({MAX_KV_BYTES})")
        table = self.kv.get(namespace)
        # An empty namespace already counts as one entry: its first key takes that place.
        grows = table is None or (bool(table) and key not in table)
        if grows and self.kv_count >= self.limits.max_kv_entries:
            raise TableFull(MAX_KV_ENTRIES, self.limits.max_kv_entries,
                            f"the name server holds {self.limits.max_kv_entries} KV config "
                            f"entries, its most ({MAX_KV_ENTRIES})")
        self.kv.setdefault(namespace, {})[key] = value
        self.kv_count += grows

    def get_kv(self, namespace: str, key: str) -> str | None:
        return self.kv.get(namespace, {}).get(key)

    def delete_kv(self, namespace: str, key: str) -> None:
        """Delete one entry; a namespace left empty stays (its list is then empty, as in
        RocketMQ) and counts as one entry."""
        table = self.kv.get(namespace, {})
        if table.pop(key, None) is not None and table:
            self.kv_count -= 1

    def kv_list(self, namespace: str) -> Mapping[str, str] | None:
        return self.kv.get(namespace)

    def order_topics(self) -> dict[str, str]:
        return dict(self.kv.get(ORDER_TOPIC_CONFIG, {}))
