"""The broker's tables of live clients: which connections belong to which consumer and
producer groups.

Entries are kept per connection, as RocketMQ keeps them per channel, not per client id.  Two
processes that share a client id (seed 003: same host, same instance name) are therefore two
entries, and the group's id list names that id twice.  The broker must answer the list that
way, since clients run the allocation themselves and a Java broker would; what evq adds is
:meth:`GroupMembership.duplicate_ids` and a warning when an id first becomes shared, so an
operator learns why some queues have two consumers and others none.

Pure: a connection is any hashable key the network layer chooses, time is the injected clock,
and every call that can change a consumer group's id list returns the names of the groups it
changed, for the caller to send NOTIFY_CONSUMER_IDS_CHANGED to their remaining connections
(when the group's ``notifyConsumerIdsChangedEnable`` allows).  Channel expiry is a scan the
server runs every :data:`SCAN_INTERVAL_S`; it returns the connections to close.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType

import attrs

from evq import logs
from evq.domain.clock import SYSTEM_CLOCK, Clock

log = logs.get_logger(__name__)

CHANNEL_EXPIRY_MS = 120_000
"""A connection not heard from for longer than this is dropped (clients beat every 30 s)."""
SCAN_INTERVAL_S = 10.0
"""How often the server should call :meth:`GroupMembership.scan_expired`."""

Connection = Hashable


class MembershipError(ValueError):
    """A heartbeat the tables cannot hold."""


def _freeze(subscriptions: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(subscriptions))


@attrs.frozen(slots=True)
class ConsumerData:
    """One consumer group as a heartbeat declares it.  The values are the strings the network
    layer normalises the clients' enums to; subscriptions are opaque here, keyed by topic."""

    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: Mapping[str, object] = attrs.field(factory=dict, converter=_freeze)


@attrs.frozen(slots=True)
class Heartbeat:
    """A client's HEART_BEAT: its id and every group it takes part in."""

    client_id: str
    consumers: tuple[ConsumerData, ...] = attrs.field(default=(), converter=tuple)
    producer_groups: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen(slots=True)
class Member:
    """One connection's entry in a group."""

    connection: Connection
    client_id: str
    last_seen_ms: int


@attrs.frozen(slots=True)
class ConsumerGroupInfo:
    """A consumer group as the latest heartbeat described it, and its members in the order
    they joined."""

    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: Mapping[str, object]
    members: tuple[Member, ...]


@attrs.frozen(slots=True)
class Expired:
    """What a scan dropped: connections with nothing live left (to close) and the consumer
    groups whose id lists changed."""

    connections: frozenset[Connection]
    groups: frozenset[str]


@attrs.define(slots=True)
class _ConsumerGroup:
    data: ConsumerData
    members: dict[Connection, Member] = attrs.field(factory=dict)


