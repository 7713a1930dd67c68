"""The compiled frame kernels (evq/net/frame_kernels.pyx) against their pure-Python reference.

Each kernel must give what its twin in evq.net.protocol gives: the same command (or frame
bytes) for every input, the same error (type, text and salvaged opaque) for every malformed
one, and the decoder left at the same place.  The module also checks that the compiled kernels
are the ones in use wherever a C compiler exists, and that the variable selects pure Python.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evq.net import protocol
from evq.net.codes import LanguageCode
from evq.net.protocol import (
    BINARY_FIXED,
    COMPILED,
    MAX_HEADER,
    PURE,
    FrameCodec,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
)
from tests.domain.test_record_kernels import c_compiler
from tests.processes import REPO_ROOT, python_env
from tests.strategies import remoting_commands

PURE_RUN = os.environ.get(protocol.PURE_PYTHON_VARIABLE, "0") not in ("", "0")

pytestmark = pytest.mark.skipif(COMPILED is None, reason="the compiled kernels are not built")


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What a call gives: its value, or what it raised (type, text, and a frame error's
    salvaged opaque)."""
    try:
        return "value", fn(*args)
    except Exception as exc:  # the comparison is the point: any error must match
        return "raised", (type(exc), str(exc), getattr(exc, "opaque", None))


class DecoderSubclass(FrameDecoder):
    """A decoder of another class than the one the kernels were bound to: they read and set
    its fields through getattr and setattr, not by their slots."""

    __slots__ = ()


def taken(codec: FrameCodec, chunks: list[bytes], max_frame: int,
          max_header: int = MAX_HEADER, decoder_class: type[FrameDecoder] = FrameDecoder
          ) -> list[object]:
    """Everything a decoder gives for ``chunks`` fed one at a time, each followed by taking
    frames until none is left or one fails: commands, errors, and where the decoder stood."""
    decoder = decoder_class(max_frame, max_header)
    seen: list[object] = []
    for chunk in chunks:
        decoder._buf += chunk
        while True:
            result = outcome(codec.take_frame, decoder)
            seen.append((result, decoder._pos))
            if result[0] == "raised" or result[1] is None:
                break
        if result[0] == "raised":
            break
    return seen


def assert_same_taking(frames: bytes, cuts: list[int], max_frame: int = 1 << 20,
                       max_header: int = MAX_HEADER) -> None:
    points = sorted({min(c, len(frames)) for c in cuts})
    chunks = [frames[a:b] for a, b in zip([0, *points], [*points, len(frames)], strict=True)]
    assert (taken(COMPILED, chunks, max_frame, max_header)
            == taken(PURE, chunks, max_frame, max_header))


def frame(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=False) | st.text(max_size=6))
_json_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=2)
                            | st.dictionaries(st.text(max_size=4), inner, max_size=2),
                            max_leaves=4)
_header_values = st.fixed_dictionaries({}, optional={
    "code": st.integers(-(2**33), 2**33) | _json_values,
    "opaque": st.integers(-(2**33), 2**33) | _json_values,
    "flag": st.integers(0, 3) | _json_values,
    "version": st.integers(-(2**33), 2**33) | _json_values,
    "language": st.sampled_from([lang.name for lang in LanguageCode]) | st.text(max_size=4)
    | _json_values,
    "remark": st.text(max_size=8) | _json_values,
    "extFields": st.dictionaries(st.text(max_size=4), st.text(max_size=6) | _scalars,
                                 max_size=4) | _json_values,
    "serializeTypeCurrentRPC": st.just("JSON"),
})


# --- the build ------------------------------------------------------------------------------


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler: the pure kernels are expected")
def test_the_compiled_kernels_are_built_and_used_where_a_compiler_is() -> None:
    assert protocol.CODEC is (PURE if PURE_RUN else COMPILED)
    if not PURE_RUN:
        assert protocol.take_frame is COMPILED.take_frame
        assert protocol.encode_frame is COMPILED.encode_frame
        assert protocol.parse_int_field is COMPILED.parse_int_field
        assert protocol.parse_long_field is COMPILED.parse_long_field


def test_the_variable_selects_the_pure_kernels() -> None:
    program = ("from evq.net import protocol; "
               "assert protocol.CODEC is protocol.PURE and protocol.COMPILED is None")
    env = {**python_env(), protocol.PURE_PYTHON_VARIABLE: "1"}
    subprocess.run([sys.executable, "-c", program], check=True, cwd=REPO_ROOT, env=env)


# --- encoding -------------------------------------------------------------------------------


@given(remoting_commands())
def test_encoding_any_command_gives_the_same_frame(cmd: RemotingCommand) -> None:
    assert outcome(COMPILED.encode_frame, cmd) == outcome(PURE.encode_frame, cmd)


