"""The compiled codec (evq/domain/record_kernels.pyx) against its pure-Python reference.

Each kernel must give what its twin in evq.domain.record gives: the same objects for every
well-formed input, and an error of the same type for every malformed one.  The module also
checks that the compiled codec is the one in use wherever a C compiler exists (so CI proves
it is built), and runs the record tests once more on the pure path.
"""

from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evq.domain import record
from evq.domain.message import Message
from evq.domain.record import COMPILED, PURE, Codec, encode, encode_batch
from tests.domain.test_record import NON_ASCII, hand_built
from tests.processes import REPO_ROOT, python_env
from tests.strategies import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    int32s,
    messages,
    properties,
    property_names,
    property_values,
)

PURE_RUN = os.environ.get(record.PURE_PYTHON_VARIABLE, "0") not in ("", "0")

needs_compiled = pytest.mark.skipif(COMPILED is None, reason="the compiled codec is not built")

small_messages = messages(body=st.binary(max_size=64),
                          props=st.dictionaries(property_names, property_values, max_size=2))
edits = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6)
INT64_MIN = -(2**63)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """What a call gives: its value, or the type of what it raised."""
    try:
        return "value", fn(*args, **kwargs)
    except Exception as exc:  # the comparison is the point: any type must match
        return "raised", type(exc)


def iterated(codec: Codec, buf: bytes | bytearray) -> tuple[list[Message], type | None]:
    """The records iter_records yields before it stops, and what it raised then."""
    seen: list[Message] = []
    try:
        seen.extend(codec.iter_records(buf))
    except Exception as exc:
        return seen, type(exc)
    return seen, None


def assert_same_decoding(buf: bytes | bytearray, pos: int = 0) -> None:
    """decode and read_fields: the same outcome from both codecs, with and without CRC."""
    for check_crc in (True, False):
        expected = outcome(PURE.decode, buf, pos, check_crc=check_crc)
        assert outcome(COMPILED.decode, buf, pos, check_crc=check_crc) == expected
        assert outcome(COMPILED.decode, memoryview(bytes(buf)), pos,
                       check_crc=check_crc) == expected
        fields = outcome(PURE.read_fields, buf, pos, check_crc=check_crc)
        assert outcome(COMPILED.read_fields, buf, pos, check_crc=check_crc) == fields
        assert outcome(COMPILED.read_fields, memoryview(bytes(buf)), pos,
                       check_crc=check_crc) == fields


def mutated(raw: bytes, changes: list[tuple[int, int]]) -> bytearray:
    out = bytearray(raw)
    for i, v in changes:
        out[i % len(out)] = v
    return out


# --- the build ------------------------------------------------------------------------------


def c_compiler() -> str | None:
    cc = sysconfig.get_config_var("CC")
    return shutil.which(shlex.split(cc)[0]) if cc else None


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler: the pure codec is expected")
def test_the_compiled_codec_is_built_and_used_where_a_compiler_is() -> None:
    import evq.domain.record_kernels  # noqa: F401  (fails when pip install did not build it)

    assert record.CODEC is (PURE if PURE_RUN else COMPILED)
    if not PURE_RUN:
        assert record.decode is COMPILED.decode
        assert record.pack_v4 is COMPILED.pack_v4


def test_the_variable_selects_the_pure_codec() -> None:
    program = ("from evq.domain import record; "
               "assert record.CODEC is record.PURE and record.COMPILED is None; "
               "assert record.decode is record.PURE.decode")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**python_env(), record.PURE_PYTHON_VARIABLE: "1"},
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-3000:]


@needs_compiled
def test_the_record_and_send_path_tests_pass_on_the_pure_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "tests/domain/test_record.py", "tests/domain/test_sent.py"], capture_output=True,
        text=True, cwd=REPO_ROOT,
        env={**python_env(), record.PURE_PYTHON_VARIABLE: "1"}, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:]


# --- decode ---------------------------------------------------------------------------------