class GroupMembership:
    """Consumer and producer group tables, thread-safe behind one mutex.

    Like RocketMQ, a consumer group keeps the consume type, message model and subscriptions of
    the latest heartbeat, whoever sent it; a subscription set that gains or loses a topic counts
    as a change, as a new member does.
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, expiry_ms: int = CHANNEL_EXPIRY_MS):
        self._clock = clock
        self._expiry_ms = expiry_ms
        self._mutex = threading.Lock()
        self._consumers: dict[str, _ConsumerGroup] = {}
        self._producers: dict[str, dict[Connection, Member]] = {}
        self._turns: Counter[str] = Counter()
        self._warned: set[tuple[str, str]] = set()

    # --- registration ---------------------------------------------------------------------

    def heartbeat(self, connection: Connection, beat: Heartbeat) -> frozenset[str]:
        """Register or refresh ``connection`` in every group of ``beat``; returns the consumer
        groups whose members or subscribed topics changed.

        An empty client id is refused: no member could find itself in the id list.
        """
        if not beat.client_id:
            raise MembershipError("heartbeat without a client id")
        with self._mutex:
            member = Member(connection, beat.client_id, self._clock.now_ms())
            changed = {d.group for d in beat.consumers if self._register_consumer(member, d)}
            for group in beat.producer_groups:
                self._producers.setdefault(group, {})[connection] = member
        return frozenset(changed)

    def _register_consumer(self, member: Member, data: ConsumerData) -> bool:
        entry = self._consumers.get(data.group)
        if entry is None:
            entry = self._consumers[data.group] = _ConsumerGroup(data)
        topics_changed = entry.data.subscriptions.keys() != data.subscriptions.keys()
        entry.data = data
        previous = entry.members.get(member.connection)
        entry.members[member.connection] = member
        if previous is None:
            log.info("consumer_connected", group=data.group, client_id=member.client_id)
        elif previous.client_id != member.client_id:
            log.warning(
                "consumer_connection_changed_client_id", group=data.group,
                old=previous.client_id, new=member.client_id,
            )
            self._forget_resolved(data.group, entry)
        self._warn_if_shared(data.group, entry, member.client_id)
        return topics_changed or previous is None or previous.client_id != member.client_id

    def _warn_if_shared(self, group: str, entry: _ConsumerGroup, client_id: str) -> None:
        holders = [m.connection for m in entry.members.values() if m.client_id == client_id]
        if len(holders) > 1 and (group, client_id) not in self._warned:
            self._warned.add((group, client_id))
            log.warning(
                "consumer_client_id_duplicated", group=group, client_id=client_id,
                connections=len(holders),
                hint="queues allocated to this id go to every holder, another share to nobody",
            )

    def unregister(
        self,
        connection: Connection,
        *,
        consumer_group: str | None = None,
        producer_group: str | None = None,
    ) -> frozenset[str]:
        """UNREGISTER_CLIENT: drop ``connection`` from the named groups (a client shutting
        down); returns the consumer groups that changed."""
        with self._mutex:
            if producer_group:
                self._drop_producer(producer_group, connection)
            if consumer_group and self._drop_consumer(consumer_group, connection):
                return frozenset((consumer_group,))
        return frozenset()

    def connection_closed(self, connection: Connection) -> frozenset[str]:
        """Drop ``connection`` from every group; returns the consumer groups that changed."""
        with self._mutex:
            for group in list(self._producers):
                self._drop_producer(group, connection)
            return frozenset(g for g in list(self._consumers) if self._drop_consumer(g, connection))

    def scan_expired(self) -> Expired:
        """Drop every entry not refreshed for longer than the expiry time.

        RocketMQ closes a channel when any of its entries expires; here only connections left
        with no live entry are returned for closing, so a client that stopped beating for one
        group keeps its connection for the others.
        """
        with self._mutex:
            deadline = self._clock.now_ms() - self._expiry_ms
            stale: set[Connection] = set()
            groups: set[str] = set()
            for group, entry in list(self._consumers.items()):
                for m in self._silent(entry.members.values(), deadline):
                    stale.add(m.connection)
                    groups.add(group)
                    self._drop_consumer(group, m.connection)
            for group, members in list(self._producers.items()):
                for m in self._silent(members.values(), deadline):
                    stale.add(m.connection)
                    self._drop_producer(group, m.connection)
            closing = frozenset(stale - self._live_connections())
        if closing or groups:
            log.warning(
                "client_connections_expired", connections=len(closing), groups=sorted(groups)
            )
        return Expired(closing, frozenset(groups))

    @staticmethod
    def _silent(members: Iterable[Member], deadline: int) -> list[Member]:
        return [m for m in members if m.last_seen_ms < deadline]

    def _live_connections(self) -> set[Connection]:
        live = {c for e in self._consumers.values() for c in e.members}
        live.update(c for members in self._producers.values() for c in members)
        return live

    def _drop_consumer(self, group: str, connection: Connection) -> bool:
        entry = self._consumers.get(group)
        if entry is None or entry.members.pop(connection, None) is None:
            return False
        if not entry.members:
            del self._consumers[group]
        self._forget_resolved(group, entry)
        return True

    def _forget_resolved(self, group: str, entry: _ConsumerGroup) -> None:
        """Re-arm the duplicate warning for ids of ``group`` no longer shared."""
        counts = Counter(m.client_id for m in entry.members.values())
        self._warned = {(g, cid) for g, cid in self._warned if g != group or counts[cid] > 1}

    def _drop_producer(self, group: str, connection: Connection) -> None:
        members = self._producers.get(group)
        if members is not None and members.pop(connection, None) is not None and not members:
            del self._producers[group]
            self._turns.pop(group, None)

    # --- queries --------------------------------------------------------------------------

    def consumer_group(self, group: str) -> ConsumerGroupInfo | None:
        with self._mutex:
            entry = self._consumers.get(group)
            if entry is None:
                return None
            d = entry.data
            return ConsumerGroupInfo(
                group, d.consume_type, d.message_model, d.consume_from_where, d.subscriptions,
                tuple(entry.members.values()),
            )

    def subscription(self, group: str, topic: str) -> object | None:
        """The group's subscription to ``topic`` (what a pull filters by), None if none."""
        with self._mutex:
            entry = self._consumers.get(group)
            return None if entry is None else entry.data.subscriptions.get(topic)

    def client_ids(self, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: one id per connection, a shared id as often as it is
        connected, as a Java broker answers."""
        with self._mutex:
            entry = self._consumers.get(group)
            return [] if entry is None else [m.client_id for m in entry.members.values()]

    def duplicate_ids(self, group: str) -> dict[str, int]:
        """The ids of ``group`` held by several connections, with how many."""
        counts = Counter(self.client_ids(group))
        return {cid: n for cid, n in counts.items() if n > 1}

    def producer_connection(self, group: str) -> Connection | None:
        """A live connection of producer ``group`` to ask about a transaction, taking each
        in turn so check-backs spread over the group's producers; None if there is none."""
        with self._mutex:
            deadline = self._clock.now_ms() - self._expiry_ms
            members = self._producers.get(group, {}).values()
            live = [m.connection for m in members if m.last_seen_ms >= deadline]
            if not live:
                return None
            turn = self._turns[group]
            self._turns[group] = turn + 1
            return live[turn % len(live)]
