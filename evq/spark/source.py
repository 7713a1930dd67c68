"""The ``evq`` Spark data source (Spark 4's Python Data Source API): batch and streaming reads,
batch and streaming writes.

Planning happens in the driver (which queues, which offsets, how to cut them); each task opens
its own access to the cluster or the store, reads its slice in queue order and closes it.
Streaming offsets are the per-queue offsets themselves (:mod:`evq.spark.options` shows the
JSON), so a query restarted from its checkpoint reads on from exactly where the last
committed micro-batch ended.

Writes are at least once: each task sends its rows and reports how many it sent; a task that
fails after sending some is retried by Spark and sends them again.  A sink that must see each
message once deduplicates by ``uniqKey``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import Row, StructType

from evq import logs
from evq.spark.access import QueueAccess, open_access
from evq.spark.columns import BatchMaker
from evq.spark.options import (
    BodyAs,
    Offsets,
    OffsetSpec,
    OptionError,
    Position,
    QueueKey,
    SourceOptions,
    offsets_from_json,
    offsets_to_json,
    parse_sink,
    parse_source,
)
from evq.spark.planning import Slice, limit, slices
from evq.spark.schema import schema_ddl
from evq.spark.writing import send_rows

log = logs.get_logger(__name__)

try:  # Spark 4.2+: admission control through ReadLimit
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
except ImportError:  # Spark 4.0 / 4.1: latestOffset() takes no arguments
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]


class EvqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "evq"

    def schema(self) -> str:
        o = {k.lower(): v for k, v in self.options.items()}
        try:
            body_as = BodyAs(o.get("bodyas", "binary").lower())
        except ValueError:
            body_as = BodyAs.BINARY  # the reader's option check names the bad value
        return schema_ddl(body_as, o.get("bodyschema"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return EvqBatchReader(parse_source(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return EvqStreamReader(parse_source(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Spark lets a Python data source take ``mode("overwrite")``, but a topic's messages
        cannot be replaced: sending would only append, so the mode is refused."""
        if overwrite:
            raise OptionError("mode", "a topic cannot be overwritten; write with "
                                      ".mode('append')")
        return EvqWriter(parse_sink(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return EvqStreamWriter(parse_sink(self.options))


class SlicePartition(InputPartition):
    """One task's queue range (InputPartition carries it to the executor by pickling)."""

    def __init__(self, piece: Slice) -> None:
        super().__init__(attrs.astuple(piece, recurse=False))
        self.piece = piece


def _read(opts: SourceOptions, schema: StructType, piece: Slice) -> Iterator[pa.RecordBatch]:
    maker = BatchMaker.of(opts, schema, piece.queue[1])
    access = open_access(opts)
    try:
        for block in access.read_blocks(piece.queue, piece.start, piece.end):
            batch = maker.batch(block, piece.end)
            if batch.num_rows:
                yield batch
    finally:
        access.close()


def _resolve(access: QueueAccess, spec: OffsetSpec, queue: QueueKey, lo: int, hi: int) -> int:
    if queue in spec.explicit:
        return min(max(spec.explicit[queue], lo), hi)
    if spec.timestamp_ms is not None:
        return min(max(access.offset_for_time(queue, spec.timestamp_ms), lo), hi)
    return lo if spec.position is Position.EARLIEST else hi


class EvqBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        access = open_access(self.opts)
        try:
            starts: Offsets = {}
            ends: Offsets = {}
            for queue in access.queues(self.opts):
                lo, hi = access.bounds(queue)
                starts[queue] = _resolve(access, self.opts.starting, queue, lo, hi)
                ends[queue] = max(_resolve(access, self.opts.ending, queue, lo, hi),
                                  starts[queue])
        finally:
            access.close()
        pieces = slices(starts, ends, self.opts.partition_size)
        log.info("evq batch planned", partitions=len(pieces),
                 messages=sum(p.end - p.start for p in pieces))
        return [SlicePartition(p) for p in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        return _read(self.opts, self.schema, partition.piece)


class EvqStreamReader(DataSourceStreamReader):
    """Micro-batches over per-queue offsets.

    Spark 4.2+ hands ``latestOffset`` the batch's start; Spark 4.0 and 4.1 call it with no
    arguments, so the reader goes on from the furthest offsets it has seen: its own answers
    and the ends Spark plans (``partitions``) and commits (``commit``).  A reader that has
    seen none (its query has just started, fresh or from a checkpoint) cannot know where the
    checkpoint stands, and an end below it would plan an empty batch and then read the same
    messages again; so its first answer is everything available, which no committed offset
    exceeds, and ``maxMessagesPerTrigger`` applies from the next batch on."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._seen: Offsets | None = None
        self._initial: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        """Where a fresh query starts: the same answer each time Spark asks.  Spark asks once
        before the first ``latestOffset`` and again to plan that batch; with ``latest`` a new
        look would start past the batch's end and skip what arrived in between.  Spark 4.0
        asks only after the first ``latestOffset()``, so the start is held at that end."""
        if self._initial is None:
            seen = self._seen or {}
            offsets: Offsets = {}
            access = open_access(self.opts)
            try:
                for q in access.queues(self.opts):
                    lo, hi = access.bounds(q)
                    offsets[q] = min(_resolve(access, self.opts.starting, q, lo, hi),
                                     seen.get(q, hi))
            finally:
                access.close()
            self._initial = offsets_to_json(offsets)
        return self._initial

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is None or self.opts.max_per_trigger is None:
            return ReadAllAvailable() if ReadAllAvailable is not None else None
        return ReadMaxRows(self.opts.max_per_trigger)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit_: Any = None) -> dict[str, Any]:
        if start is not None:
            starts = offsets_from_json(start)
            if ReadMaxRows is not None and isinstance(limit_, ReadMaxRows):
                budget: int | None = limit_.max_rows
            else:
                budget = None if limit_ is not None else self.opts.max_per_trigger
        elif self._seen is not None:
            starts, budget = dict(self._seen), self.opts.max_per_trigger
        else:
            starts, budget = {}, None
        access = open_access(self.opts)
        try:
            bounds = {q: access.bounds(q) for q in access.queues(self.opts)}
        finally:
            access.close()
        latest = {q: hi for q, (_, hi) in bounds.items()}
        starts = {**{q: lo for q, (lo, _) in bounds.items()}, **starts}
        end = {**starts, **limit(starts, latest, budget)}
        self._see(end)
        return offsets_to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        """A queue that Spark's start does not name is new since the previous batch (a topic
        that gained queues, or a new one ``topicPattern`` matches): it is read from its first
        offset, which is above 0 once its oldest messages have expired."""
        starts, ends = offsets_from_json(start), offsets_from_json(end)
        self._see(ends)
        new = sorted(set(ends) - set(starts))
        if new:
            access = open_access(self.opts)
            try:
                starts |= {q: access.bounds(q)[0] for q in new}
            finally:
                access.close()
        return [SlicePartition(p) for p in slices(starts, ends, self.opts.partition_size)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        return _read(self.opts, self.schema, partition.piece)

    def commit(self, end: dict[str, Any]) -> None:
        """Reads never commit to the cluster (the checkpoint holds the offsets); the end only
        tells a Spark 4.0 reader where batches stand."""
        self._see(offsets_from_json(end))

    def _see(self, offsets: Offsets) -> None:
        seen = self._seen or {}
        self._seen = {q: max(o, seen.get(q, o)) for q, o in {**seen, **offsets}.items()}


@attrs.define(slots=True)
class SentRows(WriterCommitMessage):
    messages: int


class EvqWriter(DataSourceArrowWriter):
    """Takes the task's rows as Arrow batches: each batch becomes Python values in one call,
    where Spark's row path builds a ``Row`` per row and the sink a dict from each."""

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return SentRows(send_rows(self.opts, (row for batch in iterator
                                              for row in batch.to_pylist())))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, SentRows))
        log.info("evq write committed", messages=sent)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, SentRows))
        log.warning("evq write aborted; the messages sent stay sent (at least once)",
                    messages=sent)


class EvqStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: Any) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return SentRows(send_rows(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, SentRows))
        log.info("evq micro-batch written", batch=batchId, messages=sent)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("evq micro-batch aborted; what was sent stays sent", batch=batchId)
