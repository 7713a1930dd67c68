"""The RocketMQ remoting frame, sans-IO: bytes in, commands out; commands in, bytes out.

Nothing here touches a socket or an event loop, so every rule of the wire format is tested by
feeding bytes (:class:`FrameDecoder`) and reading bytes (:meth:`RemotingCommand.encode`); the
asyncio transport in :mod:`evq.net.transport` is a thin pump around it.

One frame, both directions, all integers big-endian::

    offset  size  field
    ------  ----  ------------------------------------------------------------------
         0     4  LENGTH       bytes after this field: 4 + H + B
         4     4  HEADER WORD  bits 31..24 serialize type (0 JSON, 1 ROCKETMQ),
                               bits 23..0  header length H
         8     H  HEADER       JSON text, or the ROCKETMQ binary header below
       8+H     B  BODY         opaque bytes, may be empty

A JSON header is one object; evq writes fastjson's alphabetical key order, compact::

    {"code":0,"extFields":{"k":"v"},"flag":1,"language":"JAVA","opaque":7,
     "remark":"...","serializeTypeCurrentRPC":"JSON","version":407}

The ROCKETMQ binary header (serialize type 1: what evq's producer sends its sends in, and
Java clients with ``rocketmq.serialize.type=ROCKETMQ``; a 4.x broker answers in the request's
own serialization)::

    offset  size  field
    ------  ----  ------------------------------------------------------------------
         0     2  CODE         int16
         2     1  LANGUAGE     LanguageCode value
         3     2  VERSION      int16
         5     4  OPAQUE       int32
         9     4  FLAG         int32 (bit 0 response, bit 1 oneway)
        13   4+R  REMARK       int32 byte length R (0 = no remark), UTF-8
    17+R   4+E  EXTFIELDS    int32 byte length E of the entries that follow, each:
                               int16 key length + UTF-8 key, int32 value length + UTF-8 value

Compatibility rules (see rocketmq-wire-and-store.md §1.5): both stock clients read the header
word without masking and parse only JSON, so answers to them are JSON with a zero high byte;
every extFields value goes out as a JSON *string* (the C++ client ignores anything else), while
incoming values may be JSON numbers, booleans or strings and are coerced to strings here.
"""

from __future__ import annotations

import enum
import functools
import itertools
import json
import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Final

import attrs
import orjson

from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.record import PURE_PYTHON_VARIABLE
from evq.net.codes import LanguageCode, Version

FRAME_PREFIX = struct.Struct(">ii")  # LENGTH, HEADER WORD
BINARY_FIXED = struct.Struct(">hBhii")  # CODE, LANGUAGE, VERSION, OPAQUE, FLAG
INT32 = struct.Struct(">i")
INT16 = struct.Struct(">h")

MAX_FRAME: Final = 16 * 1024 * 1024
"""Largest frame accepted, its LENGTH field included (Java's ``frameMaxLength``)."""

MAX_HEADER: Final = 512 * 1024
"""Largest header a server takes from its peers (``TransportConfig.max_header``), refused from
the frame's header word before any of it is read.

A header becomes a dict of Python strings, so its cost follows its field count, not its
bytes: a 15 MiB header of 1.3 million empty fields held the broker's loop for 0.6-0.7 s and
grew it by 190 MiB, and a client could send one after another.  The largest request header a
RocketMQ client sends is a send's, whose ``properties`` the store caps at 32,767 bytes (the
record's 2-byte length): under 200 KB even with every character JSON-escaped.  At this bound a
header of empty fields costs the loop about 15 ms.  Answers are another matter: a batch
send's names every message it stored (190,650 fit a 4 MiB batch, a 6.3 MB header), so a
client reads headers up to its frame's bound."""

RESPONSE_FLAG: Final = 1 << 0
ONEWAY_FLAG: Final = 1 << 1

HEADER_LENGTH_MASK: Final = 0xFFFFFF
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

EVQ_LANGUAGE: Final = LanguageCode.JAVA
"""What evq puts in ``language``: clients only ever met Java brokers, and nothing reads it."""
EVQ_VERSION: Final = Version.V4_9_7


