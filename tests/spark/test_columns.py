"""The column path of a read task (:mod:`evq.spark.columns`) against the message path it
stands in for: the same rows, field by field, for any block of stored records."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from evq.domain.message import Message, new_message
from evq.domain.record import RecordError, encode
from evq.spark.columns import BatchMaker
from evq.spark.options import parse_source
from evq.spark.source import EvqDataSource
from tests.strategies import ipv4_hosts, messages, sysflags

BODY_SCHEMA = ("id INT, name STRING, amount DOUBLE, ok BOOLEAN, small TINYINT, "
               "items ARRAY<BIGINT>, inner STRUCT<n: SMALLINT, s: STRING>")
EPOCH_MS_2100 = 4_102_444_800_000


def maker(spark: SparkSession, **options: str) -> BatchMaker:
    options = {"namesrv": "127.0.0.1:1", "topic": "T", **options}
    schema = StructType.fromDDL(EvqDataSource(options).schema())
    return BatchMaker.of(parse_source(options, streaming=False), schema, "broker-a")


def plausible(m: Message) -> Message:
    """Times a broker stores (epoch milliseconds before 2100), which datetimes hold."""
    m.born_timestamp %= EPOCH_MS_2100
    m.store_timestamp %= EPOCH_MS_2100
    return m


stored = st.lists(messages(ipv6=False, sysflag=sysflags(compressed=False)).map(plausible),
                  min_size=1, max_size=12)
any_stored = st.lists(messages().map(plausible), min_size=1, max_size=6)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=8), st.sampled_from(["12", "1.5", "true", ""]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["n", "s", "x"]), inner,
                                             max_size=3), max_leaves=6)
json_docs = st.dictionaries(
    st.sampled_from(["id", "name", "amount", "ok", "small", "items", "inner", "other"]),
    json_values, max_size=7)
clean_docs = st.fixed_dictionaries({
    "id": st.integers(-(2**31), 2**31 - 1), "name": st.text(max_size=10),
    "amount": st.floats(allow_nan=False, allow_infinity=False), "ok": st.booleans(),
    "items": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
    "inner": st.fixed_dictionaries({"n": st.integers(-(2**15), 2**15 - 1)})})


def block_of(msgs: list[Message]) -> bytes:
    return b"".join(bytes(encode(m)) for m in msgs)


def rows(maker_: BatchMaker, block: bytes, end: int) -> tuple[list[dict[str, Any]], ...]:
    return maker_.batch(block, end).to_pylist(), maker_._by_message(block, end).to_pylist()


@pytest.fixture(scope="module")
def makers(spark: SparkSession) -> dict[str, BatchMaker]:
    return {"binary": maker(spark), "string": maker(spark, bodyAs="string"),
            "json": maker(spark, bodyAs="json", bodySchema=BODY_SCHEMA),
            "tags": maker(spark, tags="a || b"),
            "sql": maker(spark, filter="TAGS = 'a' OR KEYS IS NOT NULL")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=stored | any_stored, end=st.integers(0, 2**63 - 1),
       kind=st.sampled_from(["binary", "string", "tags", "sql"]))
def test_columns_equal_the_rows_of_each_message(makers: dict[str, BatchMaker],
                                                msgs: list[Message], end: int,
                                                kind: str) -> None:
    fast, slow = rows(makers[kind], block_of(msgs), end)
    assert fast == slow


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(json_docs | clean_docs, min_size=1, max_size=8),
       pretty=st.booleans(), garbage=st.sampled_from([b"", b"not json", b'{"name": "\xff"}']))
def test_json_values_equal_the_lenient_conversion(makers: dict[str, BatchMaker],
                                                  docs: list[dict[str, Any]], pretty: bool,
                                                  garbage: bytes) -> None:
    """Bodies the reader takes, values it refuses, and bodies that are not JSON (or not
    UTF-8) in one block."""
    bodies = [json.dumps(d, indent=1 if pretty else None).encode() for d in docs]
    if garbage:
        bodies.append(garbage)
    msgs = [new_message("T", b) for b in bodies]
    for i, m in enumerate(msgs):
        m.queue_offset, m.born_host, m.store_host = i, ("10.0.0.1", 1), ("10.0.0.2", 2)
    fast, slow = rows(makers["json"], block_of(msgs), len(msgs))
    assert [r["value"] for r in fast] == [r["value"] for r in slow]


@given(host=ipv4_hosts())
def test_a_property_named_twice_keeps_the_last_value(makers: dict[str, BatchMaker],
                                                     host: tuple[str, int]) -> None:
    m = new_message("T", b"x", properties={"a1": "first", "a2": "second"})
    m.born_host = m.store_host = host
    block = block_of([m]).replace(b"a2\x01", b"a1\x01")
    (row,) = makers["binary"].batch(block, 1).to_pylist()
    assert dict(row["properties"]) == {"a1": "second"}


def test_a_body_that_does_not_match_its_crc_is_refused(makers: dict[str, BatchMaker]) -> None:
    m = new_message("T", b"payload")
    m.born_host = m.store_host = ("10.0.0.1", 1)
    block = block_of([m]).replace(b"payload", b"pAyload")
    with pytest.raises(RecordError, match="CRC"):
        makers["binary"].batch(block, 1)


def test_a_block_cut_inside_a_record_is_refused(makers: dict[str, BatchMaker]) -> None:
    m = new_message("T", b"payload")
    m.born_host = m.store_host = ("10.0.0.1", 1)
    with pytest.raises(RecordError):
        makers["binary"].batch(block_of([m, m])[:-5], 2)
