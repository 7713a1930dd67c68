"""The remoting codec fed bytes: layouts, both clients' header dialects, malformed frames."""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.codes import BrokerError, ResponseCode
from evq.net import protocol
from evq.net.codes import LanguageCode, RequestCode, Version
from evq.net.protocol import (
    BINARY_FIXED,
    INT32_MAX,
    MAX_FRAME,
    MAX_HEADER,
    FrameDecoder,
    HeaderFieldError,
    OpaqueCounter,
    ProtocolError,
    RemotingCommand,
    SerializeType,
    ext_fields,
    parse_bool_field,
    parse_int_field,
    parse_long_field,
)
from tests.strategies import remoting_commands


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A frame built by hand, the way a client lays it out."""
    word = serialize_type << 24 | len(header)
    return struct.pack(">iI", 4 + len(header) + len(body), word) + header + body


def decode_all(data: bytes, max_frame: int = MAX_FRAME) -> list[RemotingCommand]:
    decoder = FrameDecoder(max_frame)
    decoder.feed(data)
    out = []
    while (cmd := decoder.next_command()) is not None:
        out.append(cmd)
    assert decoder.buffered == 0
    return out


def decode_one(data: bytes) -> RemotingCommand:
    (cmd,) = decode_all(data)
    return cmd


def broken(data: bytes, max_frame: int = MAX_FRAME) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_all(data, max_frame)
    return info.value

# --- round trips -------------------------------------------------------------------------------


@given(remoting_commands())
def test_every_command_survives_encode_and_decode(cmd: RemotingCommand) -> None:
    assert decode_one(cmd.encode()) == cmd


@given(remoting_commands())
def test_a_command_made_directly_equals_the_constructors(cmd: RemotingCommand) -> None:
    values = attrs.astuple(cmd, recurse=False)
    made = RemotingCommand.direct(*values)
    assert made == cmd
    assert attrs.astuple(made, recurse=False) == values  # every field set, none forgotten


@given(st.lists(remoting_commands(body=st.binary(max_size=64)), max_size=6), st.data())
def test_decoder_reassembles_any_chunking(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    stream = b"".join(c.encode() for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder()
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoder.feed(stream[start:end])
        while (cmd := decoder.next_command()) is not None:
            got.append(cmd)
    assert got == cmds
    assert decoder.buffered == 0


@given(st.binary(max_size=512), st.data())
def test_garbage_only_ever_raises_protocol_error(garbage: bytes, data: st.DataObject) -> None:
    decoder = FrameDecoder(max_frame=4096)
    at = 0
    while at < len(garbage):
        step = data.draw(st.integers(1, len(garbage) - at))
        decoder.feed(garbage[at : at + step])
        at += step
        try:
            while decoder.next_command() is not None:
                pass
        except ProtocolError:
            return
        assert decoder.buffered <= at


@given(remoting_commands(body=st.binary(max_size=32)), st.data())
def test_corrupted_frames_only_ever_raise_protocol_error(
    cmd: RemotingCommand, data: st.DataObject
) -> None:
    raw = bytearray(cmd.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    decoder = FrameDecoder(max_frame=4096)
    decoder.feed(raw)
    with contextlib.suppress(ProtocolError):
        while (decoded := decoder.next_command()) is not None:
            assert all(type(v) is str for v in decoded.ext_fields.values())


@given(st.dictionaries(st.text(max_size=8),
                       st.integers() | st.booleans() | st.text(max_size=8), max_size=6))
def test_mixed_scalar_ext_fields_come_out_as_java_strings(raw: dict[str, object]) -> None:
    header = json.dumps({"code": 11, "opaque": 1, "extFields": raw}).encode()
    fields = decode_one(frame(header)).ext_fields
    for key, value in raw.items():
        expected = {True: "true", False: "false"}[value] if isinstance(value, bool) else str(value)
        assert fields[key] == expected


# --- the JSON header, as clients send it and as they must read it --------------------------


def test_response_header_is_fastjson_ordered_compact_with_string_ext_fields() -> None:
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=17)
    response = request.response(fields={"msgId": "C0A8", "queueId": 3, "queueOffset": 1 << 40})
    raw = response.encode()
    length, word = struct.unpack_from(">ii", raw)
    assert word >> 24 == 0, "stock clients read the header word unmasked"
    assert length == len(raw) - 4
    assert raw[8 : 8 + word] == (
        b'{"code":0,"extFields":{"msgId":"C0A8","queueId":"3","queueOffset":"1099511627776"},'
        b'"flag":1,"language":"JAVA","opaque":17,"serializeTypeCurrentRPC":"JSON","version":407}'
    )



_field_values = st.none() | st.text() | st.integers() | st.booleans()


@given(remoting_commands(), st.integers(-(2**31), 2**31 - 1), st.none() | st.text(),
       st.none() | st.dictionaries(st.text(), _field_values), st.binary(max_size=8))
def test_a_response_is_what_the_constructor_makes_of_its_fields(
    request: RemotingCommand, code: int, remark: str | None,
    fields: dict[str, object] | None, body: bytes,
) -> None:
    """response() sets the slots itself (RemotingCommand.direct); the converter still runs."""
    assert request.response(code, remark, fields, body) == RemotingCommand(
        code=code, opaque=request.opaque, flag=protocol.RESPONSE_FLAG, remark=remark,
        ext_fields=fields, body=body, serialize_type=request.serialize_type)

def test_response_omits_absent_remark_and_ext_fields_like_java() -> None:
    raw = RemotingCommand(code=RequestCode.HEART_BEAT, opaque=2).response().encode()
    header = json.loads(raw[8:])
    assert "remark" not in header
    assert "extFields" not in header


def test_cpp_request_with_trailing_newline_and_int_fields() -> None:
    # jsoncpp FastWriter: alphabetical keys, remark "", ints and strings mixed, "\n" counted.
    header = (
        b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"",'
        b'"batch":"0","defaultTopicQueueNums":4,"flag":0,"producerGroup":"pg","queueId":2,'
        b'"sysFlag":0,"topic":"T"},"flag":0,"language":"CPP","opaque":0,"remark":"",'
        b'"serializeTypeCurrentRPC":"JSON","version":63}\n'
    )
    cmd = decode_one(frame(header, b"hello"))
    assert cmd.code == RequestCode.SEND_MESSAGE
    assert cmd.language is LanguageCode.CPP
    assert cmd.version == Version.V3_1_8
    assert cmd.remark == ""
    assert cmd.body == b"hello"
    assert cmd.ext_fields["queueId"] == "2"
    assert parse_int_field("queueId", cmd.ext_fields["queueId"]) == 2
    assert parse_bool_field("batch", cmd.ext_fields["batch"]) is False
    assert cmd.ext_fields["producerGroup"] == "pg"


def test_ali_ons_request_in_its_own_key_order_with_js_values() -> None:
    header = (
        b'{"code":11,"language":"JAVA","opaque":5,"flag":0,"version":121,'
        b'"extFields":{"consumerGroup":"g","queueId":0,"queueOffset":1700000000000,'
        b'"sysFlag":6,"commitOffset":0,"suspendTimeoutMillis":15000,"subscription":"*",'
        b'"subVersion":1700000000000,"unitMode":false}}'
    )
    cmd = decode_one(frame(header))
    assert cmd.opaque == 5
    assert cmd.version == Version.V3_4_9
    assert cmd.remark is None
    assert parse_long_field("queueOffset", cmd.ext_fields["queueOffset"]) == 1_700_000_000_000
    assert cmd.ext_fields["unitMode"] == "false"
    assert cmd.ext_fields["queueId"] == "0"


def test_numeric_strings_are_read_for_top_level_ints() -> None:
    cmd = decode_one(frame(b'{"code":"34","opaque":"9","flag":"0"}'))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version) == (34, 9, 0, 0)


def test_unknown_language_is_other() -> None:
    cmd = decode_one(frame(b'{"code":34,"opaque":1,"language":"COBOL"}'))
    assert cmd.language is LanguageCode.OTHER


# --- the ROCKETMQ binary header ------------------------------------------------------------


def test_binary_header_layout() -> None:
    cmd = RemotingCommand(
        code=RequestCode.PULL_MESSAGE, language=LanguageCode.PYTHON, version=407, opaque=9,
        flag=2, remark="hi", ext_fields={"k": "vv"}, body=b"B",
        serialize_type=SerializeType.ROCKETMQ,
    )
    header = (
        struct.pack(">hBhii", 11, 3, 407, 9, 2)
        + struct.pack(">i", 2) + b"hi"
        + struct.pack(">i", 2 + 1 + 4 + 2) + struct.pack(">h", 1) + b"k" + struct.pack(">i", 2)
        + b"vv"
    )
    assert cmd.encode() == frame(header, b"B", serialize_type=1)


def test_binary_empty_remark_means_none() -> None:
    cmd = RemotingCommand(code=0, remark="", serialize_type=SerializeType.ROCKETMQ)
    assert decode_one(cmd.encode()).remark is None


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (struct.pack(">hBhi", 1, 0, 0, 0), "truncated"),
        (struct.pack(">hBhiii", 1, 0, 0, 7, 0, 99), "out of range"),
        (struct.pack(">hBhiiii", 1, 0, 0, 7, 0, 0, 3), "does not fit"),
        (struct.pack(">hBhiiii", 1, 0, 0, 7, 0, 0, 6) + struct.pack(">h", 9) + b"abcd",
         "out of range"),
        (struct.pack(">hBhiii", 1, 0, 0, 7, 0, 1) + b"\xff" + struct.pack(">i", 0),
         "not UTF-8"),
    ],
)
def test_malformed_binary_headers(header: bytes, reason: str) -> None:
    error = broken(frame(header, serialize_type=1))
    assert reason in error.reason


def test_unencodable_binary_header_is_a_protocol_error() -> None:
    cmd = RemotingCommand(code=1 << 20, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ProtocolError):
        cmd.encode()


# --- malformed frames ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">i", -1), "too small"),
        (struct.pack(">ii", 3, 0), "too small"),
        (struct.pack(">ii", 8, 5) + b"{}{}", "exceeds frame length"),
        (frame(b"{not json"), "not JSON"),
        (frame(b"\xff\xfe"), "not JSON"),
        (frame(b"[" * 100_000), "not JSON"),
        (frame(b"[1,2]"), "not an object"),
        (frame(b'{"code":1}'), "no opaque"),
        (frame(b"{}", serialize_type=7), "unknown serialize type 7"),
        (frame(b"{}", serialize_type=0x80), "unknown serialize type 128"),
    ],
)
def test_malformed_frames_without_a_known_opaque(data: bytes, reason: str) -> None:
    error = broken(data)
    assert reason in error.reason
    assert error.opaque is None
    assert error.response() is None


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b'{"opaque":7}', "no code"),
        (b'{"opaque":7,"code":true}', "'code' is not an int"),
        (b'{"opaque":7,"code":1.5}', "'code' is not an int"),
        (b'{"opaque":7,"code":4294967296}', "'code' is not an int"),
        (b'{"opaque":7,"code":1,"language":3}', "'language'"),
        (b'{"opaque":7,"code":1,"remark":[]}', "'remark'"),
        (b'{"opaque":7,"code":1,"extFields":[]}', "'extFields' is not an object"),
        (b'{"opaque":7,"code":1,"extFields":{"a":{"b":1}}}', "'extFields'"),
    ],
)
def test_malformed_requests_with_a_known_opaque_can_be_answered(
    header: bytes, reason: str
) -> None:
    error = broken(frame(header))
    assert reason in error.reason
    assert error.opaque == 7
    answer = error.response()
    assert answer is not None
    assert (answer.code, answer.opaque, answer.is_response) == (ResponseCode.SYSTEM_ERROR, 7, True)
    assert decode_one(answer.encode()).remark == error.reason


@pytest.mark.parametrize("flag", [1, 2, 3])
def test_broken_responses_and_oneway_requests_get_no_answer(flag: int) -> None:
    error = broken(frame(b'{"opaque":7,"code":[],"flag":%d}' % flag))
    assert error.response() is None


def test_oversize_frame_is_refused_from_its_length_and_answered_from_its_header() -> None:
    header = b'{"code":10,"opaque":42}'
    prefix = struct.pack(">ii", 4 + len(header) + 2000, len(header)) + header
    decoder = FrameDecoder(max_frame=1024)
    decoder.feed(prefix)  # the body never arrives: the length alone decides
    with pytest.raises(ProtocolError) as info:
        decoder.next_command()
    assert "exceeds the 1024-byte limit" in info.value.reason
    assert info.value.opaque == 42


def test_oversize_frame_before_its_header_arrived_has_no_opaque() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", MAX_FRAME))
    with pytest.raises(ProtocolError) as info:
        decoder.next_command()
    assert info.value.opaque is None


def binary_header(size: int, *, opaque: int = 9, flag: int = 0) -> bytes:
    """A ROCKETMQ request header of exactly ``size`` bytes: its remark fills what the fixed
    fields and the two lengths leave."""
    fixed = BINARY_FIXED.pack(10, 0, 317, opaque, flag)
    remark = b"r" * (size - len(fixed) - 8)
    return fixed + struct.pack(">i", len(remark)) + remark + struct.pack(">i", 0)


def json_header(size: int) -> bytes:
    """A JSON request header of exactly ``size`` bytes, its remark the filling."""
    start, end = b'{"code":10,"opaque":9,"remark":"', b'"}'
    return start + b"r" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(("make", "kind"), [(json_header, 0), (binary_header, 1)])
def test_a_header_of_exactly_the_limit_is_decoded(make: Callable[[int], bytes],
                                                   kind: int) -> None:
    header = make(MAX_HEADER)
    assert len(header) == MAX_HEADER
    cmd = decode_one(frame(header, b"body", kind))
    assert (cmd.code, cmd.opaque, cmd.body) == (10, 9, b"body")
    assert cmd.remark is not None and len(cmd.remark) > MAX_HEADER - 64
    assert cmd.remark == "r" * len(cmd.remark)


@pytest.mark.parametrize(
    ("header", "kind", "opaque"),
    [
        (binary_header(MAX_HEADER + 1), 1, 9),  # a request: answerable from its fixed fields
        (binary_header(MAX_HEADER + 1, flag=1), 1, None),  # a response
        (binary_header(MAX_HEADER + 1, flag=2), 1, None),  # oneway
        (json_header(MAX_HEADER + 1), 0, None),  # its opaque could be anywhere in it
    ],
)
def test_a_header_over_the_limit_is_refused_from_its_header_word(
    header: bytes, kind: int, opaque: int | None
) -> None:
    whole = frame(header, b"", kind)
    for sent in (whole[: 8 + BINARY_FIXED.size], whole):  # the rest never came, or did
        decoder = FrameDecoder(max_header=MAX_HEADER)  # a server's
        decoder.feed(sent)
        with pytest.raises(ProtocolError) as info:
            decoder.next_command()
        assert info.value.reason == (
            f"header of {MAX_HEADER + 1} bytes exceeds the {MAX_HEADER}-byte limit")
        assert info.value.opaque == opaque
    assert decode_one(whole).opaque == 9  # a client's decoder takes any its frame holds


def test_a_batch_sends_answer_past_the_header_limit_reaches_its_client() -> None:
    """A batch send's answer names every message stored: 190,650 fit a 4 MiB batch."""
    ids = ",".join(f"{i:032X}" for i in range(190_650))
    answer = RemotingCommand(code=0, opaque=4, flag=1, ext_fields={"msgId": ids})
    assert len(answer.encode()) > 6_000_000
    assert decode_one(answer.encode()).ext_fields["msgId"] == ids


