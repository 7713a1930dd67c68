"""Broker metadata as events in the log, and the projection that applies them.

Tenet 1: topic and group configs, consumer-offset snapshots and the progress of the delay and
timer services are records of the system topic :data:`~evq.domain.topics.META_TOPIC` (one
queue, tag = event kind, JSON body).  :class:`MetadataState` applies them; applying an event
also yields the row-level :class:`Change` list a :class:`MetadataStore` writes together with its
watermark (the next META_TOPIC queue offset to apply), so a store never re-implements the
projection rules.  A slave replaying the replicated log runs the same code.
"""

from __future__ import annotations

import abc
import enum
import json
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from evq.domain.config_json import from_json, to_json
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.topics import TopicConfig

OffsetKey = tuple[str, str, int]
"""(group, topic, queue id)."""


class EventKind(enum.Enum):
    TOPIC_PUT = "topic.put"
    TOPIC_DELETE = "topic.delete"
    GROUP_PUT = "group.put"
    GROUP_DELETE = "group.delete"
    OFFSETS = "offsets"
    PROGRESS = "progress"


@attrs.frozen(slots=True)
class MetaEvent:
    kind: EventKind
    data: dict[str, object]

    def body(self) -> bytes:
        return json.dumps(self.data, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, tag: str | None, body: bytes) -> MetaEvent:
        """Raises ValueError for records that are not metadata events."""
        try:
            kind = EventKind(tag)
            data = json.loads(body)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a metadata event: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("a metadata event body is a JSON object")
        return cls(kind, data)


def topic_put(config: TopicConfig) -> MetaEvent:
    return MetaEvent(EventKind.TOPIC_PUT, to_json(config))


def topic_delete(topic: str) -> MetaEvent:
    return MetaEvent(EventKind.TOPIC_DELETE, {"topicName": topic})


def group_put(config: SubscriptionGroupConfig) -> MetaEvent:
    return MetaEvent(EventKind.GROUP_PUT, to_json(config))


def group_delete(group: str) -> MetaEvent:
    return MetaEvent(EventKind.GROUP_DELETE, {"groupName": group})


OFFSETS_RECORD_BODY: Final = 1024 * 1024
"""Most bytes of JSON one offsets record carries: a quarter of the 4 MiB record limit, so a
snapshot of any size is stored as several records rather than refused."""


def offsets_snapshot(offsets: Iterable[tuple[OffsetKey, int]]) -> MetaEvent:
    return MetaEvent(EventKind.OFFSETS,
                     {"offsets": [[g, t, q, o] for (g, t, q), o in offsets]})


def offsets_snapshots(offsets: Sequence[tuple[OffsetKey, int]],
                      max_body: int = OFFSETS_RECORD_BODY) -> list[MetaEvent]:
    """``offsets`` as events whose bodies stay under ``max_body`` bytes each.

    Each entry's size is measured as it will be encoded (non-ASCII names escape to several
    bytes).  One entry larger than ``max_body`` still gets an event of its own: validated
    names keep an entry under 2 KiB, and the log refuses what is over its record limit."""
    events: list[MetaEvent] = []
    chunk: list[tuple[OffsetKey, int]] = []
    size = len(offsets_snapshot(()).body())
    used = size
    for (g, t, q), o in offsets:
        entry = len(json.dumps([g, t, q, o], separators=(",", ":"))) + 1  # and its comma
        if chunk and used + entry > max_body:
            events.append(offsets_snapshot(chunk))
            chunk, used = [], size
        chunk.append(((g, t, q), o))
        used += entry
    if chunk:
        events.append(offsets_snapshot(chunk))
    return events


def progress(service: str, value: object) -> MetaEvent:
    """Where a broker service (delay level, timer) has got to; ``value`` is JSON."""
    return MetaEvent(EventKind.PROGRESS, {"service": service, "value": value})


class Table(enum.Enum):
    TOPICS = "topics"
    GROUPS = "subscription_groups"
    OFFSETS = "consumer_offsets"
    PROGRESS = "service_progress"


@attrs.frozen(slots=True)
class Change:
    """One row to upsert (``value`` set) or delete (``value`` None) in a projection table."""

    table: Table
    key: tuple[str | int, ...]
    value: object | None


@attrs.frozen(slots=True)
class Watermark:
    """The next META_TOPIC queue offset to apply and the log offset just past the last applied."""

    queue_offset: int = 0
    physical_offset: int = 0