@needs_compiled
@given(messages(), st.binary(max_size=16), st.binary(max_size=16))
@example(NON_ASCII, b"", b"")
def test_decode_matches_on_records(m: Message, before: bytes, after: bytes) -> None:
    raw = before + encode(m) + after
    assert_same_decoding(raw, len(before))
    assert COMPILED.decode(bytearray(raw), len(before)) == m


@needs_compiled
@given(messages())
@example(NON_ASCII)
def test_decode_matches_on_magic_v2_records(m: Message) -> None:
    assert_same_decoding(hand_built(m, magic=record.MAGIC_V2))


@needs_compiled
@given(st.binary(max_size=200), st.binary(max_size=300), st.binary(min_size=8, max_size=8),
       st.binary(min_size=8, max_size=8), st.sampled_from([0, 0x10, 0x20, 0x30]))
def test_decode_matches_on_any_topic_and_properties_bytes(
    topic: bytes, props: bytes, born: bytes, store: bytes, v6_bits: int
) -> None:
    """Topic and properties bytes of every kind: separators anywhere, invalid UTF-8, empty
    names, hosts of any bytes (ports past 2**31 included), sysflag claiming IPv6 hosts."""
    raw = PURE.pack_v4(topic[:127] or b"t", props, b"body", 1, 2, 3, 4, v6_bits, 5, born, 6,
                       store, 7, 8)
    assert_same_decoding(raw)


@needs_compiled
@given(small_messages, edits)
def test_decode_matches_on_mutated_records(m: Message, changes: list[tuple[int, int]]) -> None:
    assert_same_decoding(mutated(encode(m), changes))


@needs_compiled
@given(small_messages, st.data())
def test_decode_matches_on_truncated_records(m: Message, data: st.DataObject) -> None:
    raw = encode(m)
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut at")
    assert_same_decoding(raw[:cut])
    patched = bytearray(raw[:cut])
    if cut >= 4:
        struct.pack_into(">i", patched, 0, cut)  # the total size agrees with the cut
    assert_same_decoding(patched)


@needs_compiled
@given(st.sampled_from([record.MAGIC_V1, record.MAGIC_V2, 0]), st.integers(INT32_MIN, INT32_MAX),
       st.binary(max_size=300), st.integers(-2, 310))
def test_decode_matches_on_garbage(magic: int, size: int, rest: bytes, pos: int) -> None:
    assert_same_decoding(struct.pack(">ii", size, magic) + rest, pos)


# --- iter_records and decode_records --------------------------------------------------------


@needs_compiled
@given(st.lists(small_messages, max_size=4), st.binary(max_size=100), edits)
def test_iter_records_matches(ms: list[Message], tail: bytes,
                              changes: list[tuple[int, int]]) -> None:
    buf = b"".join(encode(m) for m in ms) + tail
    for case in (buf, mutated(buf, changes) if buf else buf):
        seen, error = iterated(PURE, case)
        assert iterated(COMPILED, case) == (seen, error)
        if error is None:
            assert COMPILED.decode_records(case) == PURE.decode_records(case) == seen
        else:
            assert outcome(COMPILED.decode_records, case) == ("raised", error)


def placed_log(ms: list[Message], base: int, blank_at: int | None) -> bytearray:
    """The records of ``ms`` as a log holds them from offset ``base``: each PHYSICALOFFSET
    its place, and a BLANK record (padding) in place of record ``blank_at``."""
    out = bytearray()
    for i, m in enumerate(ms):
        raw = bytearray(encode(m))
        if i == blank_at:
            raw[:8] = struct.pack(">ii", len(raw), record.BLANK_MAGIC)
        struct.pack_into(">q", raw, record.PHYSICAL_OFFSET_AT, base + len(out))
        out += raw
    return out


@needs_compiled
@given(st.lists(small_messages, max_size=6), st.binary(max_size=80), edits,
       st.integers(0, 2**40), st.none() | st.integers(0, 5), st.data())
