"""Reading fastjson's bare integer keys; writing in its key order."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.net import fastjson

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
_keys = st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


def java_style(value: object, spaced: bool) -> str:
    """What fastjson writes: integer keys bare, text keys quoted (optionally pretty)."""
    gap = "\n\t " if spaced else ""
    if isinstance(value, dict):
        items = (f"{gap}{k if isinstance(k, int) else json.dumps(k)}{gap}:{gap}"
                 f"{java_style(v, spaced)}" for k, v in value.items())
        return "{" + ",".join(items) + gap + "}"
    if isinstance(value, list):
        return "[" + ",".join(f"{gap}{java_style(v, spaced)}" for v in value) + "]"
    return json.dumps(value)


def quoted(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): quoted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [quoted(v) for v in value]
    return value


@given(_values, st.booleans())
def test_bare_integer_keys_read_as_their_quoted_form(value: object, spaced: bool) -> None:
    assert fastjson.loads(java_style(value, spaced)) == quoted(value)


@given(_values)
def test_standard_json_reads_as_json_does(value: object) -> None:
    text = json.dumps(quoted(value))
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text)


def test_text_inside_strings_is_never_rewritten() -> None:
    text = r'{"a":"{1:2,3:4}","b\",5:":[",6:"],7:"x\\",8:"y"}'
    assert fastjson.loads(text) == {"a": "{1:2,3:4}", 'b",5:': [",6:"], "7": "x\\", "8": "y"}


def test_route_as_a_java_name_server_writes_it() -> None:
    body = b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},' \
           b'"brokerName":"a","cluster":"C"}],"filterServerTable":{},"queueDatas":[]}'
    assert fastjson.loads(body)["brokerDatas"][0]["brokerAddrs"] == {
        "0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}


@pytest.mark.parametrize("text", ["", "{", "{a:1}", "{1.5:2}", "[1:2]", "{1:}", b"\xff"])
def test_what_is_not_json_even_with_quoted_keys_is_refused(text: str | bytes) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)


def test_dumps_is_compact_sorted_ascii() -> None:
    assert fastjson.dumps({"b": 1, "a": {"z": "é", "y": [1, 2]}}) == \
        b'{"a":{"y":[1,2],"z":"\\u00e9"},"b":1}'
