"""The send header parsed once (evq.net.send_header): both namings, every field's range, and
the one topic that the ACL verifier and the send processor both read."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.net.codes import RequestCode
from evq.net.protocol import HeaderFieldError
from evq.net.send_header import (
    COMPILED_PARSE,
    MAX_RECONSUME_SINCE,
    PURE_PARSE,
    V2_NAMES,
    Parse,
    SendHeader,
    field,
    parse,
)
from tests.strategies import INT32_MAX, INT32_MIN, INT64_MAX

_LONG_TO_SHORT = {long: short for short, long in V2_NAMES.items()}
INT64_MIN = -INT64_MAX - 1
ints = st.integers(INT32_MIN, INT32_MAX)

headers = st.builds(
    SendHeader,
    topic=st.text(), queue_id=ints, sys_flag=ints,
    born_timestamp=st.integers(INT64_MIN, INT64_MAX), default_topic=st.text(),
    default_topic_queue_nums=ints, flag=ints, properties=st.text(), reconsume_times=ints,
    max_reconsume_times=st.none() | ints, batch=st.booleans(),
)


def fields_of(h: SendHeader, v2: bool) -> dict[str, str]:
    long = {
        "producerGroup": "PG", "topic": h.topic, "defaultTopic": h.default_topic,
        "defaultTopicQueueNums": str(h.default_topic_queue_nums), "queueId": str(h.queue_id),
        "sysFlag": str(h.sys_flag), "bornTimestamp": str(h.born_timestamp), "flag": str(h.flag),
        "properties": h.properties, "reconsumeTimes": str(h.reconsume_times),
        "batch": "true" if h.batch else "false",
    }
    if h.max_reconsume_times is not None:
        long["maxReconsumeTimes"] = str(h.max_reconsume_times)
    return {_LONG_TO_SHORT[k]: v for k, v in long.items()} if v2 else long


@given(headers, st.booleans())
def test_either_naming_parses_to_the_header_it_was_written_from(h: SendHeader, v2: bool
                                                                ) -> None:
    code = RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    fields = fields_of(h, v2)
    assert parse(code, MAX_RECONSUME_SINCE, fields) == h
    assert field(code, fields, "topic") == h.topic
    # Before V3_4_9 Java does not read maxReconsumeTimes.
    old = parse(code, MAX_RECONSUME_SINCE - 1, fields)
    assert old.max_reconsume_times is None


@given(headers, st.text())
def test_a_v2_header_is_read_by_its_short_names_only(h: SendHeader, stray: str) -> None:
    """A V2 send that also carries ``topic`` is stored (and so ACL-checked) under ``b``."""
    fields = fields_of(h, v2=True) | {"topic": stray, "queueId": "x"}
    for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        parsed = parse(code, MAX_RECONSUME_SINCE, fields)
        assert parsed.topic == field(code, fields, "topic") == h.topic
        assert parsed.queue_id == h.queue_id


def test_absent_optional_fields_take_rocketmqs_defaults() -> None:
    h = parse(RequestCode.SEND_MESSAGE, 0,
              {"topic": "T", "queueId": "1", "sysFlag": "0", "bornTimestamp": "5"})
    assert h == SendHeader(topic="T", queue_id=1, sys_flag=0, born_timestamp=5)
    assert (h.default_topic, h.default_topic_queue_nums, h.flag, h.batch) == ("TBW102", 4, 0,
                                                                                False)
    batch = parse(RequestCode.SEND_BATCH_MESSAGE, 0, {"b": "T", "e": "1", "f": "0", "g": "5"})
    assert batch.batch


@pytest.mark.parametrize("missing", ["topic", "queueId", "sysFlag", "bornTimestamp"])
@pytest.mark.parametrize("v2", [False, True])
def test_a_missing_required_field_is_named_by_its_long_name(missing: str, v2: bool) -> None:
    h = SendHeader(topic="T", queue_id=1, sys_flag=0, born_timestamp=5)
    fields = fields_of(h, v2)
    del fields[_LONG_TO_SHORT[missing] if v2 else missing]
    code = RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
    with pytest.raises(HeaderFieldError, match=f"<{missing}> is null"):
        parse(code, 0, fields)


@pytest.mark.parametrize(("name", "text"), [
    ("queueId", str(INT32_MAX + 1)), ("bornTimestamp", str(INT64_MAX + 1)), ("flag", "1.5"),
    ("batch", "yes"), ("reconsumeTimes", "")])
def test_a_field_that_does_not_parse_is_named(name: str, text: str) -> None:
    fields = fields_of(SendHeader(topic="T", queue_id=1, sys_flag=0, born_timestamp=5), False)
    fields[name] = text
    with pytest.raises(HeaderFieldError, match=f"<{name}> is not a valid"):
        parse(RequestCode.SEND_MESSAGE, 0, fields)


# --- the compiled twin (evq/net/frame_kernels.pyx) ----------------------------------------------


def _outcome(parse_fn: Parse, code: int, version: int, fields: Mapping[str, str]) -> object:
    try:
        return "value", parse_fn(code, version, fields)
    except Exception as exc:  # the comparison is the point: any error must match
        return "raised", type(exc), str(exc)


_numbers = st.one_of(
    st.integers(0, 10**20).map(str),  # around the nine- and eighteen-digit bounds
    st.integers(-(2**63), 2**63).map(str),
    st.integers(0, 999).map(lambda n: f"+{n}"),
    st.integers(0, 99).map(lambda n: "0" * 12 + str(n)),
    st.sampled_from(["", " 1", "1 ", "\u0663", "\uff11", "1.5", "0x10", "true", "TRUE", "1",
                     "0", "false", "False", "yes"]),
    st.text(max_size=4),
)
_names = st.sampled_from(sorted({*V2_NAMES, *V2_NAMES.values(), "x"}))


@pytest.mark.skipif(COMPILED_PARSE is None, reason="the compiled kernels are not built")
@given(st.sampled_from([RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                        RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2]),
       st.sampled_from([0, MAX_RECONSUME_SINCE - 1, MAX_RECONSUME_SINCE, 2**40]),
       st.dictionaries(_names, _numbers), headers, st.booleans())
def test_the_compiled_parse_gives_what_the_pure_one_gives(
    code: int, version: int, fields: dict[str, str], h: SendHeader, v2: bool,
) -> None:
    """Value for value and error for error: random fields alone, and a well-formed header
    with some of them laid over it."""
    for case in (fields, fields_of(h, v2) | fields, fields_of(h, v2)):
        assert _outcome(COMPILED_PARSE, code, version, case) == _outcome(  # type: ignore[arg-type]
            PURE_PARSE, code, version, case)
    # Not a dict: the pure parse reads it (any Mapping).
    frozen = MappingProxyType(fields_of(h, v2))
    assert _outcome(COMPILED_PARSE, code, version, frozen) == _outcome(  # type: ignore[arg-type]
        PURE_PARSE, code, version, frozen)


def test_the_compiled_parse_is_the_one_in_use_where_built() -> None:
    assert parse is (COMPILED_PARSE or PURE_PARSE)