def test_valid_run_matches(ms: list[Message], tail: bytes, changes: list[tuple[int, int]],
                           base: int, blank_at: int | None, data: st.DataObject) -> None:
    """Over placed records, with a BLANK among them, a garbage tail, bytes changed anywhere
    (a torn write, a wrong offset, a bad CRC or text), any start, end, stop and ceiling."""
    buf = placed_log(ms, base, blank_at) + tail
    case = mutated(buf, changes) if data.draw(st.booleans()) and buf else buf
    pos = data.draw(st.integers(0, len(case)))
    end = data.draw(st.integers(0, len(case) + 8))
    stop = base + data.draw(st.integers(0, len(case) + 8))
    ceiling = data.draw(st.sampled_from([-1, 0, 2**62]) | st.integers(-1, 2**63 - 1))
    for check_crc in (True, False):
        args = (case, pos, end, base + pos, stop)
        expected = outcome(PURE.valid_run, *args, check_crc=check_crc, ceiling=ceiling)
        assert expected[0] == "value"
        assert outcome(COMPILED.valid_run, *args, check_crc=check_crc,
                       ceiling=ceiling) == expected
        assert outcome(COMPILED.valid_run, memoryview(bytes(case)), *args[1:],
                       check_crc=check_crc, ceiling=ceiling) == expected


@needs_compiled
def test_valid_run_reads_a_whole_unspoiled_log_and_its_latest_time() -> None:
    ms = [Message("T", bytes([i]) * i, store_timestamp=1_000 + i) for i in range(1, 9)]
    buf = placed_log(ms, 4096, None)
    for codec in (PURE, COMPILED):
        assert codec.valid_run(buf, 0, len(buf), 4096, 2**62, check_crc=True,
                               ceiling=2**62) == (4096 + len(buf), 1_008)
        assert codec.valid_run(buf, 0, len(buf), 4096, 2**62, check_crc=True,
                               ceiling=1_005) == (4096 + len(buf), 1_005)


repeating_messages = st.builds(
    Message, topic=st.sampled_from(["T", "U", "é", "ü", "TT"]), body=st.binary(max_size=4),
    properties=st.dictionaries(st.sampled_from(["a", "b", "ä", "ö", "TAGS", "KEYS"]),
                               st.sampled_from(["", "x", "é"]), max_size=4))


@needs_compiled
@given(st.lists(repeating_messages, max_size=8), st.lists(repeating_messages, max_size=3))
def test_texts_recalled_from_earlier_records_are_the_right_ones(
    ms: list[Message], batch: list[Message]
) -> None:
    """The kernels reuse the previous record's topic and property names when the bytes repeat;
    records whose texts repeat, change, or differ only in their bytes (``é``, ``ü``) decode
    as the pure codec decodes them."""
    buf = b"".join(encode(m) for m in ms)
    assert COMPILED.decode_records(buf) == PURE.decode_records(buf) == ms
    raw = encode_batch(batch)
    assert outcome(COMPILED.split_batch, raw) == outcome(PURE.split_batch, raw)


@needs_compiled
def test_a_suspended_iteration_holds_no_export_of_the_buffer() -> None:
    """Between records the buffer is free, as with the pure generator: a bytearray grows (an
    exported one could not), and the iteration reads what it grew by."""
    m = Message(topic="T", body=b"x")
    for codec in (PURE, COMPILED):
        buf = bytearray(encode(m))
        records = codec.iter_records(buf)
        assert next(records) == m
        buf.extend(encode(m))
        assert list(records) == [m]


# --- split_batch ----------------------------------------------------------------------------

batch_messages = st.builds(Message, topic=st.just("T"), body=st.binary(max_size=128), flag=int32s,
                           properties=properties)


@needs_compiled
@given(st.lists(batch_messages, max_size=5), edits, st.binary(max_size=300))
def test_split_batch_matches(ms: list[Message], changes: list[tuple[int, int]],
                             garbage: bytes) -> None:
    raw = encode_batch(ms)
    cases = [raw, garbage, raw + garbage, bytes(mutated(raw, changes)) if raw else b""]
    for case in cases:
        assert outcome(COMPILED.split_batch, case) == outcome(PURE.split_batch, case)
    assert outcome(COMPILED.split_batch, memoryview(raw)) == outcome(PURE.split_batch, raw)