class SerializeType(enum.IntEnum):
    JSON = 0
    ROCKETMQ = 1


class ProtocolError(ValueError):
    """Bytes that are not a well-formed frame; the connection's framing is lost.

    ``opaque`` is set when the frame got far enough to show it was a request expecting an
    answer (not a response, not oneway), so the peer can still be told why (:meth:`response`).
    """

    def __init__(self, reason: str, *, opaque: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.opaque = opaque

    def response(self) -> RemotingCommand | None:
        """The SYSTEM_ERROR answer to send before closing, if the peer can match one."""
        if self.opaque is None:
            return None
        return RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR,
            opaque=self.opaque,
            flag=RESPONSE_FLAG,
            remark=self.reason,
        )


class HeaderFieldError(BrokerError):
    """A request header field that is missing or does not parse.

    A :class:`BrokerError` so that the transport answers it like Java does: SYSTEM_ERROR with a
    remark naming the field.
    """

    def __init__(self, remark: str) -> None:
        super().__init__(ResponseCode.SYSTEM_ERROR, remark)


def ext_value(value: object) -> str:
    """One extFields value as the string every reader gets, whatever JSON scalar it came as.

    Booleans are spelled like Java's ``Boolean.toString`` (ali-ons sends JSON ``false``, the
    Java broker it was written against sees ``"false"``).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise TypeError(f"extFields values are scalars, not {type(value).__name__}")


_STR_ONLY: Final = frozenset({str})


def ext_fields(fields: Mapping[str, object] | None) -> dict[str, str]:
    """Header fields as all-string extFields; ``None`` values are left out, as Java does."""
    if not fields:
        return {}
    if _STR_ONLY.issuperset(map(type, fields.values())):  # the usual case, checked in C
        return dict(fields)  # type: ignore[arg-type]
    return {k: ext_value(v) for k, v in fields.items() if v is not None}


_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")  # no longer: int() of huge texts is slow, then fails
_TRUE = frozenset({"1", "true"})
_FALSE = frozenset({"0", "false"})


def _integer(low: int, high: int, kind: str) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        # ASCII digits alone (most fields) skip the pattern; signs and anything odd meet it.
        plain = text.isdigit() and text.isascii() and len(text) <= 19
        if (not plain and _INTEGER.fullmatch(text) is None) or not (
            low <= (value := int(text)) <= high
        ):
            raise HeaderFieldError(f"the custom field <{name}> is not a valid {kind}: {text!r:.64}")
        return value

    return parse


_parse_int_field = _integer(INT32_MIN, INT32_MAX, "int")
"""``parse_int_field(name, text)``, pure (the reference of the compiled twin)."""
_parse_long_field = _integer(INT64_MIN, INT64_MAX, "long")
"""``parse_long_field(name, text)``, pure (the reference of the compiled twin)."""


def parse_bool_field(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise HeaderFieldError(f"the custom field <{name}> is not a valid boolean: {text!r:.64}")


@attrs.define(slots=True, on_setattr=attrs.setters.NO_OP)
class RemotingCommand:
    """One request or response: RocketMQ's ``RemotingCommand``.

    ``code`` is a :class:`~evq.net.codes.RequestCode` on requests and a
    :class:`~evq.domain.codes.ResponseCode` on responses, kept as a plain int because peers send
    codes neither enum knows.  ``ext_fields`` are the flattened request/response header fields,
    always strings (a converter coerces whatever is passed to the constructor); read them
    through the header they make (:mod:`evq.net.headers`).  Assignments after construction
    are plain slot writes, not converted (the transport stamps ``opaque`` and ``flag`` on
    every request it sends, and attrs' converting ``__setattr__`` cost more than the rest of
    that): assign ``ext_fields`` only a ``dict[str, str]``.
    """

    code: int
    language: LanguageCode = EVQ_LANGUAGE
    version: int = EVQ_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict, converter=ext_fields)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @classmethod
    def request(
        cls,
        code: int,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        """A request from evq; the connection that sends it stamps its ``opaque``."""
        return cls(code=code, flag=ONEWAY_FLAG if oneway else 0, ext_fields=fields, body=body)

    @classmethod
    def direct(cls, code: int, language: LanguageCode, version: int, opaque: int, flag: int,
               remark: str | None, ext_fields: dict[str, str], body: bytes,
               serialize_type: SerializeType, /) -> RemotingCommand:
        """A command from fields that are already what the constructor would make of them
        (``ext_fields`` all strings, and the caller's to give away): every field set as
        given, without the generated ``__init__``'s keyword matching, defaults and
        converter, which cost five times as much.  For commands made once per message:
        each decoded frame, a producer's send."""
        cmd = _new_command(cls)
        cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag = (
            code, language, version, opaque, flag)
        cmd.remark, cmd.ext_fields, cmd.body, cmd.serialize_type = (
            remark, ext_fields, body, serialize_type)
        return cmd

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque and serialize type, response flag set.

        Stock clients only send JSON, so answering in the request's own serialization is
        what keeps their replies JSON.  Made through :meth:`direct` with the converter called
        here: one answer a request, and the generated ``__init__``'s keywords and defaults
        cost half again as much.
        """
        return RemotingCommand.direct(code, EVQ_LANGUAGE, EVQ_VERSION, self.opaque, RESPONSE_FLAG,
                                      remark, ext_fields(fields), body, self.serialize_type)

    def encode(self) -> bytes:
        """The whole frame.  Raises :class:`ProtocolError` for a field the layout cannot hold."""
        return encode_frame(self)


_new_command = object.__new__


def serialization_for(fields: Mapping[str, str]) -> SerializeType:
    """The serialization evq's client sends a hot request's header ``fields`` in: RocketMQ's
    binary ROCKETMQ, which every 4.x broker reads and answers in kind, and which a broker
    reads in a fraction of a JSON header's time; JSON where a text has no UTF-8 (a lone
    surrogate, which a Python str may hold and JSON escapes)."""
    for field in fields.items():
        for text in field:
            if not text.isascii():
                try:
                    text.encode()
                except UnicodeEncodeError:
                    return SerializeType.JSON
    return SerializeType.ROCKETMQ


class OpaqueCounter(functools.partial[int]):
    """Request ids for one sender: 1 up to 2**31 - 1, then round again (from ``first``).

    Kept positive and within 31 bits because the C++ client masks its own ids that way and
    reads ours with ``asInt()``.  Calling it is ``next`` on a C iterator of those ids over
    and over, so taking one runs no Python frame: every request takes one, and a sync send
    waits on each frame its client runs.
    """

    __slots__ = ()

    def __new__(cls, first: int = 1) -> OpaqueCounter:
        ids = itertools.chain(range(first, INT32_MAX + 1),
                              itertools.chain.from_iterable(itertools.repeat(
                                  range(1, INT32_MAX + 1))))
        return super().__new__(cls, next, ids)


# -- header encoding --------------------------------------------------------------------------


def _encode_frame(cmd: RemotingCommand) -> bytes:
    """:meth:`RemotingCommand.encode`, pure (the reference of the compiled twin)."""
    header = encode_header(cmd)
    if len(header) > HEADER_LENGTH_MASK:
        raise ProtocolError(f"header of {len(header)} bytes exceeds 24 bits")
    word = (cmd.serialize_type << 24) | len(header)
    return FRAME_PREFIX.pack(4 + len(header) + len(cmd.body), word) + header + cmd.body


def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type is SerializeType.JSON:
        return _encode_json(cmd)
    return _encode_binary(cmd)


_LANGUAGE_NAMES: Final = {lang: lang.name for lang in LanguageCode}
_LANGUAGE_BY_NAME: Final = {lang.name: lang for lang in LanguageCode}


def _encode_json(cmd: RemotingCommand) -> bytes:
    # Built in fastjson's alphabetical order; ASCII-escaped so that any str (even one decoded
    # from a peer's lone-surrogate escape) yields valid JSON both clients' parsers accept.
    # orjson writes the same compact text for ASCII; the json module escapes anything else.
    obj: dict[str, object] = {"code": int(cmd.code)}
    if cmd.ext_fields:
        obj["extFields"] = cmd.ext_fields
    obj["flag"] = int(cmd.flag)
    obj["language"] = _LANGUAGE_NAMES[cmd.language]
    obj["opaque"] = int(cmd.opaque)
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    obj["serializeTypeCurrentRPC"] = "JSON"
    obj["version"] = int(cmd.version)
    try:
        text = orjson.dumps(obj)
    except orjson.JSONEncodeError:  # a lone surrogate: not UTF-8, the escaping path takes it
        text = b""
    if text and text.isascii():
        return text
    return json.dumps(obj, separators=(",", ":")).encode("ascii")


def _encode_binary(cmd: RemotingCommand) -> bytes:
    try:
        parts = [BINARY_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag)]
        remark = cmd.remark.encode() if cmd.remark else b""
        parts += [INT32.pack(len(remark)), remark]
        entries = []
        for key, value in cmd.ext_fields.items():
            k, v = key.encode(), value.encode()
            entries += [INT16.pack(len(k)), k, INT32.pack(len(v)), v]
        ext = b"".join(entries)
        parts += [INT32.pack(len(ext)), ext]
    except (struct.error, UnicodeEncodeError) as exc:
        raise ProtocolError(f"cannot encode ROCKETMQ header: {exc}", opaque=cmd.opaque) from exc
    return b"".join(parts)


# -- header decoding --------------------------------------------------------------------------


def decode_header(serialize_type: int, header: bytes, body: bytes) -> RemotingCommand:
    """A command from its header bytes; any defect is a :class:`ProtocolError`."""
    if serialize_type == SerializeType.JSON:
        return _decode_json(header, body)
    if serialize_type == SerializeType.ROCKETMQ:
        return _decode_binary(header, body)
    raise ProtocolError(f"unknown serialize type {serialize_type}")


def _answerable(opaque: int, flag: int) -> int | None:
    """The opaque to answer a broken frame with: only requests that wait for an answer."""
    return None if flag & (RESPONSE_FLAG | ONEWAY_FLAG) else opaque


def _json_int(obj: Mapping[str, object], key: str, opaque: int | None) -> int:
    value = obj.get(key, 0)
    if type(value) is int and INT32_MIN <= value <= INT32_MAX:  # what every client sends
        return value
    # fastjson reads a numeric string into an int field too, so tolerate "12" as well as 12.
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        value = int(value)
    if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
        raise ProtocolError(f"header field {key!r} is not an int: {value!r:.64}", opaque=opaque)
    return value


def _loads(header: bytes) -> object:
    """The header's JSON value, as Python's json module reads it, mostly by orjson.

    orjson refuses some texts json takes (lone-surrogate escapes, NaN, very deep nesting) and
    reads integers past 64 bits as floats; the json module decides those, and any header
    with a float where a field or extFields value would be.  The C++ client's jsoncpp writer
    ends the text with "\n"; both parsers skip it.
    """
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError:
        obj = None
    else:
        if not isinstance(obj, dict) or not (
            _has_float(obj) or (isinstance(ext := obj.get("extFields"), dict) and _has_float(ext))
        ):
            return obj
    try:
        return json.loads(header.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"header is not JSON: {exc}") from exc


def _has_float(obj: Mapping[str, object]) -> bool:
    return float in {*map(type, obj.values())}


_LANGUAGE_OTHER: Final = LanguageCode.OTHER
_JSON: Final = SerializeType.JSON
_EVQ_LANGUAGE_NAME: Final = EVQ_LANGUAGE.name


def _decode_json(header: bytes, body: bytes) -> RemotingCommand:
    """The command of a JSON header: the header every peer writes, checked in a few type
    tests, else :func:`_decode_json_checked`, which says what is wrong and where.

    The short way takes only what the checked way would read the same: orjson's object whose
    four ints are Java ints, whose language is a string, whose remark is absent or a string
    and whose extFields are absent or all strings (a float, in any field read, or a number
    orjson reads differently from the json module, sends the header the long way).  It is a
    third of the decoding cost of an answer, on every frame both ends receive."""
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError:
        return _decode_json_checked(header, body)
    if type(obj) is dict:
        code, opaque = obj.get("code"), obj.get("opaque")
        flag, version = obj.get("flag", 0), obj.get("version", 0)
        language, remark = obj.get("language", _EVQ_LANGUAGE_NAME), obj.get("remark")
        ext = obj.get("extFields")
        if (
            type(code) is int and type(opaque) is int and type(flag) is int
            and type(version) is int and type(language) is str
            and (remark is None or type(remark) is str)
            and INT32_MIN <= code <= INT32_MAX and INT32_MIN <= opaque <= INT32_MAX
            and INT32_MIN <= flag <= INT32_MAX and INT32_MIN <= version <= INT32_MAX
            and (ext is None
                 or (type(ext) is dict and _STR_ONLY.issuperset(map(type, ext.values()))))
        ):
            # All strings, and ours: the converter's check and copy are not needed.
            return RemotingCommand.direct(
                code, _LANGUAGE_BY_NAME.get(language, _LANGUAGE_OTHER), version, opaque, flag,
                remark, ext if ext is not None else {}, body, _JSON)
    return _decode_json_checked(header, body)


def _decode_json_checked(header: bytes, body: bytes) -> RemotingCommand:
    obj = _loads(header)
    if not isinstance(obj, dict):
        raise ProtocolError(f"header is a JSON {type(obj).__name__}, not an object")
    if "opaque" not in obj:
        raise ProtocolError("header has no opaque")
    opaque = _json_int(obj, "opaque", None)
    flag = _json_int(obj, "flag", opaque)
    answer = _answerable(opaque, flag)
    if "code" not in obj:
        raise ProtocolError("header has no code", opaque=answer)
    code = _json_int(obj, "code", answer)
    version = _json_int(obj, "version", answer)
    language = obj.get("language", _EVQ_LANGUAGE_NAME)
    if not isinstance(language, str):
        raise ProtocolError(f"header field 'language' is not a string: {language!r:.64}",
                            opaque=answer)
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise ProtocolError(f"header field 'remark' is not a string: {remark!r:.64}",
                            opaque=answer)
    raw_ext = obj.get("extFields")
    if raw_ext is not None and not isinstance(raw_ext, dict):
        raise ProtocolError("header field 'extFields' is not an object", opaque=answer)
    try:
        return RemotingCommand(  # its converter makes the extFields values strings, once
            code=code,
            language=_LANGUAGE_BY_NAME.get(language, LanguageCode.OTHER),
            version=version,
            opaque=opaque,
            flag=flag,
            remark=remark,
            ext_fields=raw_ext,
            body=body,
            serialize_type=SerializeType.JSON,
        )
    except TypeError as exc:
        raise ProtocolError(f"header field 'extFields': {exc}", opaque=answer) from exc


class _BinaryReader:
    """Bounds-checked reads over a binary header; running off its end is a ProtocolError."""

    __slots__ = ("at", "data", "opaque")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.opaque: int | None = None

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        if self.at + layout.size > len(self.data):
            raise ProtocolError("ROCKETMQ header truncated", opaque=self.opaque)
        values = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return values

    def text(self, length_layout: struct.Struct) -> str:
        (length,) = self.fixed(length_layout)
        if length < 0 or self.at + length > len(self.data):
            raise ProtocolError(f"ROCKETMQ header string length {length} out of range",
                                opaque=self.opaque)
        raw = self.data[self.at : self.at + length]
        self.at += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("ROCKETMQ header string is not UTF-8",
                                opaque=self.opaque) from exc


_LANGUAGE_BY_CODE: Final = {lang.value: lang for lang in LanguageCode}


def _decode_binary(header: bytes, body: bytes) -> RemotingCommand:
    reader = _BinaryReader(header)
    code, language, version, opaque, flag = reader.fixed(BINARY_FIXED)
    reader.opaque = _answerable(opaque, flag)
    remark = reader.text(INT32) or None
    (ext_length,) = reader.fixed(INT32)
    end = reader.at + ext_length
    if ext_length < 0 or end != len(reader.data):
        raise ProtocolError(f"ROCKETMQ extFields length {ext_length} does not fit the header",
                            opaque=reader.opaque)
    fields: dict[str, str] = {}
    while reader.at < end:
        key = reader.text(INT16)
        fields[key] = reader.text(INT32)
    return RemotingCommand(
        code=code,
        language=_LANGUAGE_BY_CODE.get(language, LanguageCode.OTHER),
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=fields,
        body=body,
        serialize_type=SerializeType.ROCKETMQ,
    )


# -- framing ----------------------------------------------------------------------------------


class FrameDecoder:
    """Reassembles commands from a byte stream cut anywhere.

    :meth:`feed` the bytes as they arrive, then call :meth:`next_command` until it returns
    ``None`` (it needs more bytes).  A malformed frame raises :class:`ProtocolError`; the
    framing is lost after that, so every later call raises the same error and the connection
    should be closed once the error's :meth:`~ProtocolError.response` is sent.
    """

    __slots__ = ("_buf", "_failed", "_pos", "max_frame", "max_header")

    def __init__(self, max_frame: int = MAX_FRAME,
                 max_header: int = HEADER_LENGTH_MASK) -> None:
        """``max_header``: the largest header taken; by default any the frame holds."""
        self.max_frame = max_frame
        self.max_header = max_header
        self._buf = bytearray()
        self._pos = 0
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as commands."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._failed is None:
            self._buf += data

    def next_command(self) -> RemotingCommand | None:
        if self._failed is not None:
            raise self._failed
        try:
            cmd = take_frame(self)
        except ProtocolError as exc:
            self._failed = exc
            raise
        if cmd is None:
            if self._pos:
                del self._buf[: self._pos]  # compact once per drained batch, not per frame
                self._pos = 0
        elif self._pos == len(self._buf):
            # Drained (the usual end of a read): nothing to move, and a reader that checks
            # :attr:`buffered` first need not call again to learn that nothing is left.
            self._buf.clear()
            self._pos = 0
        return cmd

    def _salvage(self, length: int) -> int | None:
        """The opaque of an oversize frame when its header already arrived, so it can be
        answered; only the header is looked at, the body is never buffered for this."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 8:
            return None
        (word,) = INT32.unpack_from(buf, pos + 4)
        header_length = word & HEADER_LENGTH_MASK
        if header_length > self.max_header:
            return self._fixed_opaque(word)
        if header_length > length - 4 or len(buf) - pos < 8 + header_length:
            return None
        try:
            header = bytes(buf[pos + 8 : pos + 8 + header_length])
            cmd = decode_header((word >> 24) & 0xFF, header, b"")
        except ProtocolError as exc:
            return exc.opaque
        return _answerable(cmd.opaque, cmd.flag)

    def _fixed_opaque(self, word: int) -> int | None:
        """The opaque of a frame whose header is not to be decoded, from a ROCKETMQ header's
        fixed fields when they arrived; a JSON header's is anywhere in it."""
        pos = self._pos
        binary = (word >> 24) & 0xFF == SerializeType.ROCKETMQ
        if not binary or len(self._buf) - pos < 8 + BINARY_FIXED.size:
            return None
        _, _, _, opaque, flag = BINARY_FIXED.unpack_from(self._buf, pos + 8)
        return _answerable(opaque, flag)