@attrs.define(slots=True)
class MetadataState:
    topics: dict[str, TopicConfig] = attrs.field(factory=dict)
    groups: dict[str, SubscriptionGroupConfig] = attrs.field(factory=dict)
    offsets: dict[OffsetKey, int] = attrs.field(factory=dict)
    progress: dict[str, object] = attrs.field(factory=dict)

    def apply(self, ev: MetaEvent) -> list[Change]:
        d = ev.data
        if ev.kind is EventKind.TOPIC_PUT:
            topic = from_json(TopicConfig, d)
            self.topics[topic.topic_name] = topic
            return [Change(Table.TOPICS, (topic.topic_name,), to_json(topic))]
        if ev.kind is EventKind.TOPIC_DELETE:
            name = str(d["topicName"])
            self.topics.pop(name, None)
            gone = [k for k in self.offsets if k[1] == name]
            return [Change(Table.TOPICS, (name,), None), *self._drop_offsets(gone)]
        if ev.kind is EventKind.GROUP_PUT:
            group = from_json(SubscriptionGroupConfig, d)
            self.groups[group.group_name] = group
            return [Change(Table.GROUPS, (group.group_name,), to_json(group))]
        if ev.kind is EventKind.GROUP_DELETE:
            name = str(d["groupName"])
            self.groups.pop(name, None)
            gone = [k for k in self.offsets if k[0] == name]
            return [Change(Table.GROUPS, (name,), None), *self._drop_offsets(gone)]
        if ev.kind is EventKind.OFFSETS:
            changes = []
            for g, t, q, o in d["offsets"]:  # type: ignore[attr-defined]
                key = (str(g), str(t), int(q))
                self.offsets[key] = int(o)
                changes.append(Change(Table.OFFSETS, key, int(o)))
            return changes
        service = str(d["service"])
        self.progress[service] = d["value"]
        return [Change(Table.PROGRESS, (service,), d["value"])]

    def _drop_offsets(self, keys: Sequence[OffsetKey]) -> list[Change]:
        for k in keys:
            del self.offsets[k]
        return [Change(Table.OFFSETS, k, None) for k in keys]

    @classmethod
    def from_rows(cls, rows: Iterable[Change]) -> MetadataState:
        """Rebuild the state from stored rows (what :meth:`MetadataStore.load` reads)."""
        state = cls()
        for row in rows:
            if row.table is Table.TOPICS:
                state.topics[str(row.key[0])] = from_json(TopicConfig, row.value)  # type: ignore[arg-type]
            elif row.table is Table.GROUPS:
                state.groups[str(row.key[0])] = from_json(SubscriptionGroupConfig, row.value)  # type: ignore[arg-type]
            elif row.table is Table.OFFSETS:
                g, t, q = row.key
                state.offsets[(str(g), str(t), int(q))] = int(row.value)  # type: ignore[call-overload]
            else:
                state.progress[str(row.key[0])] = row.value
        return state


class MetadataWriteError(Exception):
    """The metadata store could not take a write now (its disk is full, its server is away).

    Nothing is lost: the log holds every event, and the broker keeps the changes in memory
    and commits them with the next write that succeeds."""


class MetadataStore(abc.ABC):
    """The metadata projection's port; :mod:`evq.meta` implements it on SQLAlchemy."""

    @abc.abstractmethod
    def load(self) -> tuple[list[Change], Watermark]:
        """Every stored row (as upserts) and the watermark they are complete up to."""

    @abc.abstractmethod
    def commit(self, changes: Sequence[Change], watermark: Watermark) -> None:
        """Apply ``changes`` and move the watermark, atomically; raises
        :class:`MetadataWriteError` (having applied nothing) when the store cannot write."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop every row and the watermark, atomically: the store then rebuilds from the
        log as a deleted database does (how a replica forgets a cut-off tail's events)."""

    @abc.abstractmethod
    def close(self) -> None: ...


@attrs.define(slots=True)
class MemoryMetadataStore(MetadataStore):
    """The reference store: rows in dicts, lost with the process (tests, throwaway brokers)."""

    rows: dict[tuple[Table, tuple[str | int, ...]], object] = attrs.field(factory=dict)
    watermark: Watermark = attrs.field(factory=Watermark)

    def load(self) -> tuple[list[Change], Watermark]:
        return [Change(t, k, v) for (t, k), v in self.rows.items()], self.watermark

    def commit(self, changes: Sequence[Change], watermark: Watermark) -> None:
        for c in changes:
            if c.value is None:
                self.rows.pop((c.table, c.key), None)
            else:
                self.rows[(c.table, c.key)] = c.value
        self.watermark = watermark

    def clear(self) -> None:
        self.rows.clear()
        self.watermark = Watermark()

    def close(self) -> None:
        pass
