"""Stored records to Arrow columns: the record batches a read task hands Spark.

Spark 4's Python data source takes ``pyarrow.RecordBatch`` es from ``read()`` as well as
rows.  Rows cost Python work per message and field twice over (building each tuple, then
Spark's own per-value converters turning them into Arrow), which held a ``count()`` to a
tenth of what the broker serves.  Here one block of back-to-back stored records (a pull
answer, or records read from a store) becomes one batch: a Python loop only walks the record
sizes and checks body CRCs; every field is gathered for all records at once with numpy from
the fixed offsets of the record layout (:mod:`evq.domain.record` draws it), and the
properties are split on their separator bytes the same way.

The fast path takes the records evq writes: v1 magic, IPv4 hosts, uncompressed bodies,
properties without a repeated name.  A block holding anything else is decoded message by
message (:func:`evq.spark.schema.to_row`) and its rows converted to columns, so both paths
give the same values.  ``bodyAs=json`` parses a block's bodies with pyarrow's JSON reader when
the body schema has only types that reader converts exactly as :func:`json_converter` does
and the bodies are one-line objects; the reader refuses any value it cannot convert, and then
the block's bodies are parsed one by one with the lenient per-value rules (nulls for what does
not convert).
"""

from __future__ import annotations

import io
import json
from typing import Final

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from evq.client.pulling import restore_topic
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.filters import Subscription, parse_subscription
from evq.domain.message import KEY_SEPARATOR, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, Prop
from evq.domain.record import (
    INT32,
    MAGIC_V1,
    MIN_RECORD_SIZE,
    RecordError,
    _host_from,
    body_crc,
    iter_records,
)
from evq.spark.options import BodyAs, SourceOptions
from evq.spark.schema import Convert, _host, json_converter, to_row