def _take_frame(decoder: FrameDecoder) -> RemotingCommand | None:
    """The next whole frame's command out of ``decoder``'s buffer (its position moved past
    the frame), or None until more bytes come; pure (the reference of the compiled twin)."""
    buf, pos = decoder._buf, decoder._pos
    available = len(buf) - pos
    if available < 4:
        return None
    (length,) = INT32.unpack_from(buf, pos)
    if length < 4:
        raise ProtocolError(f"frame length {length} is too small for a header")
    if length + 4 > decoder.max_frame:
        raise ProtocolError(
            f"frame of {length + 4} bytes exceeds the {decoder.max_frame}-byte limit",
            opaque=decoder._salvage(length),
        )
    if available < 8:
        return None
    (word,) = INT32.unpack_from(buf, pos + 4)
    serialize_type, header_length = (word >> 24) & 0xFF, word & HEADER_LENGTH_MASK
    if header_length > decoder.max_header:
        raise ProtocolError(
            f"header of {header_length} bytes exceeds the {decoder.max_header}-byte limit",
            opaque=decoder._fixed_opaque(word),
        )
    if available < 4 + length:
        return None
    if header_length > length - 4:
        raise ProtocolError(f"header length {header_length} exceeds frame length {length}")
    # Copies out of a view released at once: a live export would forbid resizing the buffer.
    with memoryview(buf) as view:
        header = bytes(view[pos + 8 : pos + 8 + header_length])
        body = bytes(view[pos + 8 + header_length : pos + 4 + length])
    decoder._pos = pos + 4 + length
    return decode_header(serialize_type, header, body)


