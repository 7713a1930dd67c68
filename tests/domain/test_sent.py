"""The plain put path stores what the Message path stores, and leaves it whatever it must.

Both paths run on one real broker (mmap store, SQLite projection) for every drawn send:
the records they store are compared byte for byte (the fields the log patches aside), with
their ConsumeQueue tag codes and index keys, and a refusal must be the same refusal.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult
from evq.domain.codes import BrokerError
from evq.domain.message import (
    MAX_PROPERTIES_BYTES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    Host,
    Prop,
    PropertyError,
    decode_properties,
    encode_properties,
    waits_for_store,
)
from evq.domain.record import (
    QUEUE_OFFSET_AT,
    index_keys_of,
    read_fields,
    store_timestamp_at,
)
from evq.domain.sent import ROUTED, SentEntry, cluster_property, plain_message, sent_messages
from tests.domain.conftest import OpenBroker, topic
from tests.strategies import (
    SYSTEM_PROPERTY_NAMES,
    bodies,
    hosts,
    int32s,
    property_names,
    property_values,
    sysflags,
    timestamps,
)

MAX_BODY = 2048  # the broker under test's max_message_size: bodies are drawn past it

# --- what a producer may send --------------------------------------------------------------

_SEPARATORS = st.sampled_from((NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR))


@st.composite
def _big_values(draw: st.DrawFn) -> str:
    """One character repeated up to past the properties limit, in 1 to 4 UTF-8 bytes."""
    ch = draw(st.sampled_from(("v", "é", "中", "\U0001f600")))
    return ch * (draw(st.integers(0, MAX_PROPERTIES_BYTES + 16)) // len(ch.encode()))


_SYSTEM_VALUES = st.sampled_from(("", "0", "1", "3", "-1", "true", "false", "FALSE", "x",
                                  "0 1", "99999999999999", "1700000000000"))

property_maps = st.dictionaries(
    property_names | st.sampled_from(sorted(SYSTEM_PROPERTY_NAMES)),
    property_values | _SYSTEM_VALUES | _big_values(),
    max_size=6,
)
"""Any legal map: every character but the separators in names and values, RocketMQ's own
names with the values they act on, sizes up to past the limit."""


@st.composite
def property_texts(draw: st.DrawFn) -> str:
    """The properties string of one message as producers write it, and as they should not:
    encoded (the trailing separator dropped as Java does), two maps run together (repeated
    names), or any text with stray separators (empty names and pieces, a separator in a
    value)."""
    text = encode_properties(draw(property_maps))
    kind = draw(st.sampled_from(("encoded", "java", "joined", "stray")))
    if kind == "java":
        return text[:-1]
    if kind == "joined":
        return text + encode_properties(draw(property_maps))
    if kind == "stray":  # a lone surrogate too: a JSON header may escape one
        return draw(st.lists(property_names | _SEPARATORS | _SYSTEM_VALUES | st.just("\ud800"),
                             max_size=8).map("".join))
    return text


entries = st.tuples(int32s, st.binary(max_size=MAX_BODY + 64) | bodies,
                    sysflags() | int32s, property_texts())


def _must_fall_back(send_topic: str, born: Host, texts: list[str]) -> bool:
    """Whether the Message path may do anything but drop WAIT and append CLUSTER: the
    model :meth:`Broker.plain_messages` must agree with."""
    if send_topic.startswith(tp.RETRY_PREFIX) or ":" in born[0]:
        return True
    for text in texts:
        sent = text if not text or text.endswith(PROPERTY_SEPARATOR) else text + PROPERTY_SEPARATOR
        props = decode_properties(sent)
        try:
            sent.encode()
            canonical = encode_properties(props) == sent
        except (PropertyError, UnicodeEncodeError):
            canonical = False
        if not canonical or not ROUTED.isdisjoint(props):
            return True
    return False


# --- the two paths, side by side -----------------------------------------------------------


def _outcome(put: Callable[[], SendResult]) -> SendResult | tuple[object, str]:
    try:
        return put()
    except BrokerError as exc:
        return exc.code, exc.remark


def _recorder(codes: list[int]) -> Callable[[int], bool]:
    def seen(code: int) -> bool:
        codes.append(code)
        return True

    return seen


def _stored(broker: Broker, result: SendResult
            ) -> list[tuple[bytes, tuple[int, ...], tuple[bool, ...]]]:
    """Each stored record with the fields the log patches zeroed, its ConsumeQueue tag code,
    and the physical offsets its index keys find."""
    out = []
    for a in result.appended:
        view = broker.log.lookup(a.physical_offset)
        assert view is not None, "a stored record must be found at its offset"
        raw = bytearray(view)
        fields = read_fields(raw, 0, check_crc=True)
        struct.pack_into(">qq", raw, QUEUE_OFFSET_AT, 0, 0)
        struct.pack_into(">q", raw, store_timestamp_at(fields.sysflag), 0)
        codes: list[int] = []  # the ConsumeQueue's tag code, as a tag filter is shown it
        if sf.has_consume_queue_entry(fields.sysflag):
            [entry] = broker.log.read(result.topic, result.queue_id, a.queue_offset, 1,
                                      tag_filter=_recorder(codes)).records
            assert bytes(entry) == bytes(view)
        found = tuple(
            a.physical_offset in {read_fields(r, 0, check_crc=False).physical_offset
                                  for r in broker.log.query_keys(result.topic, key, 64, 0,
                                                                 2**63 - 1).records}
            for key in index_keys_of(decode_properties(fields.properties), fields.sysflag))
        out.append((bytes(raw), tuple(codes), found))
    return out


@pytest.fixture
def small_broker(open_broker: OpenBroker) -> Broker:
    b = open_broker(max_message_size=MAX_BODY)
    topic(b, "T", queues=4)
    return b


@settings(max_examples=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(send_topic=st.sampled_from(("T", "%RETRY%g")), born=hosts(),
       sent=st.lists(entries, min_size=1, max_size=3))
def test_the_plain_path_takes_exactly_the_sends_that_need_no_routing(
    broker: Broker, send_topic: str, sent: list[SentEntry], born: Host
) -> None:
    plain = broker.plain_messages(send_topic, born, sent)
    assert (plain is None) == _must_fall_back(send_topic, born, [e[3] for e in sent])
    if plain is not None:
        for m, e in zip(plain, sent, strict=True):
            assert m.wait == waits_for_store(decode_properties(e[3]))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(
    send_topic=st.sampled_from(("T", "NEW", tp.AUTO_CREATE_TOPIC, tp.SCHEDULE_TOPIC)),
    sent=st.lists(entries, min_size=1, max_size=3),
    queue_id=st.integers(-1, 4),
    born=hosts(ipv6=False),
    born_ts=timestamps,
    reconsume=int32s,
    seed=st.integers(0, 2**32 - 1),
)
def test_plain_path_stores_what_the_message_path_stores(
    small_broker: Broker, send_topic: str, sent: list[SentEntry], queue_id: int, born: Host,
    born_ts: int, reconsume: int, seed: int,
) -> None:
    broker = small_broker
    plain = broker.plain_messages(send_topic, born, sent)
    assume(plain is not None)
    assert plain is not None
    def general() -> SendResult:
        random.seed(seed)  # the same random queue for both paths
        return broker.put(sent_messages(send_topic, sent, queue_id=queue_id,
                                        born_timestamp=born_ts, born_host=born,
                                        reconsume_times=reconsume))

    def fast() -> SendResult:
        random.seed(seed)
        return broker.put_plain(send_topic, plain, queue_id=queue_id, born_timestamp=born_ts,
                                born_host=born, reconsume_times=reconsume)

    expected, got = _outcome(general), _outcome(fast)
    event("refused" if isinstance(expected, tuple) else expected.status.value)
    if not isinstance(expected, SendResult) or not isinstance(got, SendResult):
        assert got == expected
        return
    assert (got.status, got.topic, got.queue_id, len(got.appended)) == (
        expected.status, expected.topic, expected.queue_id, len(expected.appended))
    if got.ok:
        assert _stored(broker, got) == _stored(broker, expected)


@given(text=property_texts(), host=hosts(ipv6=False))
def test_routing_properties_always_take_the_message_path(text: str, host: Host) -> None:
    cluster = cluster_property("DefaultCluster")
    assert cluster is not None
    for name in sorted(ROUTED):
        routed = f"{name}{NAME_VALUE_SEPARATOR}1{PROPERTY_SEPARATOR}"
        assert plain_message((0, b"", 0, routed + text), cluster) is None
        if text.endswith(PROPERTY_SEPARATOR):
            assert plain_message((0, b"", 0, text + routed), cluster) is None


@pytest.mark.parametrize("cluster", ["a\x01b", "a\x02b"])
def test_a_cluster_name_with_a_separator_turns_the_plain_path_off(
    open_broker: OpenBroker, cluster: str
) -> None:
    b = open_broker(broker_cluster_name=cluster)
    assert b.plain_messages("T", ("127.0.0.1", 1), [(0, b"x", 0, "")]) is None


def test_wait_is_dropped_and_cluster_appended_in_place() -> None:
    cluster = cluster_property("C")
    assert cluster is not None
    sent = f"A\x011\x02{Prop.WAIT}\x01false\x02B\x012"  # Java: no trailing separator
    m = plain_message((0, b"", 0, sent), cluster)
    assert m is not None
    assert (m.properties, m.wait) == (b"A\x011\x02B\x012\x02CLUSTER\x01C\x02", False)


def test_a_lone_surrogate_takes_the_message_path() -> None:
    """A JSON header may escape one; the general path refuses it as unencodable."""
    cluster = cluster_property("C")
    assert cluster is not None
    assert plain_message((0, b"", 0, "A\x01\ud800\x02"), cluster) is None
