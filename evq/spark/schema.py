"""The rows of the ``evq`` format: one per message, the MessageExt fields a pipeline needs."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable
from typing import Any, Final, NoReturn

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from evq.domain.message import Message, Prop
from evq.domain.record import offset_msg_id
from evq.spark.options import BodyAs, OptionError

BASE_SCHEMA: Final = (
    "topic STRING, brokerName STRING, queueId INT, queueOffset BIGINT, msgId STRING, "
    "uniqKey STRING, tags STRING, keys ARRAY<STRING>, properties MAP<STRING, STRING>, "
    "body BINARY, bornTimestamp TIMESTAMP, storeTimestamp TIMESTAMP, bornHost STRING, "
    "storeHost STRING, reconsumeTimes INT"
)


def schema_ddl(body_as: BodyAs, body_schema: str | None) -> str:
    """``bodyAs=string`` adds ``value STRING``; ``bodyAs=json`` adds ``value STRUCT<...>``
    of the ``bodySchema`` DDL, which Spark parses (the reader gets the parsed type)."""
    if body_as is BodyAs.STRING:
        return BASE_SCHEMA + ", value STRING"
    if body_as is BodyAs.JSON:
        check_body_schema(body_schema or "")
        return BASE_SCHEMA + f", value STRUCT<{body_schema}>"
    return BASE_SCHEMA


_TOKEN: Final = re.compile(r"\s*(?:(`(?:[^`]|``)+`|'(?:[^'\\]|\\.)*'|\w+)|([<>(),:]))")
_PLAIN_TYPES: Final = frozenset({
    "BOOLEAN", "TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG",
    "FLOAT", "REAL", "DOUBLE", "DECIMAL", "DEC", "NUMERIC", "STRING", "CHAR", "VARCHAR",
    "DATE", "TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ"})


def check_body_schema(ddl: str) -> None:
    """Raise :class:`OptionError` naming ``bodySchema`` unless ``ddl`` is a field list
    (``name [:] type [NOT NULL] [COMMENT '...'], ...``) of the types a JSON body converts to.

    Spark parses the DDL itself, but only once the whole schema is assembled, and its syntax
    error names neither the option nor the mistake's place in it; this walk finds the common
    mistakes first and keeps a stray ``>`` from closing the ``value`` struct early."""
    tokens: list[str] = []
    pos = 0
    while pos < len(ddl.rstrip()):
        m = _TOKEN.match(ddl, pos)
        if m is None:
            raise OptionError("bodySchema", f"unexpected {ddl[pos:].strip()[:20]!r} in {ddl!r}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    tokens.reverse()  # a stack: tokens.pop() is the next one

    def fail(expected: str) -> NoReturn:
        found = repr(tokens[-1]) if tokens else "the end"
        raise OptionError("bodySchema", f"expected {expected}, found {found} in {ddl!r}")

    def take(*words: str) -> bool:
        if tokens and tokens[-1].upper() in words:
            tokens.pop()
            return True
        return False

    def expect(word: str, where: str) -> None:
        if not take(word):
            fail(f"{word!r} {where}")

    def fields(closing: str | None) -> None:
        while True:
            if not tokens or tokens[-1][0] in "<>(),:'":
                fail("a field name")
            tokens.pop()
            take(":")
            kind()
            if take("NOT"):
                expect("NULL", "after NOT")
            if take("COMMENT"):
                if not tokens or not tokens[-1].startswith("'"):
                    fail("a quoted comment")
                tokens.pop()
            if not take(","):
                break
        if closing is not None:
            expect(closing, "or ',' after a field")

    def kind() -> None:
        if take("ARRAY"):
            expect("<", "after ARRAY")
            kind()
            expect(">", "closing ARRAY")
        elif take("MAP"):
            expect("<", "after MAP")
            kind()
            expect(",", "between MAP's key and value types")
            kind()
            expect(">", "closing MAP")
        elif take("STRUCT"):
            expect("<", "after STRUCT")
            if not take(">"):
                fields(">")
        elif tokens and tokens[-1].upper() in _PLAIN_TYPES:
            tokens.pop()
            if take("("):
                while tokens and tokens[-1].isdigit():
                    tokens.pop()
                    if not take(","):
                        break
                expect(")", "closing the type's parameters")
        else:
            fail(f"a type ({', '.join(sorted(_PLAIN_TYPES))}, ARRAY<>, MAP<>, STRUCT<>)")

    fields(None)
    if tokens:
        fail("',' between fields")


Convert = Callable[[Any], Any]


def json_converter(kind: DataType) -> Convert:
    """A function from a parsed JSON value to the Python value Spark wants for ``kind``.

    JSON knows few types and producers are loose with them, so a value converts when its
    meaning is plain: numbers (or numeric strings) to the numeric types, within range and
    precision; ISO-8601 text or epoch milliseconds to timestamps; anything to a string (JSON
    text for non-strings).  A value that does not convert is null, as Spark's ``from_json``
    makes it in PERMISSIVE mode, so one odd message never fails a query."""
    if isinstance(kind, StructType):
        members = [(f.name, json_converter(f.dataType)) for f in kind.fields]
        return lambda v: (tuple(conv(v.get(name)) for name, conv in members)
                          if isinstance(v, dict) else None)
    if isinstance(kind, ArrayType):
        element = json_converter(kind.elementType)
        return lambda v: [element(e) for e in v] if isinstance(v, list) else None
    if isinstance(kind, MapType):
        key, value = json_converter(kind.keyType), json_converter(kind.valueType)
        return lambda v: ({k: value(x) for raw, x in v.items() if (k := key(raw)) is not None}
                          if isinstance(v, dict) else None)
    return _lenient(_scalar(kind))


def _lenient(convert: Convert) -> Convert:
    def run(v: Any) -> Any:
        if v is None:
            return None
        try:
            return convert(v)
        except (ValueError, TypeError, ArithmeticError):
            return None
    return run


def _number(v: Any) -> int | float | str:
    """A JSON number, or a string that may hold one; never a boolean (JSON's true is no 1)."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise TypeError(v)
    return v


def _integral(bits: int) -> Convert:
    def convert(v: Any) -> int | None:
        n = _number(v)
        if isinstance(n, float) and not n.is_integer():
            return None
        out = int(n)
        return out if -(1 << (bits - 1)) <= out < 1 << (bits - 1) else None
    return convert


def _decimal(precision: int, scale: int) -> Convert:
    step = decimal.Decimal(1).scaleb(-scale)

    def convert(v: Any) -> decimal.Decimal | None:
        d = decimal.Decimal(str(_number(v)).strip()).quantize(step, decimal.ROUND_HALF_UP)
        return d if d.is_finite() and d.adjusted() < precision - scale else None
    return convert


def _timestamp(v: Any) -> dt.datetime:
    if isinstance(v, str):
        when = dt.datetime.fromisoformat(v)
        return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
    return _when(_number(v))  # type: ignore[arg-type]


def _scalar(kind: DataType) -> Convert:
    if isinstance(kind, BooleanType):
        return lambda v: v if isinstance(v, bool) else None
    if isinstance(kind, StringType | CharType | VarcharType):
        return lambda v: v if isinstance(v, str) else json.dumps(v)
    for integral, bits in ((ByteType, 8), (ShortType, 16), (IntegerType, 32), (LongType, 64)):
        if isinstance(kind, integral):
            return _integral(bits)
    if isinstance(kind, FloatType | DoubleType):
        return lambda v: float(_number(v))
    if isinstance(kind, DecimalType):
        return _decimal(kind.precision, kind.scale)
    if isinstance(kind, TimestampType):
        return _timestamp
    if isinstance(kind, TimestampNTZType):
        return lambda v: _timestamp(v).astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(kind, DateType):
        return lambda v: dt.date.fromisoformat(v)
    raise OptionError("bodySchema", f"a JSON body does not convert to {kind.simpleString()}")


def _when(ms: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def to_row(m: Message, broker_name: str, body_as: BodyAs,
           json_value: Convert | None = None) -> tuple[Any, ...]:
    """The row of ``m``; ``json_value`` (from :func:`json_converter`) makes the ``value`` of
    ``bodyAs=json``."""
    body = m.payload()
    row: tuple[Any, ...] = (
        m.topic, broker_name, m.queue_id, m.queue_offset,
        offset_msg_id(m.store_host, m.commit_log_offset), m.properties.get(Prop.UNIQ_KEY),
        m.tags, list(m.keys), dict(m.properties), body, _when(m.born_timestamp),
        _when(m.store_timestamp), _host(m.born_host), _host(m.store_host), m.reconsume_times)
    if body_as is BodyAs.STRING:
        return (*row, body.decode("utf-8", errors="replace"))
    if body_as is BodyAs.JSON:
        assert json_value is not None
        try:
            doc = json.loads(body)
        except ValueError:
            return (*row, None)  # a body that is not JSON: null, like from_json's PERMISSIVE
        return (*row, json_value(doc))
    return row