HEADER: Final = np.dtype([
    ("size", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sysflag", ">i4"),
    ("born_timestamp", ">i8"), ("born_host", ">u8"), ("store_timestamp", ">i8"),
    ("store_host", ">u8"), ("reconsume_times", ">i4"), ("prepared_offset", ">i8"),
    ("body_length", ">i4"),
])
"""Bytes 0..88 of a v1 record with IPv4 hosts: everything before the body."""
_HEADER_BYTES: Final = np.arange(HEADER.itemsize)
_MSG_ID_BYTES: Final = np.r_[64:72, 28:36]
"""offsetMsgId: the store host's 8 bytes, then the 8-byte physical offset."""
_HEX: Final = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SLOW_FLAGS: Final = sf.BORNHOST_V6 | sf.STOREHOST_V6 | sf.COMPRESSED
_PROP_SEP: Final = ord(PROPERTY_SEPARATOR)
_NAME_SEP: Final = ord(NAME_VALUE_SEPARATOR)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks a batch against (the one its worker derives)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def json_exact(kind: DataType) -> bool:
    """True when pyarrow's JSON reader, given ``kind``, either converts a value exactly as
    :func:`json_converter` does or refuses it: booleans, whole numbers in range, doubles,
    strings, and structs and arrays of them (a float32, a decimal or a timestamp is parsed
    differently, a map not at all)."""
    if isinstance(kind, StructType):
        return all(json_exact(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return json_exact(kind.elementType)
    return type(kind) in (BooleanType, ByteType, ShortType, IntegerType, LongType, DoubleType,
                          StringType)


@attrs.frozen(slots=True)
class BatchMaker:
    """Turns the blocks of one queue range into record batches of the source's schema."""

    arrow: pa.Schema
    broker: str
    body_as: BodyAs
    json_value: Convert | None
    json_fast: bool
    sub: Subscription

    @classmethod
    def of(cls, opts: SourceOptions, schema: StructType, broker: str) -> BatchMaker:
        value = schema["value"].dataType if opts.body_as is BodyAs.JSON else None
        return cls(arrow_schema(schema), broker, opts.body_as,
                   None if value is None else json_converter(value),
                   value is not None and json_exact(value),
                   parse_subscription("T", opts.expression, opts.expression_type))

    def batch(self, block: bytes, end: int) -> pa.RecordBatch:
        """The rows of ``block``'s records below queue offset ``end`` that the subscription
        selects.  Raises :class:`RecordError` for a block that is not whole records."""
        starts = _starts(block)
        if not len(starts):
            return self._by_message(block, end)
        u8 = np.frombuffer(block, np.uint8)
        head = np.ascontiguousarray(u8[starts[:, None] + _HEADER_BYTES]).view(HEADER)[:, 0]
        if (head["magic"] != MAGIC_V1).any() or (head["sysflag"] & _SLOW_FLAGS).any():
            return self._by_message(block, end)
        built = self._columns(block, u8, starts, head)
        if built is None:
            return self._by_message(block, end)
        keep = head["queue_offset"] < end
        if not self.sub.matches_all:
            tags, props = built.column("tags").to_pylist(), built.column("properties")
            keep &= np.array([self.sub.matches(t, dict(p)) for t, p in
                              zip(tags, props.to_pylist(), strict=True)], dtype=bool)
        return built if keep.all() else built.filter(pa.array(keep))

    def _columns(self, block: bytes, u8: np.ndarray, starts: np.ndarray, head: np.ndarray
                 ) -> pa.RecordBatch | None:
        n = len(starts)
        ends = starts + head["size"]
        body_at = starts + HEADER.itemsize
        body_len = head["body_length"].astype(np.int64)
        body_end = body_at + body_len
        if ((body_len < 0) | (body_end + 3 > ends)).any():
            raise RecordError("bad body length")
        view = memoryview(block)
        for a, b, crc in zip(body_at.tolist(), body_end.tolist(), head["crc"].tolist(),
                             strict=True):
            if body_crc(view[a:b]) != crc:
                raise RecordError(f"body CRC mismatch at {a - HEADER.itemsize}")
        topic_len = u8[body_end].astype(np.int64)
        topic_at = body_end + 1
        props_len_at = topic_at + topic_len
        if ((topic_len == 0) | (props_len_at + 2 > ends)).any():
            raise RecordError("bad topic length")
        props_len = (u8[props_len_at].astype(np.int64) << 8) | u8[props_len_at + 1]
        props_at = props_len_at + 2
        if (props_len >= 0x8000).any() or (props_at + props_len != ends).any():
            raise RecordError("record fields do not add up to its total size")

        props = _properties(*_gather(u8, props_at, props_len), n, self.arrow)
        if props is None:
            return None  # a name given twice: the message path keeps the last, as a dict
        topic = _utf8(*_gather(u8, topic_at, topic_len), n)
        if pc.any(pc.starts_with(topic, tp.RETRY_PREFIX)).as_py():
            real = pc.map_lookup(props, Prop.RETRY_TOPIC, "last")
            topic = pc.if_else(pc.fill_null(pc.greater(pc.binary_length(real), 0), False),
                               real, topic)
        body_offsets, body_data = _gather(u8, body_at, body_len)
        body = pa.Array.from_buffers(pa.binary(), n, [None, *_buffers(body_offsets,
                                                                      body_data)])
        columns = {
            "topic": topic,
            "brokerName": pa.repeat(pa.scalar(self.broker), n),
            "queueId": pa.array(head["queue_id"].astype(np.int32)),
            "queueOffset": pa.array(head["queue_offset"].astype(np.int64)),
            "msgId": _msg_ids(u8, starts),
            "uniqKey": pc.map_lookup(props, Prop.UNIQ_KEY, "last"),
            "tags": pc.map_lookup(props, Prop.TAGS, "last"),
            "keys": _keys(pc.map_lookup(props, Prop.KEYS, "last"), n,
                          self.arrow.field("keys").type),
            "properties": props,
            "body": body,
            "bornTimestamp": _timestamps(head["born_timestamp"]),
            "storeTimestamp": _timestamps(head["store_timestamp"]),
            "bornHost": _hosts(head["born_host"]),
            "storeHost": _hosts(head["store_host"]),
            "reconsumeTimes": pa.array(head["reconsume_times"].astype(np.int32)),
        }
        if self.body_as is BodyAs.STRING:
            columns["value"] = _text(body)
        elif self.body_as is BodyAs.JSON:
            columns["value"] = self._json(body, body_offsets, body_data)
        return pa.RecordBatch.from_arrays(
            [columns[f.name].cast(f.type) for f in self.arrow], schema=self.arrow)

    def _json(self, body: pa.BinaryArray, offsets: np.ndarray, data: np.ndarray) -> pa.Array:
        kind = self.arrow.field("value").type
        if self.json_fast and _one_line_objects(offsets, data) and _valid_utf8(body):
            lines = np.insert(data, offsets[1:-1], ord("\n")).tobytes()
            try:
                table = pj.read_json(io.BytesIO(lines),
                                     read_options=pj.ReadOptions(block_size=len(lines) + 1),
                                     parse_options=pj.ParseOptions(
                                         explicit_schema=pa.schema(list(kind)),
                                         unexpected_field_behavior="ignore"))
            except ValueError:  # pa.ArrowInvalid among them
                pass  # a value the reader refuses: the lenient rules decide, body by body
            else:
                if table.num_rows == len(body):
                    return table.to_struct_array().combine_chunks().cast(kind)
        return pa.array([self._one_json(b) for b in body.to_pylist()], type=kind)

    def _one_json(self, raw: bytes) -> object:
        assert self.json_value is not None
        try:
            return self.json_value(json.loads(raw))
        except ValueError:
            return None  # a body that is not JSON: null, like from_json's PERMISSIVE

    def _by_message(self, block: bytes, end: int) -> pa.RecordBatch:
        """The block message by message, for records the column path does not take."""
        rows = [to_row(m, self.broker, self.body_as, self.json_value)
                for m in map(restore_topic, iter_records(block))
                if m.queue_offset < end and self.sub.matches(m.tags, m.properties)]
        values = list(zip(*rows, strict=True)) or [[] for _ in self.arrow]
        return pa.RecordBatch.from_arrays(
            [pa.array(v, type=f.type) for v, f in zip(values, self.arrow, strict=True)],
            schema=self.arrow)


def _starts(block: bytes) -> np.ndarray:
    """Where each record of ``block`` starts, by walking the TOTALSIZE fields."""
    starts: list[int] = []
    pos, n = 0, len(block)
    while pos < n:
        if pos + MIN_RECORD_SIZE > n:
            raise RecordError("truncated record header")
        (size,) = INT32.unpack_from(block, pos)
        if size < MIN_RECORD_SIZE or pos + size > n:
            raise RecordError(f"bad total size {size}")
        starts.append(pos)
        pos += size
    return np.array(starts, dtype=np.int64)


def _gather(data: np.ndarray, at: np.ndarray, length: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Arrow offsets and values of the byte ranges ``[at, at + length)`` of ``data``."""
    offsets = np.zeros(len(at) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    index = np.arange(offsets[-1]) + np.repeat(at - offsets[:-1], length)
    return offsets.astype(np.int32), data[index]


def _buffers(offsets: np.ndarray, values: np.ndarray) -> list[pa.Buffer]:
    return [pa.py_buffer(offsets), pa.py_buffer(values)]


def _utf8(offsets: np.ndarray, values: np.ndarray, n: int) -> pa.StringArray:
    out = pa.Array.from_buffers(pa.string(), n, [None, *_buffers(offsets, values)])
    try:
        out.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from None
    return out


def _properties(offsets: np.ndarray, data: np.ndarray, n: int, arrow: pa.Schema
                ) -> pa.MapArray | None:
    """The properties strings as a map column, split as ``decode_properties`` splits them
    (pieces between separators, a piece without a name-value separator or with an empty
    name dropped); None when a record names a property twice."""
    _utf8(offsets, data, n)
    cuts = np.flatnonzero(data == _PROP_SEP)
    piece_at = np.sort(np.concatenate([offsets[:-1], cuts + 1]))
    piece_end = np.sort(np.concatenate([cuts, offsets[1:]]))
    names = np.flatnonzero(data == _NAME_SEP)
    first = np.searchsorted(names, piece_at)
    sep = names[np.minimum(first, max(len(names) - 1, 0))] if len(names) else piece_at
    keep = (first < len(names)) & (sep < piece_end) & (sep > piece_at)
    piece_at, piece_end, sep = piece_at[keep], piece_end[keep], sep[keep]
    row = np.searchsorted(offsets, piece_at, side="right") - 1
    key_offsets, key_data = _gather(data, piece_at, sep - piece_at)
    keys = pa.Array.from_buffers(pa.string(), len(row), [None, *_buffers(key_offsets,
                                                                         key_data)])
    codes = np.asarray(keys.dictionary_encode().indices, dtype=np.int64)
    if np.unique(row * (len(row) + 1) + codes).size != len(row):
        return None
    value_offsets, value_data = _gather(data, sep + 1, piece_end - sep - 1)
    values = pa.Array.from_buffers(pa.string(), len(row), [None, *_buffers(value_offsets,
                                                                           value_data)])
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(row, minlength=n), out=map_offsets[1:])
    return pa.MapArray.from_arrays(map_offsets, keys, values,
                                   type=arrow.field("properties").type)


def _keys(text: pa.StringArray, n: int, kind: pa.DataType) -> pa.ListArray:
    """KEYS split on spaces, empty words dropped, no KEYS an empty list (``split_keys``)."""
    words = pc.split_pattern(text, KEY_SEPARATOR)
    flat, parent = words.flatten(), np.asarray(pc.list_parent_indices(words))
    kept = np.asarray(pc.greater(pc.binary_length(flat), 0), dtype=bool)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parent[kept], minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(offsets, flat.filter(pa.array(kept)), type=kind)


def _msg_ids(u8: np.ndarray, starts: np.ndarray) -> pa.StringArray:
    raw = u8[starts[:, None] + _MSG_ID_BYTES]
    text = np.empty((len(starts), 32), dtype=np.uint8)
    text[:, 0::2], text[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 15]
    offsets = np.arange(0, 32 * len(starts) + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(starts), [None, *_buffers(offsets, text)])


def _timestamps(ms: np.ndarray) -> pa.TimestampArray:
    return pa.array(ms.astype(np.int64) * 1000, type=pa.timestamp("us", tz="UTC"))


def _hosts(packed: np.ndarray) -> pa.StringArray:
    """``ip:port`` of 8-byte IPv4 hosts; a block has few distinct ones, formatted once each."""
    distinct, index = np.unique(packed, return_inverse=True)
    names = pa.array([_host(_host_from(int(h).to_bytes(8, "big"))) for h in distinct.tolist()],
                     type=pa.string())
    return names.take(pa.array(index.astype(np.int32)))


def _valid_utf8(body: pa.BinaryArray) -> bool:
    """Whether every body is UTF-8 (pyarrow's JSON reader passes other bytes through into its
    strings, where ``json.loads`` refuses the body)."""
    try:
        body.cast(pa.string())
    except pa.ArrowInvalid:
        return False
    return True


def _text(body: pa.BinaryArray) -> pa.StringArray:
    """Bodies as UTF-8 text, an undecodable byte replaced (as ``bytes.decode`` does)."""
    try:
        return body.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", errors="replace") for b in body.to_pylist()],
                        type=pa.string())


def _one_line_objects(offsets: np.ndarray, data: np.ndarray) -> bool:
    """Every body one JSON object on one line ('{' first, '}' last, no line break), so the
    reader's rows are the bodies one for one."""
    if len(offsets) < 2 or (np.diff(offsets) < 2).any():
        return False
    if (data[offsets[:-1]] != ord("{")).any() or (data[offsets[1:] - 1] != ord("}")).any():
        return False
    return not ((data == ord("\n")) | (data == ord("\r"))).any()
