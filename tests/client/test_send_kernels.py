"""The compiled send kernels (evq/client/send_kernels.pyx) against their pure-Python reference.

``send_request`` must give what ``send_command(...)`` and ``RemotingCommand.encode()`` give
(the pure ``_send_request``): the same command and the same frame bytes for every message, and
the same error for every message those refuse; ``send_result`` must read an answer's header as
``SendResponse.read`` does, refusal for refusal.  The module also checks that the compiled
kernels are the ones in use wherever a C compiler exists, and that the variable selects pure
Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evq.client import producer
from evq.client.producer import COMPILED, PURE, SendStatus, send_command
from evq.domain.message import MAX_PROPERTIES_BYTES, Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.topics import RETRY_PREFIX
from evq.net.protocol import (
    HEADER_LENGTH_MASK,
    PURE_PYTHON_VARIABLE,
    RemotingCommand,
    SerializeType,
)
from tests.processes import REPO_ROOT, python_env
from tests.strategies import bodies, codec_topics, properties, sysflags

PURE_RUN = os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0")

pytestmark = pytest.mark.skipif(COMPILED is None, reason="the compiled kernels are not built")


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What a call gives: its value, or what it raised (type and text)."""
    try:
        return "value", fn(*args)
    except Exception as exc:  # the comparison is the point: any error must match
        return "raised", (type(exc), str(exc))


def test_the_compiled_kernels_are_built_and_used_where_a_compiler_is() -> None:
    assert producer.KERNELS is (PURE if PURE_RUN else COMPILED)
    if not PURE_RUN:
        assert producer.send_request is COMPILED.send_request
        assert producer.send_result is COMPILED.send_result


def test_the_variable_selects_the_pure_kernels() -> None:
    program = ("from evq.client import producer; "
               "assert producer.KERNELS is producer.PURE and producer.COMPILED is None")
    env = {**python_env(), PURE_PYTHON_VARIABLE: "1"}
    subprocess.run([sys.executable, "-c", program], check=True, cwd=REPO_ROOT, env=env)


# --- the request ------------------------------------------------------------------------------

# Every character a str can hold, lone surrogates and the separators included: what the
# properties string refuses must be refused the same way, and any other text written the same.
_any_text = st.text(st.characters(), max_size=12)
_ints = st.integers(-(2**31), 2**31 - 1) | st.integers(-(2**70), 2**70)
_any_properties = st.dictionaries(_any_text, _any_text, max_size=6)


def sent(topic: str, body: bytes, props: dict[str, str], *, sysflag: int = 0, born: int = 0,
         flag: int = 0, reconsume: int = 0) -> Message:
    msg = Message(topic, body, flag, props, 0, sysflag)
    msg.born_timestamp, msg.reconsume_times = born, reconsume
    return msg


def assert_same_request(group: object, queue: MessageQueue, msg: Message, opaque: object
                        ) -> None:
    compiled = outcome(COMPILED.send_request, group, queue, msg, opaque)
    assert compiled == outcome(PURE.send_request, group, queue, msg, opaque)
    if compiled[0] == "value":  # and it is what a producer sent before the kernels
        cmd, frame = compiled[1]
        before = send_command(group, queue, [msg], batch=False)  # type: ignore[arg-type]
        before.opaque = opaque  # type: ignore[assignment]
        assert (cmd, frame) == (before, before.encode())


@given(group=st.text(st.characters(), min_size=1, max_size=12),
       topic=codec_topics | _any_text, queue_id=_ints, body=bodies,
       props=properties | _any_properties, sysflag=sysflags() | _ints,
       born=_ints, flag=_ints, reconsume=_ints, opaque=st.integers(1, 2**31 - 1))
@example(group="P", topic="T", queue_id=0, body=b"", props={}, sysflag=0, born=0, flag=0,
         reconsume=0, opaque=1)
@example(group="P", topic="T", queue_id=0, body=b"x", props={"k": "\x7f"}, sysflag=0, born=0,
         flag=0, reconsume=0, opaque=1)  # DEL
@example(group="P", topic="T", queue_id=0, body=b"x", props={"k": "\x7f\u00e9\U0001F600"},
         sysflag=0, born=0, flag=0, reconsume=0, opaque=1)  # UTF-8 of two, three, four bytes
@example(group="P", topic="T", queue_id=0, body=b"x", props={"k": "\ud800"}, sysflag=0,
         born=0, flag=0, reconsume=0, opaque=1)  # a lone surrogate: no UTF-8, so JSON
@example(group="P", topic="T", queue_id=0, body=b"x", props={"": "v"}, sysflag=0, born=0,
         flag=0, reconsume=0, opaque=1)
@example(group="P", topic="T", queue_id=0, body=b"x", props={"k": "a\x01b"}, sysflag=0,
         born=0, flag=0, reconsume=0, opaque=1)
@example(group="\"\\\b\t\n\f\r\x00\x1f", topic="T", queue_id=0, body=b"x", props={},
         sysflag=0, born=0, flag=0, reconsume=0, opaque=2**31 - 1)
def test_any_single_send_gives_the_same_command_and_frame(
        group: str, topic: str, queue_id: int, body: bytes, props: dict[str, str],
        sysflag: int, born: int, flag: int, reconsume: int, opaque: int) -> None:
    msg = sent(topic, body, props, sysflag=sysflag, born=born, flag=flag, reconsume=reconsume)
    assert_same_request(group, MessageQueue(topic, "broker-a", queue_id), msg, opaque)


