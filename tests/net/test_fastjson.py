"""fastjson's shape: bare integer keys and inline MessageQueue keys, read back exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.queues import MessageQueue
from evq.net import fastjson
from tests.strategies import message_queues

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
# Text keys never start with U+E001: loads uses that private-use character to mark bare keys.
_text_keys = st.text(max_size=8).filter(lambda k: not k.startswith("\ue001"))
_keys = st.integers(-(2**63), 2**63 - 1) | _text_keys | message_queues()
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@given(_values)
def test_what_dumps_writes_loads_reads_back(value: object) -> None:
    assert fastjson.loads(fastjson.dumps(value)) == value


@given(st.dictionaries(_text_keys, _scalars | st.lists(_scalars, max_size=3), max_size=6))
def test_standard_json_reads_as_json_does(value: dict[str, object]) -> None:
    text = json.dumps(value)
    assert fastjson.loads(text) == json.loads(text)


def test_text_inside_strings_is_never_rewritten() -> None:
    text = r'{"a":"{1:2,3:4}","b\",5:":[",6:"],7:"x\\",8:"y,{\"topic\":1}:"}'
    assert fastjson.loads(text) == {"a": "{1:2,3:4}", 'b",5:': [",6:"], 7: "x\\",
                                    8: 'y,{"topic":1}:'}


def test_java_layouts_with_whitespace() -> None:
    route = '{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",\n\t\t1 : "10.0.0.2:10911"},' \
            '"brokerName":"a","cluster":"C"}],"filterServerTable":{},"queueDatas":[]}'
    assert fastjson.loads(route)["brokerDatas"][0]["brokerAddrs"] == {
        0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    offsets = '{"offsetTable":{\n\t{"brokerName":"b","queueId":3,"topic":"T"} :7}}'
    assert fastjson.loads(offsets) == {"offsetTable": {MessageQueue("T", "b", 3): 7}}


@pytest.mark.parametrize("text", [
    "", "{", "{a:1}", "{1.5:2}", "[1:2]", "{1:}", '{{"topic":"T"}:1}', '{{"queueId":null}:1}',
])
def test_what_is_not_fastjson_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)
