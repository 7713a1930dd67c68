"""Which member of a consumer group consumes which queues of a topic.

RocketMQ has no coordinator: every member asks a broker for the group's client ids, sorts ids
and queues, and runs the group's strategy with itself as the current id.  The members agree
only because they compute from the same sorted inputs with the same algorithm, so the
strategies here reproduce the Java client's, under the names its ``getName()`` returns, and
sort as Java sorts (strings by UTF-16 code unit).  A group may then mix Java, C++ and evq
clients without two of them claiming one queue.

Each strategy gives every queue to exactly one member as long as the id list holds each id
once (and, for CONFIG and MACHINE_ROOM, the configuration covers every queue).  Seed 003 is
what happens otherwise: two processes started with the same instance name share a client id,
both find the same index in the list, take the same queues, and the share of the index they
shadow goes to nobody.  :func:`allocate` refuses such a list with :class:`DuplicateClientIds`,
and :func:`check_allocation` shows what a list would do to the group as a whole.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from evq import logs
from evq.domain.queues import MessageQueue

log = logs.get_logger(__name__)

ROOM_SEPARATOR = "@"
NEARBY_PREFIX = "MACHINE_ROOM_NEARBY"


class AllocationError(ValueError):
    """Input no strategy can allocate from (no queues, no ids, unknown strategy, ...)."""


class UnknownStrategy(AllocationError):
    """A strategy name that is not in :data:`STRATEGIES`."""


class DuplicateClientIds(AllocationError):
    """The id list names some member more than once.

    Raised rather than flagged: with a repeated id the index of every later member shifts, so
    no member's share is right, and an exception cannot be ignored by accident the way a flag
    on a list can.  The caller logs it and keeps its current queues for this round, or, having
    decided the twins are one process seen twice, allocates again over :attr:`distinct_ids`
    (the twins then still share one share, but no queue is left without a consumer).
    """

    def __init__(self, group: str, duplicates: Mapping[str, int], distinct_ids: list[str]):
        self.group = group
        self.duplicates = dict(duplicates)
        self.distinct_ids = distinct_ids
        listed = ", ".join(f"{cid!r} x{n}" for cid, n in self.duplicates.items())
        super().__init__(
            f"consumer group {group!r}: client ids used by several members: {listed}; "
            "give each consumer process its own instance name"
        )


def java_order(s: str) -> bytes:
    """A sort key that orders strings as Java's ``String.compareTo`` does.

    Big-endian UTF-16 bytes compare exactly as the code units they encode, shorter prefix first.
    """
    return s.encode("utf-16-be", "surrogatepass")


def queue_order(q: MessageQueue) -> tuple[bytes, bytes, int]:
    """Java's ``MessageQueue.compareTo``: topic, broker name, queue id."""
    return java_order(q.topic), java_order(q.broker_name), q.queue_id


class AllocateStrategy(Protocol):
    """One allocation algorithm.

    :meth:`assign` receives what :func:`allocate` has checked: both lists non-empty and sorted
    as RocketMQ sorts them, ``current_id`` a member of ``ids``.
    """

    @property
    def name(self) -> str: ...

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]: ...


@attrs.frozen(slots=True)
class Averagely:
    """Consecutive runs of queues, the first ``len(queues) % len(ids)`` members one longer.

    The default of every RocketMQ client, and the one both C++ and ali-ons clients hard-code.
    """

    @property
    def name(self) -> str:
        return "AVG"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        index = ids.index(current_id)
        extra = len(queues) % len(ids)
        size = len(queues) // len(ids) + int(index < extra) if len(queues) > len(ids) else 1
        start = index * size + (0 if index < extra else extra)
        return list(queues[start : start + size])


@attrs.frozen(slots=True)
class AveragelyByCircle:
    """Queues dealt round-robin: member ``i`` takes queues ``i``, ``i + n``, ``i + 2n`` ..."""

    @property
    def name(self) -> str:
        return "AVG_BY_CIRCLE"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        return list(queues[ids.index(current_id) :: len(ids)])