@needs_compiled
@given(st.binary(max_size=64), st.binary(max_size=64), int32s)
def test_split_batch_matches_on_any_properties_bytes(body: bytes, props: bytes,
                                                     flag: int) -> None:
    raw = struct.pack(">iiiii", 22 + len(body) + len(props), 0, 0, flag, len(body)) + body
    raw += struct.pack(">h", len(props)) + props
    assert outcome(COMPILED.split_batch, raw) == outcome(PURE.split_batch, raw)


batch_entries_at_limits = st.builds(
    Message, topic=st.just("T"), body=st.binary(max_size=64) | st.binary(max_size=8).map(bytearray),
    flag=st.integers(INT32_MIN - 1, INT32_MAX + 1) | st.sampled_from([INT32_MIN, INT32_MAX]),
    properties=properties | st.sampled_from([{"k": "v" * 32764}, {"k": "v" * 32765}]))


@needs_compiled
@given(st.lists(batch_entries_at_limits, max_size=5))
def test_encode_batch_matches(ms: list[Message]) -> None:
    assert outcome(COMPILED.encode_batch, ms) == outcome(PURE.encode_batch, ms)
    # Entries that live only while they are iterated, as the producer passes inflated copies.
    fresh = (attrs.evolve(m, body=bytes(bytearray(m.body))) for m in ms)
    assert outcome(COMPILED.encode_batch, fresh) == outcome(PURE.encode_batch, ms)


# --- pack_v4 --------------------------------------------------------------------------------

int32_edges = st.integers(INT32_MIN - 1, INT32_MAX + 1) | st.sampled_from(
    [INT32_MIN, INT32_MAX, INT32_MIN - 1, INT32_MAX + 1, 0, -1])
int64_edges = st.integers(INT64_MIN - 1, INT64_MAX + 1) | st.sampled_from(
    [INT64_MIN, INT64_MAX, INT64_MIN - 1, INT64_MAX + 1, 0, -1])
host_fields = st.binary(max_size=10) | st.binary(max_size=10).map(bytearray)


pack_v4_arguments = st.tuples(
    st.binary(max_size=128), st.binary(max_size=40) | st.sampled_from([b"p" * 32767,
                                                                       b"p" * 32768]),
    st.binary(max_size=2048), int32_edges, int32_edges, int64_edges, int64_edges, int32_edges,
    int64_edges, host_fields, int64_edges, host_fields, int32_edges, int64_edges)


@needs_compiled
@given(pack_v4_arguments)
def test_pack_v4_matches(args: tuple[Any, ...]) -> None:
    """Every field at and past its limits: the same bytes, or the same error type."""
    expected = outcome(PURE.pack_v4, *args)
    assert outcome(COMPILED.pack_v4, *args) == expected
    topic, props, body, *fields = args
    assert outcome(COMPILED.pack_v4, topic, props, bytearray(body), *fields) == expected


@needs_compiled
@pytest.mark.parametrize("bad", [1.0, "1", None, 2**64])
def test_pack_v4_rejects_what_struct_rejects(bad: object) -> None:
    args: list[Any] = [b"t", b"", b"", 1, 2, 3, 4, 5, 6, b"h" * 8, 7, b"h" * 8, 8, 9]
    for at in (3, 5, 9, 11):
        case = [*args]
        case[at] = bad
        assert outcome(COMPILED.pack_v4, *case) == outcome(PURE.pack_v4, *case)


# --- offset msgIds --------------------------------------------------------------------------


@needs_compiled
@given(st.binary(max_size=24),
       st.lists(st.integers(-3, 2**40) | st.sampled_from([0, 2**63 - 1, 2**64 - 1, 2**64]),
                max_size=6))
def test_offset_msg_ids_match(host: bytes, offsets: list[int]) -> None:
    assert (outcome(COMPILED.offset_msg_ids, host, offsets)
            == outcome(PURE.offset_msg_ids, host, offsets))
    assert (outcome(COMPILED.offset_msg_ids, host, iter(offsets))
            == outcome(PURE.offset_msg_ids, host, offsets))