@pytest.mark.parametrize("fields", [
    {"remark": "caf\u00e9"},  # not ASCII: escaped
    {"ext_fields": {"k": "\u65e5\u672c"}},
    {"remark": "\ud800"},  # a lone surrogate: orjson refuses it
    {"ext_fields": {"k": 7}},  # assigned past the converter: written as it is
    {"body": bytearray(b"abc")},
    {"body": memoryview(b"abc")},
    {"code": 2**40},  # orjson refuses it
    {"code": None},
    {"language": 99},
    {"flag": 1.5},
    {"serialize_type": SerializeType.ROCKETMQ},
    {"remark": "x" * (1 << 24)},  # a header past 24 bits
])
def test_encoding_unusual_fields_gives_the_same_frame_or_error(fields: dict[str, Any]) -> None:
    cmd = RemotingCommand(code=10, ext_fields={"a": "b"}, body=b"xyz")
    for name, value in fields.items():
        setattr(cmd, name, value)
    assert outcome(COMPILED.encode_frame, cmd) == outcome(PURE.encode_frame, cmd)


# --- taking frames ------------------------------------------------------------------------


@given(st.lists(remoting_commands(body=st.binary(max_size=32)), max_size=4),
       st.lists(st.integers(0, 400), max_size=5))
def test_any_stream_of_commands_cut_anywhere_gives_the_same(cmds: list[RemotingCommand],
                                                           cuts: list[int]) -> None:
    assert_same_taking(b"".join(c.encode() for c in cmds), cuts)


@given(_header_values, st.binary(max_size=8), st.lists(st.integers(0, 300), max_size=3))
@example({"code": 0, "opaque": 1, "extFields": {"a": 1.5}}, b"", [])
@example({"code": 0, "opaque": 2**31}, b"", [])
@example({"code": True, "opaque": 1}, b"", [])
@example({"code": 0, "opaque": 1, "language": "PYTHON"}, b"b", [])
def test_any_json_header_gives_the_same(header: dict[str, Any], body: bytes,
                                        cuts: list[int]) -> None:
    assert_same_taking(frame(json.dumps(header).encode(), body), cuts)


@given(st.binary(max_size=64), st.integers(0, 3), st.binary(max_size=8))
@example(b"{not json", 0, b"")
@example(b"[1, 2]", 0, b"")
@example(b'{"code": 1, "opaque": 2}\n', 0, b"")
@example(b"\x00\x01", 1, b"")
@example(b"{}", 7, b"")
def test_any_header_bytes_of_any_kind_give_the_same(header: bytes, kind: int,
                                                    body: bytes) -> None:
    assert_same_taking(frame(header, body, kind), [])


@given(st.binary(max_size=80), st.integers(8, 64), st.lists(st.integers(0, 80), max_size=3))
@example(struct.pack(">i", 3), 64, [])
@example(struct.pack(">ii", 100, 0), 16, [])
@example(struct.pack(">ii", 30, 50) + b"{}", 64, [])
def test_any_bytes_give_the_same(data: bytes, max_frame: int, cuts: list[int]) -> None:
    assert_same_taking(data, cuts, max_frame)


@given(st.binary(max_size=80), st.integers(8, 64), st.integers(0, 40),
       st.lists(st.integers(0, 80), max_size=3))
@example(frame(BINARY_FIXED.pack(10, 0, 1, 5, 0) + bytes(8), b"", 1), 64, 20, [])
@example(frame(BINARY_FIXED.pack(10, 0, 1, 5, 0) + bytes(8), b"", 1), 64, 20, [9])
@example(frame(BINARY_FIXED.pack(10, 0, 1, 5, 0) + bytes(8), b"", 1), 64, 21, [])
@example(frame(b'{"code":10,"opaque":5}', b"", 0), 64, 21, [])
def test_any_bytes_under_any_header_limit_give_the_same(data: bytes, max_frame: int,
                                                        max_header: int, cuts: list[int]) -> None:
    assert_same_taking(data, cuts, max_frame, max_header)


def test_an_oversize_frame_salvages_the_same_opaque() -> None:
    header = RemotingCommand(code=10, opaque=77).encode()[8:]
    assert_same_taking(frame(header, b"x" * 100), [], max_frame=64)


_field_texts = st.one_of(
    st.text(),  # any str: letters and digits of every script, signs, spaces, nothing
    st.integers(-(2**64), 2**64).map(str),  # numbers, either side of both limits
    st.integers(-(2**64), 2**64).map(lambda n: f"{n:+d}"),
    st.from_regex(r"[0-9]{0,25}", fullmatch=True),  # leading zeros, and past 19 digits
)


@given(st.text(max_size=20), _field_texts)
@example("queueId", "٣")  # a digit that is not ASCII
@example("queueId", "2147483648")
@example("bornTimestamp", "9223372036854775808")
def test_header_numbers_parse_the_same(name: str, text: str) -> None:
    """A header field's text as a Java int and long: the same value or refusal."""
    assert COMPILED is not None
    for compiled, pure in ((COMPILED.parse_int_field, PURE.parse_int_field),
                           (COMPILED.parse_long_field, PURE.parse_long_field)):
        assert outcome(compiled, name, text) == outcome(pure, name, text)


# --- the ROCKETMQ binary header ---------------------------------------------------------------

