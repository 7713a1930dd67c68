"""The ``evq`` Spark format end to end: batch reads (live and offline), streaming with a
checkpoint restart, writes, and option errors — Spark local[2] against a real ``evq serve``."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from evq.client.blocking import SyncProducer
from evq.domain.message import new_message
from evq.spark.options import offsets_from_json, parse_source
from evq.spark.source import EvqDataSource, EvqStreamReader
from tests.client.conftest import Served
from tests.processes import running_evq, wait_registered


def produce(namesrv: str, topic: str, n: int, *, start: int = 0, tags: str = "t") -> list[str]:
    """Send ``n`` numbered messages; their UNIQ_KEYs."""
    with SyncProducer("PG-spark-test", namesrv) as p:
        return [p.send(new_message(topic, b"%d" % i, tags=tags, keys=[f"k{i}"])).msg_id
                for i in range(start, start + n)]


def read(spark: SparkSession, **options: str) -> list[Row]:
    return spark.read.format("evq").options(**options).load().collect()


def assert_queue_order(rows: list[Row]) -> None:
    per_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in rows:
        per_queue[(r.brokerName, r.queueId)].append(r.queueOffset)
    for offsets in per_queue.values():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


def test_batch_read_has_every_message_once_in_queue_order(spark: SparkSession,
                                                          live: Served) -> None:
    sent = produce(live.namesrv, "SpBatch", 120)
    rows = read(spark, namesrv=live.namesrv, topic="SpBatch", maxMessagesPerPartition="7",
                bodyAs="string")
    assert sorted(r.uniqKey for r in rows) == sorted(sent)
    assert_queue_order(rows)
    first = next(r for r in rows if r.value == "0")
    assert (first.topic, first.tags, first.keys, first.properties["KEYS"]) == (
        "SpBatch", "t", ["k0"], "k0")
    assert first.body == b"0" and first.storeTimestamp >= first.bornTimestamp.replace(
        microsecond=0) and first.msgId and first.storeHost == live.broker


def test_tags_filter_pattern_and_explicit_offsets(spark: SparkSession, live: Served) -> None:
    produce(live.namesrv, "SpTagA", 6, tags="a")
    produce(live.namesrv, "SpTagA", 4, start=6, tags="b")
    produce(live.namesrv, "SpTagB", 3, tags="a")
    only_b = read(spark, namesrv=live.namesrv, topic="SpTagA", tags="b", bodyAs="string")
    assert sorted(int(r.value) for r in only_b) == [6, 7, 8, 9]
    sql = read(spark, namesrv=live.namesrv, topic="SpTagA", filter="TAGS = 'a'")
    assert len(sql) == 6
    both = read(spark, namesrv=live.namesrv, topicPattern="SpTag[AB]")
    assert len(both) == 13 and {r.topic for r in both} == {"SpTagA", "SpTagB"}
    starting = {"SpTagA": {"broker-a": {str(q): 1 for q in range(4)}}}
    skipped = read(spark, namesrv=live.namesrv, topic="SpTagA",
                   startingOffsets=json.dumps(starting))
    per_queue = defaultdict(int)
    for r in read(spark, namesrv=live.namesrv, topic="SpTagA"):
        per_queue[r.queueId] += 1
    assert len(skipped) == sum(max(n - 1, 0) for n in per_queue.values())
    assert all(r.queueOffset >= 1 for r in skipped)


def test_json_bodies_become_a_struct_column(spark: SparkSession, live: Served) -> None:
    docs = [{"id": i, "amount": i * 1.5, "price": f"{i}.125", "at": 1_700_000_000_000 + i,
             "items": [i, str(i + 1)], "meta": {"source": "web", "n": i}, "counts": {"x": i}}
            for i in range(3)]
    docs[2] |= {"id": "two", "at": "2024-01-02T03:04:05+01:00", "items": "many"}
    with SyncProducer("PG-spark-json", live.namesrv) as p:
        for doc in docs:
            p.send(new_message("SpJson", json.dumps(doc).encode()))
        p.send(new_message("SpJson", b"not json"))
    rows = read(spark, namesrv=live.namesrv, topic="SpJson", bodyAs="json",
                bodySchema="id INT, amount DOUBLE, price DECIMAL(10,2), at TIMESTAMP, "
                           "items ARRAY<BIGINT>, meta STRUCT<source: STRING, n: INT>, "
                           "counts MAP<STRING, INT>")
    values = sorted((r.value for r in rows if r.value is not None), key=lambda v: v.amount)
    assert sum(r.value is None for r in rows) == 1
    assert [(v.id, v.amount, str(v.price), v.items, v.meta.source, v.meta.n, v.counts)
            for v in values] == [(0, 0.0, "0.13", [0, 1], "web", 0, {"x": 0}),
                                 (1, 1.5, "1.13", [1, 2], "web", 1, {"x": 1}),
                                 (None, 3.0, "2.13", None, "web", 2, {"x": 2})]
    assert values[1].at.replace(tzinfo=dt.UTC) - values[0].at.replace(tzinfo=dt.UTC) == (
        dt.timedelta(milliseconds=1))
    assert values[2].at.astimezone(dt.UTC) == dt.datetime(2024, 1, 2, 2, 4, 5, tzinfo=dt.UTC)


def test_write_then_read_round_trips_every_field(spark: SparkSession, live: Served) -> None:
    df = spark.createDataFrame([
        Row(topic="SpWrite", body=b"one", keys=["a", "b"], tags="x", properties={"p": "1"},
            shardingKey=None),
        Row(topic="SpWrite", body=b"two", keys=["c"], tags="y", properties={"p": "2"},
            shardingKey="order-7"),
        Row(topic="SpWrite", body=b"three", keys=[], tags=None, properties={},
            shardingKey=None),
    ], "topic STRING, body BINARY, keys ARRAY<STRING>, tags STRING, "
       "properties MAP<STRING, STRING>, shardingKey STRING")
    df.write.format("evq").option("namesrv", live.namesrv).mode("append").save()
    got = {r.body: r for r in read(spark, namesrv=live.namesrv, topic="SpWrite")}
    assert set(got) == {b"one", b"two", b"three"}
    assert (got[b"one"].keys, got[b"one"].tags, got[b"one"].properties["p"]) == (
        ["a", "b"], "x", "1")
    assert (got[b"two"].keys, got[b"two"].tags, got[b"two"].properties["p"]) == (
        ["c"], "y", "2")
    assert got[b"three"].tags is None and got[b"three"].keys == []


def test_write_options_and_read_bounds(spark: SparkSession, live: Served) -> None:
    """Rows without a topic column take the ``topic`` option; a ``queueId`` row goes to that
    queue; the rows in between go out as ``send_batch`` batches of ``batchSize``.  Then the
    read side: a comma-separated topic list, ``endingOffsets``, ``startingOffsets`` at a
    time."""
    rows = [(f"q{i}", 3) for i in range(3)] + [(f"b{i}", None) for i in range(8)]
    (spark.createDataFrame(rows, "body STRING, queueId INT").coalesce(1).write.format("evq")
     .option("namesrv", live.namesrv).option("topic", "SpWOpt").option("batchSize", "4")
     .mode("append").save())
    time.sleep(0.05)
    cut = time.time_ns() // 1_000_000
    time.sleep(0.05)
    later = produce(live.namesrv, "SpWOpt2", 5)

    got = {r.value: r for r in read(spark, namesrv=live.namesrv, topic="SpWOpt",
                                     bodyAs="string")}
    assert sorted(got) == sorted(body for body, _ in rows)
    assert {got[f"q{i}"].queueId for i in range(3)} == {3}
    for batch in ([f"b{i}" for i in range(4)], [f"b{i}" for i in range(4, 8)]):
        assert len({got[b].queueId for b in batch}) == 1  # one request, one queue
        first = got[batch[0]].queueOffset
        assert [got[b].queueOffset for b in batch] == list(range(first, first + 4))

    both = read(spark, namesrv=live.namesrv, topic="SpWOpt, SpWOpt2")
    assert sorted(r.uniqKey for r in both) == sorted([r.uniqKey for r in got.values()] + later)

    ending = {"SpWOpt": {"broker-a": {"3": 2}}}
    bounded = read(spark, namesrv=live.namesrv, topic="SpWOpt",
                   endingOffsets=json.dumps(ending))
    assert sorted(r.uniqKey for r in bounded) == sorted(
        r.uniqKey for r in got.values() if r.queueId != 3 or r.queueOffset < 2)

    since = read(spark, namesrv=live.namesrv, topic="SpWOpt, SpWOpt2",
                 startingOffsets=f"timestamp:{cut}")
    assert sorted(r.uniqKey for r in since) == sorted(later)


def test_a_restarted_stream_delivers_every_message_exactly_once(
        spark: SparkSession, live: Served, tmp_path: Path) -> None:
    first = produce(live.namesrv, "SpStream", 60)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_stream() -> None:
        stream = (spark.readStream.format("evq").option("namesrv", live.namesrv)
                  .option("topic", "SpStream").option("startingOffsets", "earliest")
                  .option("maxMessagesPerTrigger", "25").load()
                  .select("uniqKey", "queueId", "queueOffset"))
        query = (stream.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run_stream()
    second = produce(live.namesrv, "SpStream", 40, start=60)
    run_stream()
    keys = [r.uniqKey for r in spark.read.parquet(str(out)).collect()]
    assert len(keys) == len(set(keys)) and sorted(keys) == sorted(first + second)


def test_a_stream_reads_a_topic_that_appears_while_it_runs(spark: SparkSession,
                                                           live: Served) -> None:
    first = produce(live.namesrv, "SpGrowA", 15)
    query = (spark.readStream.format("evq").option("namesrv", live.namesrv)
             .option("topicPattern", "SpGrow.*").option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "10").load().select("uniqKey")
             .writeStream.format("memory").queryName("sp_grow").start())
    try:
        query.processAllAvailable()
        second = produce(live.namesrv, "SpGrowB", 12) + produce(live.namesrv, "SpGrowA", 3,
                                                                start=15)
        probe = stream_reader(namesrv=live.namesrv, topicPattern="SpGrow.*")
        deadline = time.monotonic() + 10
        while "SpGrowB" not in probe.initialOffset() and time.monotonic() < deadline:
            time.sleep(0.05)  # the broker registers a new topic with the name server at once
        query.processAllAvailable()
    finally:
        query.stop()
    keys = [r.uniqKey for r in spark.table("sp_grow").collect()]
    assert len(keys) == len(set(keys)) and sorted(keys) == sorted(first + second)


def test_offline_read_equals_live_read(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(data), servers=2) as running:
        namesrv = running.addresses["namesrv"]
        wait_registered(namesrv, running.addresses["broker"])
        produce(namesrv, "SpOff", 30)
        live_rows = read(spark, namesrv=namesrv, topic="SpOff")
        with pytest.raises(Exception, match="a running broker holds it"):
            read(spark, path=str(data), topic="SpOff", lockTimeoutSeconds="1")
        assert running.stop() == 0
    offline = read(spark, path=str(data), backend="mmap", topic="SpOff")
    assert len(live_rows) == 30
    assert sorted(offline, key=lambda r: r.msgId) == sorted(live_rows, key=lambda r: r.msgId)


@pytest.mark.parametrize("options, named", [
    ({"topic": "T"}, "namesrv"),
    ({"namesrv": "127.0.0.1:1", "path": "/tmp"}, "namesrv"),
    ({"namesrv": "127.0.0.1:1"}, "topic"),
    ({"path": "/nonexistent", "topic": "T", "backend": "nope"}, "backend"),
    ({"namesrv": "127.0.0.1:1", "topic": "T", "startingOffsets": "soon"}, "startingOffsets"),
    ({"namesrv": "127.0.0.1:1", "topic": "T", "filter": "a >"}, "filter"),
    ({"namesrv": "127.0.0.1:1", "topic": "T", "bodyAs": "xml"}, "bodyAs"),
    ({"path": "/nonexistent-evq", "topic": "T"}, "path"),
    ({"namesrv": "127.0.0.1:1", "topic": "T", "bodyAs": "json", "bodySchema": "id INT, n"},
     "bodySchema"),
])
def test_bad_options_fail_naming_the_option(spark: SparkSession, options: dict[str, str],
                                            named: str) -> None:
    with pytest.raises(Exception, match=f"evq option '{named}'"):
        read(spark, **options)


def stream_reader(**options: str) -> EvqStreamReader:
    """The reader Spark makes, given the schema it parses from the source's DDL (which needs
    a running session)."""
    schema = StructType.fromDDL(EvqDataSource(options).schema())
    return EvqStreamReader(parse_source(options, streaming=True), schema)


def uniq_keys(reader: EvqStreamReader, partitions: Sequence[InputPartition]) -> list[str]:
    """What the reader's tasks read, as Spark's executors would run them."""
    return [key for p in partitions for batch in reader.read(p)
            for key in batch.column("uniqKey").to_pylist()]


def total(doc: dict[str, Any]) -> int:
    return sum(offsets_from_json(doc).values())


def test_writes_append_and_refuse_to_overwrite(spark: SparkSession) -> None:
    df = spark.createDataFrame([("T", "x")], "topic STRING, body STRING")
    with pytest.raises(Exception, match="evq option 'mode'"):
        df.write.format("evq").option("namesrv", "127.0.0.1:1").mode("overwrite").save()


def test_latest_offset_with_spark_4_2_start_and_limit(spark: SparkSession,
                                                     live: Served) -> None:
    produce(live.namesrv, "SpSig", 20)
    reader = stream_reader(namesrv=live.namesrv, topic="SpSig",
                           startingOffsets="earliest",
                           maxMessagesPerTrigger="8")
    start = reader.initialOffset()
    assert total(start) == 0
    assert total(reader.latestOffset(start, ReadMaxRows(5))) == 5
    assert total(reader.latestOffset(start, ReadAllAvailable())) == 20
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)

    # Spark asks for the start before the first batch and again to plan it.
    fresh = stream_reader(namesrv=live.namesrv, topic="SpSig", startingOffsets="latest")
    start = fresh.initialOffset()
    produce(live.namesrv, "SpSig", 3, start=20)
    end = fresh.latestOffset(start, ReadAllAvailable())
    assert fresh.initialOffset() == start and total(end) == total(start) + 3


def test_spark_4_0_restarts_read_every_message_once(spark: SparkSession,
                                                    live: Served) -> None:
    """Spark 4.0's call order (MicroBatchExecution with a stream that has no admission
    control): ``latestOffset()``; the start is the checkpoint's or, on a fresh query,
    ``initialOffset()``; the previous batch's end is committed; then ``partitions(start,
    end)``.  A restart replays a planned but uncommitted batch before anything else."""
    produce(live.namesrv, "SpRestart", 20)
    opts = {"startingOffsets": "earliest", "maxMessagesPerTrigger": "8"}
    seen: list[str] = []

    def run(reader: EvqStreamReader, start: dict[str, Any] | None, batches: int
            ) -> dict[str, Any] | None:
        """``batches`` micro-batches from the committed ``start``; the last end committed."""
        for _ in range(batches):
            end = reader.latestOffset()
            begin = start if start is not None else reader.initialOffset()
            if end == begin:
                break
            if start is not None:
                reader.commit(start)
            starts, ends = offsets_from_json(begin), offsets_from_json(end)
            assert all(ends[q] >= o for q, o in starts.items())
            seen.extend(uniq_keys(reader, reader.partitions(begin, end)))
            start = end
        return start

    first = stream_reader(namesrv=live.namesrv, topic="SpRestart", **opts)
    committed = run(first, None, 2)
    pending = first.latestOffset()  # batch planned into the offset log; the query dies
    produce(live.namesrv, "SpRestart", 10, start=20)

    second = stream_reader(namesrv=live.namesrv, topic="SpRestart", **opts)
    seen.extend(uniq_keys(second, second.partitions(committed, pending)))
    assert total(second.latestOffset()) - total(pending) <= 8  # on from the replayed batch
    second.commit(pending)
    committed = run(second, pending, 1)
    produce(live.namesrv, "SpRestart", 5, start=30)

    third = stream_reader(namesrv=live.namesrv, topic="SpRestart", **opts)
    run(third, committed, 10)
    assert len(seen) == len(set(seen)) == 35

    fresh = stream_reader(namesrv=live.namesrv, topic="SpRestart", startingOffsets="latest")
    end = fresh.latestOffset()
    produce(live.namesrv, "SpRestart", 3, start=35)  # before Spark asks for the start
    assert fresh.initialOffset() == end
    assert total(fresh.latestOffset()) == total(end) + 3
