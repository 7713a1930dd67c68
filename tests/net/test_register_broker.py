"""The REGISTER_BROKER body in both forms, the identity header and the answer, sans-IO."""

from __future__ import annotations

import struct
import zlib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.codes import ResponseCode
from evq.domain.topics import PERM_RW, TopicConfig, TopicFilterType
from evq.net.codes import RequestCode, Version
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import (
    MAX_INFLATED,
    BrokerIdentity,
    DataVersion,
    RegisterBodyError,
    RegisterBrokerBody,
    RegisterResult,
    body_crc32,
    body_digest,
)
from tests.strategies import non_negative_int64s, topic_configs

_tables = st.lists(topic_configs, max_size=8, unique_by=lambda t: t.topic_name).map(
    lambda ts: sorted(ts, key=lambda t: t.topic_name))  # a table: JSON writes it sorted
_versions = st.builds(DataVersion, non_negative_int64s, non_negative_int64s)
_servers = st.lists(st.text(max_size=21), max_size=3).map(tuple)


@given(_tables, _versions, _servers)
def test_json_body_round_trips(topics: list[TopicConfig], dv: DataVersion,
                               servers: tuple[str, ...]) -> None:
    body = RegisterBrokerBody(topics=tuple(topics), data_version=dv, filter_servers=servers)
    assert RegisterBrokerBody.decode(body.encode()) == body


@given(_tables, _versions, _servers)
def test_compressed_body_round_trips_all_but_order_and_sys_flag(
        topics: list[TopicConfig], dv: DataVersion, servers: tuple[str, ...]) -> None:
    body = RegisterBrokerBody(topics=tuple(topics), data_version=dv, filter_servers=servers)
    decoded = RegisterBrokerBody.decode(body.encode(compressed=True), compressed=True)
    assert decoded == attrs.evolve(body, topics=tuple(
        attrs.evolve(t, order=False, topic_sys_flag=0) for t in topics))


def test_json_body_has_rocketmq_names() -> None:
    body = RegisterBrokerBody(topics=(TopicConfig(topic_name="T", read_queue_nums=4,
                                                  write_queue_nums=2, order=True),),
                              data_version=DataVersion(1700000000000, 3))
    assert body.encode() == (
        b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
        b'{"counter":3,"timestamp":1700000000000},"topicConfigTable":{"T":{"order":true,'
        b'"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T",'
        b'"topicSysFlag":0,"writeQueueNums":2}}}}'
    )


def compressed(*parts: bytes, count: int | None = None) -> bytes:
    """A compressed body built by hand: sized DataVersion, count, sized lines, sized list."""
    sized = [struct.pack(">i", len(p)) + p for p in parts]
    topics = len(parts) - 2  # all but the DataVersion and the filter server list
    head = sized[0] + struct.pack(">i", topics if count is None else count)
    return zlib.compress(head + b"".join(sized[1:]))


def test_compressed_body_as_java_lays_it_out() -> None:
    data = compressed(b'{"counter":7,"timestamp":5}', b"T 8 4 6 MULTI_TAG",
                      b"%RETRY%g 1 1 6 SINGLE_TAG", b'["10.0.0.9:9999"]')
    assert RegisterBrokerBody.decode(data, compressed=True) == RegisterBrokerBody(
        topics=(TopicConfig(topic_name="T", read_queue_nums=8, write_queue_nums=4,
                            topic_filter_type=TopicFilterType.MULTI_TAG),
                TopicConfig(topic_name="%RETRY%g", read_queue_nums=1, write_queue_nums=1)),
        data_version=DataVersion(5, 7), filter_servers=("10.0.0.9:9999",))


def test_java_broker_json_with_unknown_keys_and_bare_integer_keys() -> None:
    # A 5.x broker adds attributes and static-topic mappings (integer-keyed maps, unquoted).
    body = (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
            b'{"counter":12,"stateVersion":0,"timestamp":1700000000001},'
            b'"topicConfigTable":{"TopicTest":{"attributes":{},"order":false,"perm":6,'
            b'"readQueueNums":"4","topicFilterType":"SINGLE_TAG","topicName":"TopicTest",'
            b'"topicSysFlag":0,"writeQueueNums":4},"NoName":{"perm":7}},'
            b'"topicQueueMappingDetailMap":{"TopicTest":{"hostedQueues":{0:[],1:[]}}}}}')
    decoded = RegisterBrokerBody.decode(body, version=Version.V4_9_7)
    assert decoded.topics == (
        TopicConfig(topic_name="TopicTest", read_queue_nums=4, write_queue_nums=4),
        TopicConfig(topic_name="NoName", perm=7),
    )
    assert decoded.data_version == DataVersion(1700000000001, 12)


def test_brokers_before_3_0_11_send_the_bare_wrapper() -> None:
    body = b'{"dataVersion":{"counter":1,"timestamp":2},"topicConfigTable":{"T":{"perm":6}}}'
    decoded = RegisterBrokerBody.decode(body, version=Version.V3_0_11 - 1)
    assert decoded.topics == (TopicConfig(topic_name="T", perm=PERM_RW),)
    assert RegisterBrokerBody.decode(b"") == RegisterBrokerBody(data_version=None)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{", "body is not JSON"),
    (b"[]", "body is a JSON list"),
    (b'{"topicConfigSerializeWrapper":[]}', "topicConfigSerializeWrapper is not a JSON object"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":[]}}', "topicConfigTable"),
    (b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":"x"}}}', "dataVersion"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":6}}}', "'T' is not an object"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"a b":{}}}}', "illegal characters"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":99}}}}', "perm 99"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":[]}}}}',
     "readQueueNums"),
    (b'{"filterServerList":{}}', "filterServerList"),
    (b"[" * 100_000, "not JSON"),
])
def test_bad_json_bodies_are_named(body: bytes, reason: str) -> None:
    with pytest.raises(RegisterBodyError) as info:
        RegisterBrokerBody.decode(body)
    assert info.value.code == ResponseCode.SYSTEM_ERROR
    assert info.value.remark.startswith("Failed to decode RegisterBrokerBody: ")
    assert reason in info.value.remark