_texts = st.text(max_size=6)  # any str: lone surrogates too, which UTF-8 cannot carry
_raw_texts = st.binary(max_size=6) | _texts.map(lambda t: t.encode("utf-8", "surrogatepass"))
"""Header text bytes: UTF-8 or not (a surrogate's bytes, a cut sequence, anything)."""


@st.composite
def binary_headers(draw: st.DrawFn) -> bytes:
    """A ROCKETMQ header built field by field, each length either the true one or any other
    (negative, past the end, into the next field), each text any bytes: every way the
    decoder can stop, and the well-formed headers between them."""

    def length(fmt: str, true: int) -> bytes:
        bound = 2**15 if fmt == ">h" else 2**31
        return struct.pack(fmt, draw(st.just(true) | st.integers(-bound, bound - 1)))

    remark = draw(st.just(b"") | _raw_texts)
    entries = b"".join(
        length(">h", len(key)) + key + length(">i", len(value)) + value
        for key, value in draw(st.lists(st.tuples(_raw_texts, _raw_texts), max_size=5)))
    header = (struct.pack(">hBhii", draw(_INT16S), draw(st.integers(0, 255)), draw(_INT16S),
                          draw(st.integers(-(2**31), 2**31 - 1)), draw(st.integers(0, 3)))
              + length(">i", len(remark)) + remark + length(">i", len(entries)) + entries)
    return header[:draw(st.integers(0, len(header)))] if draw(st.booleans()) else header


_INT16S = st.integers(-(2**15), 2**15 - 1)


@given(binary_headers(), st.binary(max_size=8), st.lists(st.integers(0, 120), max_size=3))
@example(struct.pack(">hBhiii", 10, 0, 1, 7, 0, 0) + struct.pack(">i", 0), b"", [])
@example(struct.pack(">hBhiiii", 10, 200, 1, 7, 0, 2, 0) + b"\xc3\xa9"  # remark: é
         + struct.pack(">i", 9) + struct.pack(">h", 1) + b"k" + struct.pack(">i", 2) + b"\xed\xa0",
         b"x", [])  # a value cut inside a surrogate's bytes: not UTF-8
def test_any_binary_header_gives_the_same(header: bytes, body: bytes, cuts: list[int]) -> None:
    assert_same_taking(frame(header, body, kind=1), cuts)


@given(binary_headers(), st.binary(max_size=8), st.integers(8, 64),
       st.lists(st.integers(0, 120), max_size=3))
def test_a_decoder_of_another_class_takes_the_same(header: bytes, body: bytes, max_frame: int,
                                                    cuts: list[int]) -> None:
    """The kernels read a decoder by its slots only where it is exactly the class they were
    bound to; a subclass is read by name, and ends the same."""
    frames = frame(header, body, kind=1) + frame(b'{"code":10}')
    points = sorted({min(c, len(frames)) for c in cuts})
    chunks = [frames[a:b] for a, b in zip([0, *points], [*points, len(frames)], strict=True)]
    assert (taken(COMPILED, chunks, max_frame, decoder_class=DecoderSubclass)
            == taken(PURE, chunks, max_frame))


@given(st.dictionaries(_texts, _texts, max_size=20), st.none() | _texts,
       st.integers(-(2**16), 2**16) | st.sampled_from(LanguageCode), st.integers(-(2**33), 2**33))
def test_any_binary_command_encodes_the_same(fields: dict[str, str], remark: str | None,
                                             code: int, opaque: int) -> None:
    """Fields past the stack's room (more than 16), texts no UTF-8 carries, numbers past
    their fields: the same frame or the same error."""
    cmd = RemotingCommand(code=10, ext_fields=fields, body=b"xyz",
                          serialize_type=SerializeType.ROCKETMQ)
    cmd.remark, cmd.code, cmd.opaque = remark, code, opaque
    assert outcome(COMPILED.encode_frame, cmd) == outcome(PURE.encode_frame, cmd)
    cmd.language = code  # a language code past a byte, or one that is not a LanguageCode
    assert outcome(COMPILED.encode_frame, cmd) == outcome(PURE.encode_frame, cmd)


@pytest.mark.parametrize("fields", [
    {"ext_fields": {"k" * 32767: "v"}},  # the longest key int16 holds
    {"ext_fields": {"k" * 32768: "v"}},  # one past it
    {"ext_fields": {"k": "v" * ((1 << 24) - 30)}},  # a header at 24 bits, and past it
    {"ext_fields": {"k": "v" * ((1 << 24) - 29)}},
    {"ext_fields": {"k": 7}},  # assigned past the converter
    {"ext_fields": [("k", "v")]},
    {"remark": b"bytes"},
    {"remark": ""},
    {"version": 2**15},
    {"flag": True},
    {"body": bytearray(b"abc")},
])
def test_encoding_unusual_binary_fields_gives_the_same(fields: dict[str, Any]) -> None:
    cmd = RemotingCommand(code=10, ext_fields={"a": "b"}, body=b"xyz",
                          serialize_type=SerializeType.ROCKETMQ)
    for name, value in fields.items():
        setattr(cmd, name, value)
    assert outcome(COMPILED.encode_frame, cmd) == outcome(PURE.encode_frame, cmd)
