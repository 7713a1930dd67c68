"""The connector's pure parts: option parsing, offsets JSON, partition slices, trigger limits,
the bodySchema check and JSON value conversion."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.spark.options import (
    BodyAs,
    OptionError,
    Position,
    offsets_from_json,
    offsets_to_json,
    parse_sink,
    parse_source,
)
from evq.spark.planning import limit, slices
from evq.spark.schema import json_converter, schema_ddl

queues = st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(["broker-a", "broker-b"]),
                   st.integers(0, 7))
offset_maps = st.dictionaries(queues, st.integers(0, 10**6), max_size=12)


@given(offset_maps)
def test_offsets_json_round_trips(offsets: dict[tuple[str, str, int], int]) -> None:
    assert offsets_from_json(offsets_to_json(offsets)) == offsets


@given(offset_maps, st.integers(1, 50), st.integers(0, 100))
def test_slices_cover_each_range_once_within_the_size(
        ends: dict[tuple[str, str, int], int], size: int, back: int) -> None:
    starts = {q: max(e - back, 0) for q, e in ends.items()}
    pieces = slices(starts, ends, size)
    for q in ends:
        mine = [(p.start, p.end) for p in pieces if p.queue == q]
        covered = [o for lo, hi in mine for o in range(lo, hi)]
        assert covered == list(range(starts[q], ends[q]))
        assert all(0 < hi - lo <= size for lo, hi in mine)


@given(offset_maps, st.integers(0, 500), st.one_of(st.none(), st.integers(1, 300)))
def test_a_trigger_reads_at_most_its_budget_and_always_progresses(
        latest: dict[tuple[str, str, int], int], back: int, budget: int | None) -> None:
    starts = {q: max(e - back, 0) for q, e in latest.items()}
    ends = limit(starts, latest, budget)
    taken = sum(ends[q] - starts[q] for q in latest)
    waiting = sum(latest[q] - starts[q] for q in latest)
    assert all(starts[q] <= ends[q] <= latest[q] for q in latest)
    assert taken == (waiting if budget is None else min(budget, waiting))


def test_defaults_and_offsets_forms() -> None:
    batch = parse_source({"namesrv": "h:1", "topic": "A, B"}, streaming=False)
    assert batch.topics == ("A", "B") and batch.starting.position is Position.EARLIEST
    stream = parse_source({"NameSrv": "h:1", "topicPattern": "A.*",
                           "startingOffsets": "timestamp:1700000000000",
                           "maxMessagesPerTrigger": "10"}, streaming=True)
    assert stream.starting.timestamp_ms == 1_700_000_000_000 and stream.max_per_trigger == 10
    assert stream.wants("Alpha") and not stream.wants("Beta")
    explicit = parse_source({"path": "/d", "topic": "A",
                             "endingOffsets": '{"A": {"broker-a": {"3": 9}}}'}, streaming=False)
    assert explicit.ending.explicit == {("A", "broker-a", 3): 9}
    assert parse_sink({"namesrv": "h:1", "batchSize": "5"}).batch == 5


@pytest.mark.parametrize("options, named", [
    ({"namesrv": "h:1", "topic": "A", "endingOffsets": "latest"}, "endingOffsets"),
    ({"namesrv": "h:1", "topic": "A", "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger"),
    ({"namesrv": "h:1", "topic": "A", "topicPattern": "A"}, "topic"),
    ({"namesrv": "h:1", "topicPattern": "("}, "topicPattern"),
    ({"namesrv": "h:1", "topic": "A", "tags": "a", "filter": "a = 1"}, "filter"),
    ({"namesrv": "h:1", "topic": "A", "bodyAs": "json"}, "bodySchema"),
    ({"namesrv": "h:1", "topic": "A", "startingOffsets": '{"A": {"b": {"0": -1}}}'},
     "startingOffsets"),
])
def test_bad_options_name_themselves(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=f"evq option '{named}'"):
        parse_source(options, streaming=True)


def test_writes_need_a_cluster() -> None:
    with pytest.raises(OptionError, match="evq option 'namesrv'"):
        parse_sink({"topic": "A"})


def test_a_queue_new_since_the_start_is_read_from_its_first_offset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.types import StructType

    from evq.spark import source

    class Expired:
        """A queue whose first five messages have expired."""

        def bounds(self, queue: tuple[str, str, int]) -> tuple[int, int]:
            return 5, 9

        def close(self) -> None:
            pass

    monkeypatch.setattr(source, "open_access", lambda opts: Expired())
    reader = source.EvqStreamReader(
        parse_source({"namesrv": "h:1", "topic": "A"}, streaming=True), StructType())
    parts = reader.partitions({"A": {"b": {"0": 3}}}, {"A": {"b": {"0": 6, "1": 9}}})
    assert [(p.piece.queue, p.piece.start, p.piece.end) for p in parts] == [
        (("A", "b", 0), 3, 6), (("A", "b", 1), 5, 9)]


@pytest.mark.parametrize("ddl", [
    "id INT, amount DOUBLE",
    "a DECIMAL(10,2), b STRUCT<c: INT, d ARRAY<MAP<STRING, BIGINT>>>, `x, y` STRING NOT NULL "
    "COMMENT 'p, q'",
])
def test_body_schema_takes_nested_ddl(ddl: str) -> None:
    assert schema_ddl(BodyAs.JSON, ddl).endswith(f", value STRUCT<{ddl}>")


@pytest.mark.parametrize("ddl", ["", "a", "a INT,", "a INTT", "a ARRAY<INT", "a INT>, b INT",
                                 "a MAP<STRING>", "a DECIMAL(10,", "a INT NOT",
                                 "a INT COMMENT b"])
def test_a_malformed_body_schema_names_the_option(ddl: str) -> None:
    with pytest.raises(OptionError, match="evq option 'bodySchema'"):
        schema_ddl(BodyAs.JSON, ddl)


def test_json_values_convert_to_the_declared_types_or_null() -> None:
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        ByteType,
        DecimalType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kind = StructType([StructField(n, t) for n, t in [
        ("i", IntegerType()), ("b", ByteType()), ("d", DecimalType(4, 2)),
        ("s", StringType()), ("ok", BooleanType()), ("t", TimestampType()),
        ("xs", ArrayType(IntegerType())), ("m", MapType(IntegerType(), StringType())),
        ("in", StructType([StructField("v", IntegerType())]))]])
    convert = json_converter(kind)
    assert convert({"i": "7", "b": 127, "d": "12.345", "s": 5, "ok": True,
                    "t": "2024-01-02T03:04:05", "xs": [1, 2.0, 2.5, True, None],
                    "m": {"1": "a", "x": "b", "2": 3}, "in": {"v": 9}}) == (
        7, 127, decimal.Decimal("12.35"), "5", True,
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC), [1, 2, None, None, None],
        {1: "a", 2: "3"}, (9,))
    assert convert({"i": 2**31, "b": 128, "d": 100, "s": {"k": [1]}, "ok": "true",
                    "t": 1_700_000_000_000, "xs": "1", "m": [], "in": 3}) == (
        None, None, None, '{"k": [1]}', None,
        dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC), None, None, None)
    assert convert([1]) is None and convert({}) == (None,) * 9