def test_a_header_over_the_limit_before_its_fixed_fields_arrived_has_no_opaque() -> None:
    decoder = FrameDecoder(max_header=MAX_HEADER)
    decoder.feed(frame(binary_header(MAX_HEADER + 1), b"", 1)[:8])
    with pytest.raises(ProtocolError) as info:
        decoder.next_command()
    assert info.value.opaque is None


@pytest.mark.parametrize(("header", "kind", "opaque"),
                         [(binary_header(2048), 1, 9), (json_header(2048), 0, None)])
def test_an_oversize_frame_is_not_decoded_for_its_opaque_past_the_header_limit(
    header: bytes, kind: int, opaque: int | None
) -> None:
    """The salvage of an oversize frame's opaque reads no more of a header than a frame's
    decoding would: past the bound, a ROCKETMQ header's fixed fields only."""
    decoder = FrameDecoder(max_frame=4096, max_header=1024)
    decoder.feed(frame(header, bytes(5000), kind)[: 8 + len(header)])
    with pytest.raises(ProtocolError) as info:
        decoder.next_command()
    assert "exceeds the 4096-byte limit" in info.value.reason
    assert info.value.opaque == opaque


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    header = b'{"code":10,"opaque":1}'
    body = bytes(100 - 8 - len(header))
    assert decode_one(frame(header, body)).body == body
    assert len(frame(header, body)) == 100
    assert decode_all(frame(header, body), max_frame=100)
    broken(frame(header, body + b"x"), max_frame=100)


