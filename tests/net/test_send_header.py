"""The send header parsed once (evq.net.send_header): both namings, every field's range, and
the one topic that the ACL verifier and the send processor both read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.net.codes import RequestCode
from evq.net.protocol import HeaderFieldError
from evq.net.send_header import MAX_RECONSUME_SINCE, V2_NAMES, SendHeader, field, parse
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