def _md5_point(key: str) -> int:
    """Ring position: the first four MD5 bytes, big-endian, unsigned (RocketMQ's MD5Hash).

    Java hashes ``key.getBytes()`` in the platform charset, UTF-8 on any current JVM, and puts
    ``?`` for what it cannot encode, as the ``replace`` handler does.
    """
    digest = hashlib.md5(key.encode("utf-8", "replace"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


def _ring_key(q: MessageQueue) -> str:
    """The queue as Java's ``MessageQueue.toString()`` prints it: the hashed routing key."""
    return f"MessageQueue [topic={q.topic}, brokerName={q.broker_name}, queueId={q.queue_id}]"


@attrs.frozen(slots=True)
class ConsistentHash:
    """Members on an MD5 hash ring, ``virtual_nodes`` points each (``"<id>-<n>"``); a queue
    goes to the first point at or after its own hash, wrapping around.

    When a member leaves, only its queues move; when one joins, it only takes queues from
    others.  The price is an uneven split with few members or points.
    """

    virtual_nodes: int = 10

    def __attrs_post_init__(self) -> None:
        if self.virtual_nodes < 1:
            raise AllocationError(f"virtual_nodes must be at least 1, not {self.virtual_nodes}")

    @property
    def name(self) -> str:
        return "CONSISTENT_HASH"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        ring: dict[int, str] = {}
        added: Counter[str] = Counter()
        for cid in ids:
            # A repeated id gets further points numbered after its first ones, as Java's
            # router counts a node's existing replicas; a later point wins a hash collision.
            first = added[cid] * self.virtual_nodes
            added[cid] += 1
            for n in range(first, first + self.virtual_nodes):
                ring[_md5_point(f"{cid}-{n}")] = cid
        points = sorted(ring)
        owners = [ring[p] for p in points]
        return [
            q
            for q in queues
            if owners[bisect_left(points, _md5_point(_ring_key(q))) % len(points)] == current_id
        ]


def _freeze_table(
    table: Mapping[str, Iterable[MessageQueue]],
) -> Mapping[str, frozenset[MessageQueue]]:
    return MappingProxyType({cid: frozenset(qs) for cid, qs in table.items()})


@attrs.frozen(slots=True)
class ByConfig:
    """A fixed table of which member takes which queues.

    RocketMQ configures each consumer process with its own list; the table holds the lists of
    the whole group so one object can be checked for holes and overlaps.  Configured queues the
    topic no longer has are dropped (Java hands them back regardless).
    """

    queues_by_id: Mapping[str, frozenset[MessageQueue]] = attrs.field(converter=_freeze_table)

    @property
    def name(self) -> str:
        return "CONFIG"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        mine = self.queues_by_id.get(current_id, frozenset())
        return [q for q in queues if q in mine]


def broker_room(broker_name: str) -> str | None:
    """The machine room of a broker named ``<room>@<name>``; None for any other shape.

    Java's test is ``brokerName.split("@").length == 2``; split drops trailing empty parts.
    """
    parts = broker_name.rstrip(ROOM_SEPARATOR).split(ROOM_SEPARATOR)
    return parts[0] if len(parts) == 2 else None


@attrs.frozen(slots=True)
class ByMachineRoom:
    """Only the queues of brokers in ``consumer_rooms`` (``<room>@<name>``), split as evenly
    as AVG does, but each member's share taken from two places: a run of ``len // n`` queues,
    then one of the leftovers at the end.

    Queues of other rooms are nobody's here: RocketMQ leaves them to the groups deployed there.
    """

    consumer_rooms: frozenset[str] = attrs.field(converter=frozenset)

    @property
    def name(self) -> str:
        return "MACHINE_ROOM"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        index = ids.index(current_id)
        local = [q for q in queues if broker_room(q.broker_name) in self.consumer_rooms]
        per, extra = divmod(len(local), len(ids))
        mine = local[index * per : (index + 1) * per]
        if index < extra:
            mine.append(local[per * len(ids) + index])
        return mine


class RoomResolver(Protocol):
    """Where a broker and a consumer are deployed (Java's ``MachineRoomResolver``)."""

    def queue_room(self, queue: MessageQueue) -> str: ...

    def client_room(self, client_id: str) -> str: ...


@attrs.frozen(slots=True)
class RoomPrefix:
    """Rooms written in front of names: brokers ``<room>@<name>`` (as MACHINE_ROOM reads
    them), client ids ``<room>@<rest>``.  A name without a room is an error, as in Java."""

    def queue_room(self, queue: MessageQueue) -> str:
        room = broker_room(queue.broker_name)
        if not room:
            raise AllocationError(
                f"no machine room in broker name {queue.broker_name!r} (want <room>@<name>)"
            )
        return room

    def client_room(self, client_id: str) -> str:
        room, sep, _ = client_id.partition(ROOM_SEPARATOR)
        if not (sep and room):
            raise AllocationError(
                f"no machine room in client id {client_id!r} (want <room>@<rest>)"
            )
        return room


@attrs.frozen(slots=True)
class MachineRoomNearby:
    """Queues stay in their machine room when a member is deployed there.

    A room's queues are split by ``inner`` among the members in that room; the queues of rooms
    without any member are split by ``inner`` among all members.  RocketMQ 4.3+ names it
    ``MACHINE_ROOM_NEARBY-<inner name>``.
    """

    inner: AllocateStrategy = attrs.field(factory=Averagely)
    rooms: RoomResolver = attrs.field(factory=RoomPrefix)

    @property
    def name(self) -> str:
        return f"{NEARBY_PREFIX}-{self.inner.name}"

    def assign(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        queues_in: dict[str, list[MessageQueue]] = {}
        for q in queues:
            queues_in.setdefault(self.rooms.queue_room(q), []).append(q)
        members_in: dict[str, list[str]] = {}
        for cid in ids:
            members_in.setdefault(self.rooms.client_room(cid), []).append(cid)
        home = self.rooms.client_room(current_id)
        mine = []
        if home in queues_in:
            mine += self.inner.assign(group, current_id, queues_in[home], members_in[home])
        for room in sorted(queues_in, key=java_order):
            if room not in members_in:
                mine += self.inner.assign(group, current_id, queues_in[room], ids)
        return mine


STRATEGIES: Mapping[str, Callable[..., AllocateStrategy]] = MappingProxyType(
    {
        "AVG": Averagely,
        "AVG_BY_CIRCLE": AveragelyByCircle,
        "CONSISTENT_HASH": ConsistentHash,
        "CONFIG": ByConfig,
        "MACHINE_ROOM": ByMachineRoom,
        NEARBY_PREFIX: MachineRoomNearby,
    }
)
"""RocketMQ's strategy names and the classes behind them; options are constructor keywords."""


def strategy_named(name: str, **options: Any) -> AllocateStrategy:
    """The strategy RocketMQ calls ``name``, built with ``options``.

    ``MACHINE_ROOM_NEARBY-<inner>`` names its inner strategy as Java's ``getName()`` prints it,
    so ``strategy_named(s.name)`` rebuilds any strategy that needs no options.
    """
    base, dash, inner = name.partition("-")
    factory = STRATEGIES.get(base)
    if factory is None or (dash and base != NEARBY_PREFIX):
        choices = ", ".join([*STRATEGIES, f"{NEARBY_PREFIX}-<inner>"])
        raise UnknownStrategy(f"unknown allocation strategy {name!r}; choices: {choices}")
    if dash:
        options["inner"] = strategy_named(inner)
    try:
        return factory(**options)
    except TypeError as exc:
        raise AllocationError(f"allocation strategy {name}: {exc}") from None


def _repeated(ids: Iterable[str]) -> dict[str, int]:
    """Each id listed more than once, with how many times."""
    return {cid: n for cid, n in Counter(ids).items() if n > 1}


def _sorted_inputs(
    group: str, all_queues: Iterable[MessageQueue], all_ids: Iterable[str]
) -> tuple[list[MessageQueue], list[str]]:
    """Queues as a set (the Java client collects them in one) and ids as the broker listed
    them, duplicates kept, both sorted as Java sorts them."""
    queues = sorted(set(all_queues), key=queue_order)
    ids = sorted(all_ids, key=java_order)
    if not queues:
        raise AllocationError(f"consumer group {group!r}: no queues to allocate")
    if not ids:
        raise AllocationError(f"consumer group {group!r}: no client ids to allocate to")
    return queues, ids


def _resolve(strategy: AllocateStrategy | str) -> AllocateStrategy:
    return strategy_named(strategy) if isinstance(strategy, str) else strategy


def allocate(
    strategy: AllocateStrategy | str,
    group: str,
    current_id: str,
    all_queues: Iterable[MessageQueue],
    all_ids: Iterable[str],
) -> list[MessageQueue]:
    """The queues ``current_id`` should consume.

    Raises :class:`AllocationError` for an empty id, queue or id list and
    :class:`DuplicateClientIds` when an id repeats.  A current id missing from the list (a
    consumer whose first heartbeat has not reached the broker) gets nothing, as in Java.
    """
    chosen = _resolve(strategy)
    if not current_id:
        raise AllocationError(f"consumer group {group!r}: current client id is empty")
    queues, ids = _sorted_inputs(group, all_queues, all_ids)
    repeated = _repeated(ids)
    if repeated:
        raise DuplicateClientIds(group, repeated, sorted(set(ids), key=java_order))
    if current_id not in ids:
        log.info("rebalance_not_a_member", group=group, client_id=current_id, ids=ids)
        return []
    return chosen.assign(group, current_id, queues, ids)


@attrs.frozen(slots=True)
class AllocationReport:
    """What every member of a group would take, computed as each member computes it.

    ``assignments`` has one entry per distinct id (members sharing an id take the same
    queues); ``shared`` maps each queue taken by more than one member to those members' ids,
    repeated once per member; ``unassigned`` lists the queues nobody takes.
    """

    assignments: Mapping[str, tuple[MessageQueue, ...]]
    duplicate_ids: Mapping[str, int]
    shared: Mapping[MessageQueue, tuple[str, ...]]
    unassigned: tuple[MessageQueue, ...]

    @property
    def ok(self) -> bool:
        """Every queue has exactly one consumer."""
        return not (self.duplicate_ids or self.shared or self.unassigned)


def check_allocation(
    strategy: AllocateStrategy | str,
    group: str,
    all_queues: Iterable[MessageQueue],
    all_ids: Iterable[str],
) -> AllocationReport:
    """Run ``strategy`` for every member of ``all_ids``, duplicates included, and report how
    the queues end up: the broker can log what a duplicated id costs, admin tools can show a
    group's split, tests can check a strategy partitions."""
    chosen = _resolve(strategy)
    queues, ids = _sorted_inputs(group, all_queues, all_ids)
    assignments = {cid: tuple(chosen.assign(group, cid, queues, ids)) for cid in dict.fromkeys(ids)}
    takers: dict[MessageQueue, list[str]] = {}
    for cid in ids:
        for q in assignments[cid]:
            takers.setdefault(q, []).append(cid)
    return AllocationReport(
        assignments=MappingProxyType(assignments),
        duplicate_ids=MappingProxyType(_repeated(ids)),
        shared=MappingProxyType({q: tuple(t) for q, t in takers.items() if len(t) > 1}),
        unassigned=tuple(q for q in queues if q not in takers),
    )