def test_decoder_stays_failed_and_ignores_later_bytes() -> None:
    decoder = FrameDecoder()
    decoder.feed(frame(b"nope"))
    with pytest.raises(ProtocolError) as first:
        decoder.next_command()
    decoder.feed(RemotingCommand(code=1, opaque=1).encode())
    with pytest.raises(ProtocolError) as again:
        decoder.next_command()
    assert again.value is first.value


def test_good_frames_before_a_bad_one_are_delivered() -> None:
    good = RemotingCommand(code=34, opaque=1)
    decoder = FrameDecoder()
    decoder.feed(good.encode() + frame(b"nope"))
    assert decoder.next_command() == good
    with pytest.raises(ProtocolError):
        decoder.next_command()


# --- building commands ---------------------------------------------------------------------


@given(remoting_commands(body=st.just(b"")))
def test_response_keeps_opaque_and_serialization_and_sets_the_response_bit(
    request: RemotingCommand,
) -> None:
    response = request.response(ResponseCode.TOPIC_NOT_EXIST, "no topic")
    assert response.opaque == request.opaque
    assert response.serialize_type is request.serialize_type
    assert response.is_response
    assert not response.is_oneway
    assert (response.code, response.remark) == (ResponseCode.TOPIC_NOT_EXIST, "no topic")


