"""Request and response headers as data: one declaration a header, read once, typed.

RocketMQ carries a request's arguments as a header object (``PullMessageRequestHeader``,
``QueryConsumerOffsetResponseHeader``, ...) flattened into the command's ``extFields``, every
value a string.  Each header evq speaks is declared once, in a module of this package named
for the requests it belongs to, as a :class:`Header` subclass made by :func:`header`: its
fields are :func:`wire` fields, each naming the Java field it travels as and its kind (a
string, a Java ``int`` or ``long``, a boolean) and its default when the peer leaves it out.
Client and server use the same declaration: the side that sends writes the header's fields
with ``SomeHeader.write(field=value, ...)``; the side that receives calls
``SomeHeader.read(cmd.ext_fields)`` once and reads typed attributes.  A field name spelled
twice, or a default that the two sides disagree on, cannot happen.

Reading is RocketMQ's header decoding: a required field that is absent is refused as
``the custom field <name> is null``, a value that does not parse as its kind is refused
naming the field (both :class:`~evq.net.protocol.HeaderFieldError`, answered SYSTEM_ERROR with
that remark), and fields the declaration does not name are ignored (newer clients send more).
Writing spells each value as the peer reads it and leaves out fields whose value is ``None``,
as Java leaves out null fields; it makes no header object, since a sender has no use for one.

Both directions are generated per class when it is declared (as attrs generates
``__init__``): straight-line code a field at a time, as fast as a hand-written dict literal,
because some of these headers are read or written on every request of the hot path (a send's
answer).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Self, TypeVar

import attrs

from evq.net.protocol import (
    HeaderFieldError,
    parse_bool_field,
    parse_int_field,
    parse_long_field,
)


class Kind(enum.Enum):
    """How a field's value is spelled in ``extFields``."""

    STR = "str"
    INT = "int"
    """A Java ``int``: 32-bit signed, decimal."""
    LONG = "long"
    """A Java ``long``: 64-bit signed, decimal."""
    BOOL = "bool"
    """``true`` / ``false`` as Java's ``Boolean.toString`` writes them."""


STR: Final = Kind.STR
INT: Final = Kind.INT
LONG: Final = Kind.LONG
BOOL: Final = Kind.BOOL

_PARSERS: Final[dict[Kind, Callable[[str, str], object] | None]] = {
    Kind.STR: None, Kind.INT: parse_int_field, Kind.LONG: parse_long_field,
    Kind.BOOL: parse_bool_field,
}
_WIRE: Final = "evq.net.headers.wire"
REQUIRED: Final = attrs.NOTHING
"""The default of a field a header cannot do without."""


@attrs.frozen(slots=True)
class Wire:
    """What a field is on the wire."""

    name: str
    """The Java field name: the key in ``extFields``."""
    kind: Kind
    empty_as_absent: bool
    """Read ``""`` as absent: for fields a client fills with an empty string when it means
    "none" (the C++ client's unused group in UNREGISTER_CLIENT)."""


def wire(name: str, kind: Kind = Kind.STR, *, default: Any = REQUIRED,
         empty_as_absent: bool = False) -> Any:
    """A header field travelling as ``name``; without a ``default`` it is required."""
    return attrs.field(default=default, metadata={_WIRE: Wire(name, kind, empty_as_absent)})


class Header:
    """A header declared with :func:`header`.

    ``read`` and ``write`` are replaced on each declared class by code generated for its
    fields; the definitions here only give them their types.
    """

    __slots__ = ()
    wires: ClassVar[tuple[tuple[str, Wire], ...]] = ()
    """(attribute, wire) of each field, in declaration order."""

    @classmethod
    def read(cls, fields: Mapping[str, str]) -> Self:
        """The header in ``fields`` (a command's ``ext_fields``); a
        :class:`~evq.net.protocol.HeaderFieldError` names a field that is missing or
        does not parse."""
        raise TypeError(f"{cls.__name__} is not declared with header()")

    @classmethod
    def write(cls, **values: Any) -> dict[str, str]:
        """The ``extFields`` of a header of these values (keyword arguments named as its
        attributes; those left out take their defaults): every value a string, ``None``
        values left out."""
        raise TypeError(f"{cls.__name__} is not declared with header()")


