"""The plain put path stores what the Message path stores, and leaves it whatever it must.

Both paths run on one real broker (mmap store, SQLite projection) for every drawn send:
the records they store are compared byte for byte (the fields the log patches aside), with
their ConsumeQueue tag codes and index keys, and a refusal must be the same refusal.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult
from evq.domain.codes import BrokerError
from evq.domain.ids import UniqKeyRun
from evq.domain.message import (
    COMPRESS_OVER,
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
from evq.domain.sent import (
    COMPILED_SENT,
    PURE_SENT,
    ROUTED,
    SENT,
    KeyedSend,
    SentEntry,
    SentPath,
    cluster_property,
    sent_messages,
)
from tests.domain.conftest import OpenBroker, topic
from tests.strategies import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    SYSTEM_PROPERTY_NAMES,
    bodies,
    codec_topics,
    hosts,
    int32s,
    property_names,
    property_values,
    sysflags,
    timestamps,
)

MAX_BODY = 2048  # the broker under test's max_message_size: bodies are drawn past it
INT64_MIN = -(2**63)
T = TypeVar("T")

# --- what a producer may send --------------------------------------------------------------

_SEPARATORS = st.sampled_from((NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR))
_NO_SEPARATOR_CHARS = st.characters(codec="utf-8", exclude_characters="\x01\x02")


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


@st.composite
def plain_texts(draw: st.DrawFn) -> str:
    """A properties string the plain path takes: no routing name, the names it reads (TAGS,
    KEYS with spaces anywhere, UNIQ_KEY, WAIT) with any value, the last separator or not."""
    names = property_names.filter(lambda n: n not in ROUTED) | st.sampled_from(
        (Prop.TAGS, Prop.KEYS, Prop.UNIQ_KEY, Prop.WAIT))
    values = property_values | _SYSTEM_VALUES | st.lists(
        st.sampled_from(("", " ", "k", "é", "\U0001f600")), max_size=6).map("".join)
    text = encode_properties(draw(st.dictionaries(names, values, max_size=6)))
    return text[:-1] if text and draw(st.booleans()) else text


plain_entries = st.tuples(int32s, st.binary(max_size=64), sysflags() | int32s, plain_texts())


def _must_fall_back(texts: list[str]) -> bool:
    """Whether the Message path may do anything but drop WAIT and append CLUSTER: the
    model :func:`plain_records` must agree with."""
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


def _outcome(call: Callable[[], T]) -> T | tuple[object, ...]:
    """What a call gives: its value, the refusal (code and remark) it raised, or the type
    of any other error."""
    try:
        return call()
    except BrokerError as exc:
        return exc.code, exc.remark
    except Exception as exc:  # the comparison is the point: any type must match
        return (type(exc),)


PATHS = [PURE_SENT] if COMPILED_SENT is None else [PURE_SENT, COMPILED_SENT]
"""The send paths this build has: the pure reference, and the compiled one when built."""
CLUSTER = cluster_property("DefaultCluster") or ""
BORN = b"\x7f\x00\x00\x01\x00\x00\x30\x39"
STORE = b"\x0a\x00\x00\x07\x00\x00\x27\x11"


def _plain(path: SentPath, sent: list[SentEntry] | KeyedSend, **overrides: Any) -> object:
    """``path.plain_records`` of ``sent`` for a default target, each argument overridable."""
    args: dict[str, Any] = {
        "topic": "T", "queue_id": 1, "born_timestamp": 1_700_000_000_000, "born_host": BORN,
        "store_host": STORE, "reconsume_times": 0, "cluster_entry": CLUSTER,
        "max_body": 1 << 20, **overrides}
    return _outcome(lambda: path.plain_records(sent, *args.values()))


# --- the plain path against its model, the Message path and its compiled twin ---------------


@settings(max_examples=1000)
@given(sent=st.lists(entries, min_size=1, max_size=3))
def test_the_plain_path_takes_exactly_the_sends_that_need_no_routing(
    sent: list[SentEntry],
) -> None:
    fall_back = _must_fall_back([e[3] for e in sent])
    waits = any(waits_for_store(decode_properties(e[3])) for e in sent)
    for path in PATHS:
        got = _plain(path, sent)
        assert (got is None) == fall_back
        if isinstance(got, tuple) and isinstance(got[0], list):  # not a refusal
            assert got[1] == waits


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


def _recorder(codes: list[int]) -> Callable[[int], bool]:
    def seen(code: int) -> bool:
        codes.append(code)
        return True

    return seen


@pytest.fixture
def small_broker(open_broker: OpenBroker) -> Broker:
    b = open_broker(max_message_size=MAX_BODY)
    topic(b, "T", queues=4)
    return b


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(
    send_topic=st.sampled_from(("T", "NEW", "%RETRY%g", tp.AUTO_CREATE_TOPIC,
                                tp.SCHEDULE_TOPIC)),
    sent=st.lists(plain_entries | entries, min_size=1, max_size=3),
    queue_id=st.integers(-1, 4),
    born=hosts(),
    born_ts=timestamps,
    reconsume=int32s,
    seed=st.integers(0, 2**32 - 1),
)
def test_a_send_stores_what_the_message_path_stores(
    small_broker: Broker, send_topic: str, sent: list[SentEntry], queue_id: int, born: Host,
    born_ts: int, reconsume: int, seed: int,
) -> None:
    """:meth:`Broker.put_sent` (the plain path when it takes the send) against
    :meth:`Broker.put` of the sent messages: the same records, tag codes and index keys, or
    the same refusal; and the producer's WAIT as sent."""
    broker = small_broker
    def general() -> tuple[SendResult, bool]:
        random.seed(seed)  # the same random queue for both paths
        messages = sent_messages(send_topic, sent, queue_id=queue_id, born_timestamp=born_ts,
                                 born_host=born, reconsume_times=reconsume)
        wait = any(waits_for_store(m.properties) for m in messages)  # routing drops WAIT
        return broker.put(messages), wait

    def fast() -> tuple[SendResult, bool]:
        random.seed(seed)
        return broker.put_sent(send_topic, sent, queue_id=queue_id, born_timestamp=born_ts,
                               born_host=born, reconsume_times=reconsume)

    event("plain" if _plain(SENT, sent) is not None else "routed")
    expected, got = _outcome(general), _outcome(fast)
    event("refused" if not isinstance(expected[0], SendResult) else expected[0].status.value)
    if not isinstance(expected[0], SendResult) or not isinstance(got[0], SendResult):
        assert got == expected
        return
    (want, want_wait), (have, have_wait) = expected, got
    assert (have.status, have.topic, have.queue_id, len(have.appended), have_wait) == (
        want.status, want.topic, want.queue_id, len(want.appended), want_wait)
    if have.ok:
        assert _stored(broker, have) == _stored(broker, want)