@given(suffix=_any_text, limit=st.none() | _any_text | st.integers(0, 99).map(str))
def test_a_retry_topic_gives_the_same(suffix: str, limit: str | None) -> None:
    props = {Prop.UNIQ_KEY: "K"} if limit is None else {Prop.MAX_RECONSUME_TIMES: limit}
    msg = sent(RETRY_PREFIX + suffix, b"x", props)
    assert_same_request("G", MessageQueue(RETRY_PREFIX + suffix, "b", 0), msg, 5)


@pytest.mark.parametrize("change", [
    {"body": bytearray(b"abc")},
    {"properties": {"k": 1}},
    {"properties": {1: "v"}},
    {"flag": True},  # an int subclass: its own str()
    {"flag": 1.5},
    {"flag": None},
    {"sysflag": None},
])
def test_fields_of_other_types_give_the_same(change: dict[str, Any]) -> None:
    msg = sent("T", b"x", {Prop.UNIQ_KEY: "K"})
    for name, value in change.items():
        setattr(msg, name, value)
    assert_same_request("G", MessageQueue("T", "b", 1), msg, 9)


@pytest.mark.parametrize(("group", "opaque"), [(b"G", 1), (None, 1), ("G", True), ("G", 2**40)])
def test_a_group_or_opaque_of_another_type_gives_the_same(group: object, opaque: object) -> None:
    assert_same_request(group, MessageQueue("T", "b", 1), sent("T", b"x", {}), opaque)


@pytest.mark.parametrize("value_size", [MAX_PROPERTIES_BYTES, HEADER_LENGTH_MASK - 400,
                                        HEADER_LENGTH_MASK])
@pytest.mark.parametrize("char", ["a", "\x01x", "\u00e9", "\x00"])
def test_properties_up_to_and_past_the_header_limit_give_the_same(value_size: int,
                                                                  char: str) -> None:
    value = (char * (value_size // len(char)))[:value_size]
    msg = sent("T", b"body", {Prop.UNIQ_KEY: "K", "big": value})
    assert_same_request("G", MessageQueue("T", "b", 1), msg, 3)


# --- the answer -------------------------------------------------------------------------------

_numbers = st.integers(-(2**64), 2**64).map(str)
_field_texts = st.none() | _numbers | st.text(max_size=24) | st.sampled_from(
    ["", "+1", "-0", "0x10", "\u0661", "2147483648", "9223372036854775808", " 1"])


@given(msg_id=st.none() | st.text(max_size=40), queue_id=_field_texts,
       queue_offset=_field_texts, own_queue=st.integers(0, 8),
       status=st.sampled_from(list(SendStatus)), extra=st.dictionaries(_any_text, _any_text))
@example(msg_id="AB", queue_id="3", queue_offset="17", own_queue=3, status=SendStatus.SEND_OK,
         extra={})
@example(msg_id=None, queue_id="4", queue_offset="x", own_queue=3, status=SendStatus.SEND_OK,
         extra={})
def test_any_answer_gives_the_same_result(msg_id: str | None, queue_id: str | None,
                                          queue_offset: str | None, own_queue: int,
                                          status: SendStatus, extra: dict[str, str]) -> None:
    fields = dict(extra)
    for name, value in (("msgId", msg_id), ("queueId", queue_id),
                        ("queueOffset", queue_offset)):
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value
    queue = MessageQueue("T", "b", own_queue)
    compiled = outcome(COMPILED.send_result, status, "K", queue, fields)
    assert compiled == outcome(PURE.send_result, status, "K", queue, fields)
    if compiled[0] == "value":
        assert compiled[1].queue == queue or compiled[1].queue.queue_id == int(fields["queueId"])


def test_an_answer_read_from_another_mapping_gives_the_same() -> None:
    class Fields(dict[str, str]):
        pass

    fields = Fields(msgId="M", queueId="2", queueOffset="5")
    queue = MessageQueue("T", "b", 1)
    args = (SendStatus.SEND_OK, "K", queue, fields)
    assert outcome(COMPILED.send_result, *args) == outcome(PURE.send_result, *args)


def test_a_request_from_the_kernel_reads_back_as_sent() -> None:
    """The frame decodes to the command the kernel returned, as a broker reads it."""
    from evq.net.protocol import FrameDecoder

    msg = sent("T", b"payload", {Prop.UNIQ_KEY: "K", Prop.TAGS: "t\u00e9"}, born=1_700_000_000_000)
    cmd, frame = COMPILED.send_request("G", MessageQueue("T", "b", 2), msg, 41)
    decoder = FrameDecoder()
    decoder.feed(frame)
    decoded = decoder.next_command()
    assert isinstance(decoded, RemotingCommand) and decoded == cmd


@pytest.mark.parametrize(("props", "kind"), [
    ({Prop.UNIQ_KEY: "K", Prop.TAGS: "t\u00e9\U0001F600"}, SerializeType.ROCKETMQ),
    ({Prop.UNIQ_KEY: "K", "k": "\udc80"}, SerializeType.JSON),  # surrogateescape's kind
])
def test_a_send_goes_in_the_binary_header_where_utf8_carries_it(
        props: dict[str, str], kind: SerializeType) -> None:
    """The header's serialization is in the frame's header word, and the broker reads the
    command back either way."""
    from evq.net.protocol import FrameDecoder

    msg = sent("T", b"payload", props, born=1_700_000_000_000)
    for kernels in (COMPILED, PURE):
        cmd, frame = kernels.send_request("G", MessageQueue("T", "b", 2), msg, 41)
        assert frame is not None and frame[4] == kind == cmd.serialize_type
        decoder = FrameDecoder()
        decoder.feed(frame)
        assert decoder.next_command() == cmd