H = TypeVar("H", bound=type[Header])


def header(cls: H) -> H:
    """Declare ``cls`` (a :class:`Header` subclass of :func:`wire` fields) a header: a
    slotted attrs class whose fields are keyword-only, with its ``read`` and ``write``
    generated.  Not frozen, as a header read on every request is made by storing its slots
    (a frozen class's would each go through ``object.__setattr__``); nothing changes one once
    it is read."""
    if not issubclass(cls, Header):
        raise TypeError(f"{cls.__name__} must subclass Header")
    made: Any = attrs.define(slots=True, kw_only=True)(cls)
    wires = []
    for a in attrs.fields(made):
        w = a.metadata.get(_WIRE)
        if w is None:
            raise TypeError(f"{made.__name__}.{a.name} is not a wire() field")
        wires.append((a.name, w))
    made.wires = tuple(wires)
    made.read = staticmethod(_reader(made, attrs.fields(made)))
    made.write = staticmethod(_writer(made, attrs.fields(made)))
    return made  # type: ignore[no-any-return]


def _null(name: str) -> HeaderFieldError:
    return HeaderFieldError(f"the custom field <{name}> is null")


def _reader(cls: type[Header], fields: tuple[attrs.Attribute[Any], ...]
            ) -> Callable[[Mapping[str, str]], Any]:
    # The instance is made without __init__, each slot stored as it is read: a header of a
    # hot request is read on every one of them, and keyword matching would double the cost.
    env: dict[str, object] = {"new": object.__new__, "cls": cls, "null": _null}
    lines = ["def read(fields):", "    h = new(cls)"]
    for i, a in enumerate(fields):
        w: Wire = a.metadata[_WIRE]
        parser = _PARSERS[w.kind]
        env[f"parse{i}"], env[f"default{i}"] = parser, a.default
        value = "v" if parser is None else f"parse{i}({w.name!r}, v)"
        absent = "v is None or v == ''" if w.empty_as_absent else "v is None"
        lines.append(f"    v = fields.get({w.name!r})")
        if a.default is REQUIRED:
            lines += [f"    if {absent}:", f"        raise null({w.name!r})",
                      f"    h.{a.name} = {value}"]
        else:
            lines.append(f"    h.{a.name} = default{i} if {absent} else {value}")
    lines.append("    return h")
    return _compiled(cls, "read", lines, env)


def _writer(cls: type[Header], fields: tuple[attrs.Attribute[Any], ...]
            ) -> Callable[..., dict[str, str]]:
    env: dict[str, object] = {}
    params, always, optional = [], [], []
    for i, a in enumerate(fields):
        w: Wire = a.metadata[_WIRE]
        if a.default is REQUIRED:
            params.append(a.name)
        else:
            env[f"default{i}"] = a.default
            params.append(f"{a.name}=default{i}")
        text = {Kind.STR: a.name, Kind.BOOL: f"('true' if {a.name} else 'false')"}.get(
            w.kind, f"str({a.name})")
        (optional if a.default is None else always).append((a.name, w.name, text))
    lines = [f"def write(*, {', '.join(params)}):",
             "    out = {" + ", ".join(f"{name!r}: {text}" for _, name, text in always) + "}"]
    for attr, name, text in optional:
        lines += [f"    if {attr} is not None:", f"        out[{name!r}] = {text}"]
    lines.append("    return out")
    return _compiled(cls, "write", lines, env)


def _compiled(cls: type[Header], name: str, lines: list[str], env: dict[str, object]
              ) -> Callable[..., Any]:
    source = "\n".join(lines) + "\n"
    code = compile(source, f"<evq.net.headers {cls.__qualname__}.{name}>", "exec")
    exec(code, env)  # the generated source is built above from field names alone
    fn = env[name]
    assert callable(fn)
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    return fn