def test_request_builder_flags_and_fields() -> None:
    cmd = RemotingCommand.request(
        RequestCode.UPDATE_CONSUMER_OFFSET, {"queueId": 1, "commit": True, "skip": None},
        oneway=True,
    )
    assert cmd.is_oneway
    assert not cmd.is_response
    assert cmd.ext_fields == {"queueId": "1", "commit": "true"}


def test_ext_fields_refuses_structured_values() -> None:
    with pytest.raises(TypeError):
        ext_fields({"a": [1]})


def test_opaque_counter_stays_positive_31_bit() -> None:
    counter = OpaqueCounter()
    assert [counter(), counter()] == [1, 2]
    counter = OpaqueCounter(INT32_MAX - 1)
    assert [counter() for _ in range(4)] == [INT32_MAX - 1, INT32_MAX, 1, 2]


# --- header field values -------------------------------------------------------------------
# (Headers are read with these through evq.net.headers: tests/net/test_headers.py.)


def test_typed_values() -> None:
    assert parse_int_field("queueId", "3") == 3
    assert parse_long_field("queueOffset", "-9223372036854775808") == -(2**63)
    assert parse_long_field("big", "2147483648") == 2**31
    assert [parse_bool_field("b", t) for t in ("1", "TRUE", "0", "False")] == [
        True, True, False, False]


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_int_field, "2147483648", "<f> is not a valid int"),
        (parse_int_field, "abc", "<f> is not a valid int"),
        (parse_int_field, " 1", "<f> is not a valid int"),
        (parse_long_field, "", "<f> is not a valid long"),
        (parse_bool_field, "yes", "<f> is not a valid boolean"),
    ],
)
def test_bad_fields_are_system_errors_naming_the_field(
    parse: Callable[[str, str], object], text: str, message: str
) -> None:
    with pytest.raises(BrokerError) as info:
        parse("f", text)
    assert info.value.code is ResponseCode.SYSTEM_ERROR
    assert message in info.value.remark