_ASTRAL_TAGS = "\U0001f600\u4e2d"


@settings(max_examples=1000)
@given(
    sent=st.lists(plain_entries | entries | st.tuples(
        st.sampled_from([INT32_MIN - 1, INT32_MAX + 1]), st.binary(max_size=16),
        int32s | st.sampled_from([INT32_MIN - 1, INT32_MAX + 1]), plain_texts()),
        min_size=1, max_size=4),
    send_topic=codec_topics | st.just("t" * 128),
    queue_id=int32s,
    born_ts=st.integers(INT64_MIN - 1, INT64_MAX + 1),
    reconsume=st.integers(INT32_MIN - 1, INT32_MAX + 1),
    cluster=st.text(_NO_SEPARATOR_CHARS, max_size=12).map(lambda c: cluster_property(c) or ""),
    max_body=st.sampled_from((0, 16, MAX_BODY, 1 << 20)),
)
@example(sent=[(0, b"", 0, f"TAGS\x01{_ASTRAL_TAGS}\x02KEYS\x01 a  \u00e9 \x02UNIQ_KEY\x01U")],
         send_topic="T", queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"x" * 17, 0, ""), (0, b"", 0, "A\x01" + "v" * 40000)], send_topic="T",
         queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=16)
@example(sent=[(0, b"", sf.TRANSACTION_ROLLBACK_TYPE, "UNIQ_KEY\x01U\x02KEYS\x01k")],
         send_topic="T", queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "".join(f"n{i}\x01v\x02" for i in range(40)) + "WAIT\x01FaLsE")],
         send_topic="T", queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "".join(f"n{i % 20}\x01v\x02" for i in range(40)))],
         send_topic="T", queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "A\x01" + "v" * (32767 - 3 - len(CLUSTER)))], send_topic="T",
         queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "A\x01" + "v" * (32767 - 2 - len(CLUSTER)))], send_topic="T",
         queue_id=0, born_ts=0, reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "A\x01\ud800")], send_topic="T", queue_id=0, born_ts=0,
         reconsume=0, cluster=CLUSTER, max_body=0)
