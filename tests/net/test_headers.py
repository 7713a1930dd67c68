"""Headers as data (evq.net.headers): every declared header survives the wire both ways, and
reading one refuses what RocketMQ's header decoding refuses, naming the field."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import evq.net.headers as headers
from evq.net.headers import BOOL, INT, LONG, STR, Header, Kind, header, wire
from evq.net.protocol import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    FrameDecoder,
    HeaderFieldError,
    RemotingCommand,
    SerializeType,
)


def _declared() -> list[type[Header]]:
    for mod in pkgutil.iter_modules(headers.__path__):
        importlib.import_module(f"{headers.__name__}.{mod.name}")
    found, todo = [], list(Header.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        # attrs makes a new class of a slotted one: the class it was made from is left out
        if cls.__module__.startswith(headers.__name__) and attrs.has(cls):
            found.append(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


DECLARED = _declared()
VALUES = {
    Kind.STR: st.text(),  # any string JSON and RocketMQ's binary header carry
    Kind.INT: st.integers(INT32_MIN, INT32_MAX),
    Kind.LONG: st.integers(INT64_MIN, INT64_MAX),
    Kind.BOOL: st.booleans(),
}


def instances(cls: type[Header]) -> st.SearchStrategy[Header]:
    """Any value of ``cls``: every field any value of its kind (an empty string only where
    the field does not read ``""`` as absent), ``None`` where that is its default."""
    args: dict[str, st.SearchStrategy[Any]] = {}
    for a, (name, w) in zip(attrs.fields(cls), cls.wires, strict=True):
        assert a.name == name
        values = VALUES[w.kind]
        if w.kind is Kind.STR and w.empty_as_absent:
            values = st.text(min_size=1)
        args[name] = st.none() | values if a.default is None else values
    return st.builds(cls, **args)


def test_the_package_declares_headers() -> None:
    assert len(DECLARED) >= 2


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: c.__qualname__)
@given(data=st.data(), serialize_type=st.sampled_from(SerializeType))
def test_a_header_reads_back_what_it_wrote_through_a_frame(
    cls: type[Header], data: st.DataObject, serialize_type: SerializeType
) -> None:
    h = data.draw(instances(cls))
    fields = cls.write(**attrs.asdict(h))
    assert all(isinstance(v, str) for v in fields.values())
    sent = attrs.evolve(RemotingCommand.request(10, fields), serialize_type=serialize_type)
    decoder = FrameDecoder()
    decoder.feed(sent.encode())
    got = decoder.next_command()
    assert got is not None
    assert cls.read(got.ext_fields) == h


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: c.__qualname__)
def test_a_missing_required_field_is_refused_by_its_name(cls: type[Header]) -> None:
    required = [(a.name, w) for a, (_, w) in zip(attrs.fields(cls), cls.wires, strict=True)
                if a.default is attrs.NOTHING]
    for _, w in required:
        others = {o.name: "1" for _, o in required if o is not w}
        with pytest.raises(HeaderFieldError, match=f"the custom field <{w.name}> is null"):
            cls.read(others)


@header
class Sample(Header):
    """Every kind, required and optional, as the tests below use them."""

    name: str = wire("name")
    count: int = wire("count", INT)
    offset: int = wire("offset", LONG, default=-1)
    force: bool = wire("isForce", BOOL, default=True)
    group: str | None = wire("group", STR, default=None, empty_as_absent=True)
    limit: int | None = wire("limit", INT, default=None)


def test_defaults_fill_absent_fields_and_none_is_left_out() -> None:
    s = Sample.read({"name": "n", "count": "3", "group": "", "unknown": "kept out"})
    assert s == Sample(name="n", count=3)
    assert Sample.write(name="n", count=3) == {"name": "n", "count": "3", "offset": "-1",
                                               "isForce": "true"}
    assert Sample.write(name="n", count=3, group="g", limit=7)["limit"] == "7"


def test_writing_takes_the_attributes_names_and_needs_the_required_ones() -> None:
    with pytest.raises(TypeError, match="count"):
        Sample.write(name="n")
    with pytest.raises(TypeError, match="isForce"):
        Sample.write(name="n", count=1, isForce=False)


@pytest.mark.parametrize(("field", "text", "kind"), [
    ("count", "2147483648", "int"),  # one past Java's int
    ("count", "1.5", "int"),
    ("offset", "9223372036854775808", "long"),
    ("offset", "", "long"),
    ("isForce", "yes", "boolean"),
])
def test_a_value_that_does_not_parse_is_refused_by_its_name(field: str, text: str,
                                                            kind: str) -> None:
    with pytest.raises(HeaderFieldError, match=f"<{field}> is not a valid {kind}"):
        Sample.read({"name": "n", "count": "1", field: text})


def test_java_spellings_of_numbers_and_booleans_are_read() -> None:
    s = Sample.read({"name": "", "count": "-2147483648", "offset": "+12", "isForce": "FALSE"})
    assert (s.name, s.count, s.offset, s.force) == ("", INT32_MIN, 12, False)


def test_a_header_is_declared_only_of_wire_fields() -> None:
    class Loose(Header):
        name: str = attrs.field(default="x")

    with pytest.raises(TypeError, match="not a wire"):
        header(Loose)