def test_huge_numeric_text_is_a_field_error_not_a_crash() -> None:
    with pytest.raises(HeaderFieldError):
        parse_long_field("n", "9" * 10_000)
    with pytest.raises(ProtocolError):
        decode_all(frame(b'{"code":1,"opaque":"' + b"9" * 10_000 + b'"}'))


@pytest.mark.parametrize("header", [
    b'{"code":11,"opaque":1,"extFields":{"k":"\\ud800x"}}',  # lone surrogate escape
    b'{"code":11,"opaque":1,"extFields":{"k":123456789012345678901234567890}}',  # past 64 bits
    b'{"code":11,"opaque":1,"extFields":{"k":-9223372036854775809,"f":1.5e300}}',
    b'{"code":11,"opaque":1,"extFields":{"k":NaN}}',
    b'{"code":11,"opaque":1,"remark":"caf\\u00e9 \\ud83d\\ude00","extFields":{"k":"\\u00e9"}}',
])
def test_json_headers_read_as_the_json_module_reads_them(header: bytes) -> None:
    """orjson reads most headers; where it would read one differently (big integers become
    floats) or not at all, the json module's reading stands, and the answer goes out ASCII."""
    cmd = decode_one(frame(header))
    raw = json.loads(header)
    assert cmd.remark == raw.get("remark")
    assert cmd.ext_fields == {k: str(v) for k, v in raw["extFields"].items()}
    answer = cmd.response(fields=cmd.ext_fields, remark=cmd.remark).encode()
    assert answer[8:].isascii()
    assert decode_one(answer).ext_fields == cmd.ext_fields