@example(sent=[(0, b"", 0, "")], send_topic="T", queue_id=0, born_ts=0, reconsume=0,
         cluster="CLUSTER\x01\ud800\x02", max_body=0)
def test_the_compiled_plain_path_matches_the_pure_one(
    sent: list[SentEntry], send_topic: str, queue_id: int, born_ts: int, reconsume: int,
    cluster: str, max_body: int,
) -> None:
    """Every legal character in names and values (non-ASCII tags hash over UTF-16, keys
    over UTF-8), malformed strings, WAIT, the routing names, sizes at and past the limits,
    fields past their ranges: the same records and WAIT, or the same refusal or error."""
    if COMPILED_SENT is None:
        pytest.skip("the compiled kernels are not built")
    args = {"topic": send_topic, "queue_id": queue_id, "born_timestamp": born_ts,
            "reconsume_times": reconsume, "cluster_entry": cluster, "max_body": max_body}
    expected = _plain(PURE_SENT, sent, **args)
    event("routed" if expected is None else "plain" if isinstance(expected[0], list)  # type: ignore[index]
          else "refused or raised")
    assert _plain(COMPILED_SENT, sent, **args) == expected


@settings(max_examples=500)
@given(
    text=property_texts() | plain_texts(),
    sent_bodies=st.lists(
        st.binary(max_size=MAX_BODY + 64) | st.binary(max_size=64).map(bytearray)
        | st.text(max_size=8) | st.sampled_from([b"z" * COMPRESS_OVER, "z" * COMPRESS_OVER]),
        max_size=4),
    head=st.text(max_size=30) | st.sampled_from(["0A0102030D2F9C1E77A01234ABCDEF01"[:28]]),
    first=st.integers(0, 2**64) | st.sampled_from([0xFFFE, 0xFFFF, 0x10000]),
    send_topic=codec_topics | st.just("t" * 128),
    cluster=st.text(_NO_SEPARATOR_CHARS, max_size=12).map(lambda c: cluster_property(c) or ""),
    max_body=st.sampled_from((0, 16, MAX_BODY, 1 << 20)),
)
@example(text="", sent_bodies=[b"a", b"b"], head="H", first=0xFFFF, send_topic="T",
         cluster=CLUSTER, max_body=MAX_BODY)
@example(text=f"WAIT\x01false\x02TAGS\x01{_ASTRAL_TAGS}\x02KEYS\x01 a  \u00e9 \x02",
         sent_bodies=["x", b"y" * (COMPRESS_OVER + 1)], head="H", first=7, send_topic="T",
         cluster=CLUSTER, max_body=MAX_BODY)