# -- compiled kernels --------------------------------------------------------------------------


@attrs.frozen(slots=True)
class FrameCodec:
    """One implementation of the frame's hot functions: the pure-Python ones above (the
    reference) or their compiled twins in evq/net/frame_kernels.pyx."""

    take_frame: Callable[[FrameDecoder], RemotingCommand | None]
    encode_frame: Callable[[RemotingCommand], bytes]
    parse_int_field: Callable[[str, str], int]
    parse_long_field: Callable[[str, str], int]


PURE = FrameCodec(_take_frame, _encode_frame, _parse_int_field, _parse_long_field)


def _compiled_kernels() -> FrameCodec | None:
    """The compiled kernels, bound to this module; None where they were not built (no C
    compiler at install time) or ``EVQ_PURE_PYTHON`` asks for pure Python (as for the
    record codec: :data:`evq.domain.record.PURE_PYTHON_VARIABLE`)."""
    if os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0"):
        return None
    try:
        from evq.net import frame_kernels
    except ImportError:
        return None
    frame_kernels.bind(
        command=RemotingCommand, decoder=FrameDecoder, take_frame=_take_frame,
        encode_frame=_encode_frame,
        parse_int=_parse_int_field, parse_long=_parse_long_field,
        decode_any_header=decode_header, decode_json=_decode_json_checked,
        orjson_loads=orjson.loads, orjson_dumps=orjson.dumps,
        orjson_decode_error=orjson.JSONDecodeError, orjson_encode_error=orjson.JSONEncodeError,
        languages_by_name=_LANGUAGE_BY_NAME, names_of_languages=_LANGUAGE_NAMES,
        other_language=_LANGUAGE_OTHER, evq_language_name=_EVQ_LANGUAGE_NAME,
        languages_by_code=_LANGUAGE_BY_CODE, json=_JSON, rocketmq=SerializeType.ROCKETMQ)
    return FrameCodec(frame_kernels.take_frame, frame_kernels.encode_frame,
                      frame_kernels.parse_int_field, frame_kernels.parse_long_field)


COMPILED = _compiled_kernels()
"""The compiled kernels, or None where they are not built or not wanted."""
CODEC = COMPILED or PURE
"""The kernels this process runs; the module's names below are their functions."""
take_frame, encode_frame = CODEC.take_frame, CODEC.encode_frame
parse_int_field, parse_long_field = CODEC.parse_int_field, CODEC.parse_long_field
"""``parse_int_field(name, text)``: a header field's text as a Java ``int``; a
:class:`HeaderFieldError` naming the field otherwise (``parse_long_field``: a ``long``).  For
header parsers that read fields straight from ``ext_fields``: the declared headers
(:mod:`evq.net.headers`) and the send header (:mod:`evq.net.send_header`)."""