_json_scalars = (st.none() | st.booleans() | st.floats(allow_nan=False)
                 | st.integers(-(2**70), 2**70) | st.integers(-(2**31) - 2, 2**31 + 1)
                 | st.text(max_size=6) | st.integers(-9, 9).map(str))
_header_keys = st.sampled_from(["code", "opaque", "flag", "version", "language", "remark",
                                "serializeTypeCurrentRPC", "other"])


@given(st.dictionaries(_header_keys, _json_scalars),
       st.none() | st.dictionaries(st.text(max_size=4), _json_scalars, max_size=4)
       | _json_scalars)
def test_json_header_short_way_reads_every_header_as_the_checked_way(
        top: dict[str, object], ext: object) -> None:
    """The decoder's short way for well-formed JSON headers gives the command, or the error,
    the checked way gives, whatever the fields hold."""
    obj = dict(top) if ext is None else {**top, "extFields": ext}
    header = json.dumps(obj).encode()

    def outcome(decode: Callable[[bytes, bytes], RemotingCommand]) -> object:
        try:
            return decode(header, b"b")
        except ProtocolError as exc:
            return (exc.reason, exc.opaque)

    assert outcome(protocol._decode_json) == outcome(protocol._decode_json_checked)


def _has_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@given(st.dictionaries(st.text(max_size=4), st.text(max_size=8), max_size=4))
def test_a_hot_request_goes_binary_wherever_utf8_carries_its_texts(
        fields: dict[str, str]) -> None:
    """Any key and value (every character a str holds, lone surrogates too): ROCKETMQ exactly
    when each has UTF-8, else JSON; either way the broker reads the command back as sent."""
    kind = protocol.serialization_for(fields)
    texts = [t for field in fields.items() for t in field]
    assert (kind is SerializeType.ROCKETMQ) == all(map(_has_utf8, texts))
    cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=3, ext_fields=fields,
                          serialize_type=kind)
    decoder = FrameDecoder()
    decoder.feed(cmd.encode())
    assert decoder.next_command() == cmd