def test_a_keyed_send_stores_what_its_entries_store(
    text: str, sent_bodies: list[bytes | str], head: str, first: int, send_topic: str,
    cluster: str, max_body: int,
) -> None:
    """An embedded batch (one properties string, a UNIQ_KEY each) read as it is by the
    compiled path gives what the pure path gives for its entries, one string per message:
    any shared string (a UNIQ_KEY or a routing name among them sends it the Message way),
    any key head, counters across the 16-bit wrap, bodies compressed at the threshold and
    past the largest."""
    keyed = KeyedSend(sent_bodies, text, UniqKeyRun(head, first, len(sent_bodies)))
    args = {"topic": send_topic, "cluster_entry": cluster, "max_body": max_body}
    expected = _plain(PURE_SENT, keyed.entries(), **args)
    event("routed" if expected is None else "plain" if isinstance(expected[0], list)  # type: ignore[index]
          else "refused or raised")
    for path in PATHS:
        assert _plain(path, keyed, **args) == expected  # type: ignore[arg-type]


@given(body=st.lists(st.tuples(int32s, st.binary(max_size=64) | st.sampled_from(
           [b"z" * (COMPRESS_OVER - 1), b"z" * COMPRESS_OVER]), property_texts()), max_size=4),
       sysflag=int32s, garbage=st.binary(max_size=40))
def test_the_compiled_batch_split_matches_the_pure_one(
    body: list[tuple[int, bytes, str]], sysflag: int, garbage: bytes,
) -> None:
    """A batch's entries as sends carry them: bodies deflated from COMPRESS_OVER bytes, the
    request's COMPRESSED bit replaced by each entry's own; malformed input the same error."""
    if COMPILED_SENT is None:
        pytest.skip("the compiled kernels are not built")
    raw = bytearray()
    for flag, b, text in body:
        props = text.encode(errors="surrogatepass")[:32767]
        raw += struct.pack(">iiiii", 22 + len(b) + len(props), 0, 0, flag, len(b)) + b
        raw += struct.pack(">h", len(props)) + props
    for case in (bytes(raw), bytes(raw) + garbage, memoryview(bytes(raw))):
        assert (_outcome(lambda c=case: COMPILED_SENT.sent_batch(c, sysflag))  # type: ignore[misc]
                == _outcome(lambda c=case: PURE_SENT.sent_batch(bytes(c), sysflag)))


@given(text=property_texts())
def test_routing_properties_always_take_the_message_path(text: str) -> None:
    for name in sorted(ROUTED):
        routed = f"{name}{NAME_VALUE_SEPARATOR}1{PROPERTY_SEPARATOR}"
        for path in PATHS:
            assert _plain(path, [(0, b"", 0, routed + text)]) is None
            if text.endswith(PROPERTY_SEPARATOR):
                assert _plain(path, [(0, b"", 0, text + routed)]) is None


@pytest.mark.parametrize("cluster", ["a\x01b", "a\x02b"])
def test_a_cluster_name_with_a_separator_turns_the_plain_path_off(
    open_broker: OpenBroker, cluster: str
) -> None:
    """The Message path refuses to encode such a CLUSTER; the plain path would have stored
    a string that decodes to other properties."""
    b = open_broker(broker_cluster_name=cluster)
    topic(b, "T")
    with pytest.raises(PropertyError):
        b.put_sent("T", [(0, b"x", 0, "")], queue_id=0, born_timestamp=0,
                   born_host=("127.0.0.1", 1))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: "pure" if p is PURE_SENT else "compiled")
def test_wait_is_dropped_and_cluster_appended_in_place(path: SentPath) -> None:
    cluster = cluster_property("C")
    assert cluster is not None
    sent = f"A\x011\x02{Prop.WAIT}\x01false\x02B\x012"  # Java: no trailing separator
    got = _plain(path, [(0, b"", 0, sent)], cluster_entry=cluster)
    assert isinstance(got, tuple)
    [record], wait = got
    stored = read_fields(record.data, 0, check_crc=True).properties
    assert (stored, wait) == ("A\x011\x02B\x012\x02CLUSTER\x01C\x02", False)


def test_a_lone_surrogate_takes_the_message_path() -> None:
    """A JSON header may escape one; the general path refuses it as unencodable."""
    for path in PATHS:
        assert _plain(path, [(0, b"", 0, "A\x01\ud800\x02")]) is None