_DV = b'{"counter":1,"timestamp":1}'


@pytest.mark.parametrize(("body", "reason"), [
    (b"not zlib", "not a zlib stream"),
    (zlib.compress(b"\0" * 100)[:-6], "truncated"),
    (zlib.compress(b"\0\0"), "ends before the length of the DataVersion"),
    (zlib.compress(b"\0\0\0\x09{}"), "runs past the body"),
    (compressed(_DV, b"[]", count=1 << 30), "topic count"),
    (compressed(_DV, b"T 1 1 6", b"[]"), "'T 1 1 6'"),
    (compressed(_DV, b"T 1 1 6 NO_TAG", b"[]"), "NO_TAG"),
    (compressed(_DV, b"T x 1 6 SINGLE_TAG", b"[]"), "invalid literal"),
    (compressed(_DV, b"a\xffb 1 1 6 SINGLE_TAG", b"[]"), "utf-8"),
    (compressed(_DV, b"{"), "filter server list is not JSON"),
    (compressed(_DV, b"[1]"), "filter server list is not a list"),
    (compressed(b"[]", b"[]"), "DataVersion is a JSON list"),
])
def test_bad_compressed_bodies_are_named(body: bytes, reason: str) -> None:
    with pytest.raises(RegisterBodyError, match="Failed to decode RegisterBrokerBody") as info:
        RegisterBrokerBody.decode(body, compressed=True)
    assert reason in info.value.remark


def test_a_zlib_bomb_is_refused_without_inflating_it_all() -> None:
    bomb = zlib.compress(b"\0" * (MAX_INFLATED + 1024), 9)
    assert len(bomb) < 100_000
    with pytest.raises(RegisterBodyError, match="inflates past"):
        RegisterBrokerBody.decode(bomb, compressed=True)


def test_crc_is_javas_masked_crc32() -> None:
    assert body_crc32(b"123456789") == 0xCBF43926 & 0x7FFFFFFF
    assert body_crc32(b"") == 0


def test_the_identity_makes_both_headers() -> None:
    me = BrokerIdentity(cluster="C", broker_name="b", broker_id=1, broker_addr="h:1",
                        ha_server_addr="h:2")
    named = {"clusterName": "C", "brokerName": "b", "brokerId": "1", "brokerAddr": "h:1"}
    assert me.register_fields(body_crc32=7, compressed=True) == {
        **named, "haServerAddr": "h:2", "bodyCrc32": "7", "compressed": "true"}
    assert me.unregister_fields() == named


def test_register_result_round_trip() -> None:
    request = RemotingCommand.request(RequestCode.REGISTER_BROKER)
    for result in (RegisterResult(),
                   RegisterResult(master_addr="h:1", master_ha_addr="h:2",
                                  order_topic_config={"T": "b:4"}),
                   RegisterResult(order_topic_config={})):
        answer = request.response(fields=result.fields(), body=result.body())
        assert RegisterResult.from_response(answer) == result
    assert request.response(fields=RegisterResult().fields()).ext_fields == {}
    with pytest.raises(RegisterBodyError, match="not a KV table"):
        RegisterResult.from_response(request.response(body=b'{"table":{"T":4}}'))


_readings = st.tuples(st.booleans(), st.one_of(
    st.sampled_from([Version.V3_0_11 - 1, Version.V3_0_11]), st.integers(-2**31, 2**31 - 1)))


@given(st.binary(max_size=512), _readings, st.binary(max_size=512), _readings)
def test_body_digests_are_equal_only_for_the_same_bytes_read_the_same_way(
        a: bytes, how_a: tuple[bool, int], b: bytes, how_b: tuple[bool, int]) -> None:
    """The name server answers a body whose digest is the last one's without decoding it, so
    equal digests must mean equal tables: the same bytes, compressed or not alike, wrapped or
    bare alike (the version only matters on which side of V3_0_11 it is)."""
    def read_as(how: tuple[bool, int]) -> tuple[bool, bool]:
        return how[0], how[1] >= Version.V3_0_11

    same = a == b and read_as(how_a) == read_as(how_b)
    digest_a = body_digest(a, compressed=how_a[0], version=how_a[1])
    assert (digest_a == body_digest(b, compressed=how_b[0], version=how_b[1])) == same
    assert digest_a == body_digest(bytes(a), compressed=how_a[0], version=how_a[1])


def test_a_body_without_a_data_version_reads_as_none() -> None:
    """Java stamps a new DataVersion on a body that carries none, so it applies every such
    table; None matches no version, where (0, 0) would take every later table for the first
    one."""
    body = (b'{"filterServerList":[],"topicConfigSerializeWrapper":'
            b'{"topicConfigTable":{"T":{"perm":6}}}}')
    decoded = RegisterBrokerBody.decode(body, version=Version.V4_9_7)
    assert decoded.data_version is None and decoded.topics == (TopicConfig(topic_name="T"),)
    assert RegisterBrokerBody.decode(decoded.encode()) == decoded
    nulled = body.replace(b'{"topicConfigTable"', b'{"dataVersion":null,"topicConfigTable"')
    assert RegisterBrokerBody.decode(nulled).data_version is None
    assert RegisterBrokerBody.decode(b"").data_version is None
    # The compressed form always carries one: None goes as the default.
    assert RegisterBrokerBody.decode(decoded.encode(compressed=True), compressed=True
                                     ).data_version == DataVersion()
