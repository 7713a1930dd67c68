"""A Hypothesis-driven wire fuzzer: past the framing, into every request code's fields.

For each request code a broker or name server answers, the fields its handler reads (their
kinds come from the robustness suite's table, ``BROKER_SHAPES``/``NAMESRV_SHAPES``) are drawn
from their whole domain: any text (legal names, illegal ones, 5,000-character strings, every
Unicode plane), any 64-bit number or none at all, any bytes as a body, batches (compressed or
not) of generated messages, arbitrary JSON documents.  After every case the servers must have
answered with a code RocketMQ knows, be alive, have logged no handler failure, and every
message acknowledged before the fuzzing must read back byte for byte, with nothing else in
its topic.  Hypothesis shrinks a failing case to a minimal request.
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain.codes import ResponseCode
from evq.domain.record import encode_batch
from evq.net.codes import RequestCode
from evq.net.headers.pull import FLAG_SUSPEND
from evq.net.protocol import MAX_FRAME, FrameDecoder, RemotingCommand
from evq.net.send_header import V2_NAMES
from evq.net.transport import RemotingClient, run
from tests.chaos.conftest import Report
from tests.net.test_broker_robustness import (
    BROKER_SHAPES,
    KEPT,
    NAMESRV_SHAPES,
    UNKNOWN_CODES,
    Sent,
    check_sent,
    handler_failures,
    read_kept,
    send,
)
from tests.processes import Running, port_of, running_evq
from tests.strategies import messages, topics

HOST = "127.0.0.1"
TIMEOUT = 10.0
STORED = 16
READER = "Reader"  # the group the read-back pulls with: no fuzzed request may name it
SHORT_CASES, LONG_CASES = 100, 2000  # per request code

any_text = st.text(max_size=300) | st.sampled_from(["", " ", "a" * 5000, "\x00", "\n"])
BOUNDARIES = (0, -1, 1, 1023, 1024, 1025, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63))
numbers = (st.integers(-40, 40) | st.sampled_from(BOUNDARIES)
           | st.integers(-(2**63), 2**63 - 1)).map(str)
names = (topics | any_text).filter(lambda n: n != KEPT and READER not in n)
property_strings = st.lists(st.tuples(any_text, any_text), max_size=4).map(
    lambda pairs: "".join(f"{k}\x01{v}\x02" for k, v in pairs))
"""Properties as they travel: name \x01 value \x02, names and values of any text (separators
and empty names included)."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=20)


def field(kind: str, offsets: tuple[int, ...]) -> st.SearchStrategy[str]:
    """A value for a field of ``kind`` (see ``BROKER_SHAPES``): mostly of its type, over
    its whole range, sometimes not of it at all."""
    typed: dict[str, st.SearchStrategy[str]] = {
        "t": names, "r": names | st.just(KEPT), "g": names, "s": any_text, "e": any_text,
        "p": property_strings,
        "i": numbers, "l": numbers, "b": st.sampled_from(["true", "false", "1", "0"]),
        # Java answers nothing to a state other than commit (8) or rollback (12).
        "k": st.sampled_from(["8", "12"]),
        "o": numbers | st.sampled_from(offsets).map(str) if offsets else numbers,
    }
    if kind == "k":
        return typed[kind]
    return st.one_of(typed[kind], typed[kind], typed[kind], any_text)  # 3 in 4 well-typed


@st.composite
def bodies(draw: st.DrawFn, kind: str) -> tuple[bytes, int]:
    """A body of ``kind`` and the sysFlag bits it needs (COMPRESSED for a deflated batch)."""
    if kind == "json":
        return json.dumps(draw(json_values)).encode(), 0
    if kind == "batch" and draw(st.booleans()):
        batch = encode_batch(draw(st.lists(messages(topic=names, ipv6=False), min_size=1,
                                           max_size=4)))
        if draw(st.booleans()):
            return zlib.compress(batch), sf.COMPRESSED
        return batch, 0
    return draw(st.binary(max_size=4096)), 0


@st.composite
def requests(draw: st.DrawFn, code: int, shapes: Mapping[int, tuple[dict[str, str], str]],
             offsets: tuple[int, ...]) -> RemotingCommand:
    """A request of ``code`` with drawn fields and body."""
    kinds, body_kind = shapes.get(code, ({}, "raw"))
    ext = {name: draw(field(spec[0], offsets)) for name, spec in kinds.items()
           if draw(st.integers(0, 9)) > 0}  # now and then a field is left out
    ext.update(draw(st.dictionaries(any_text, any_text, max_size=2)))  # and unknown ones come
    body, flags = draw(bodies(body_kind))
    if flags and ext.get("sysFlag", "").lstrip("-").isdigit():
        ext["sysFlag"] = str(int(ext["sysFlag"]) | flags)
    if code == RequestCode.PULL_MESSAGE and ext.get("sysFlag", "").lstrip("-").isdigit():
        ext["sysFlag"] = str(int(ext["sysFlag"]) & ~FLAG_SUSPEND)  # no 15 s parking here
    if code == RequestCode.SEND_MESSAGE_V2:
        ext = {short: ext[name] for short, name in V2_NAMES.items() if name in ext}
    version = draw(st.integers(-1, 500))
    return RemotingCommand(code=code, opaque=draw(st.integers(0, 2**31 - 1)), ext_fields=ext,
                           body=body, version=version)


TARGETS = ([(True, code) for code in [*BROKER_SHAPES, *UNKNOWN_CODES]]
           + [(False, code) for code in [*NAMESRV_SHAPES, *UNKNOWN_CODES]])


async def answer_of(port: int, cmd: RemotingCommand) -> RemotingCommand | None:
    """The answer to ``cmd``; None when the server closed the connection (a frame it could
    not take) without one."""
    reader, writer = await asyncio.open_connection(HOST, port)
    decoder = FrameDecoder(MAX_FRAME)
    try:
        writer.write(cmd.encode())
        while (answer := decoder.next_command()) is None:
            data = await asyncio.wait_for(reader.read(1 << 16), TIMEOUT)
            if not data:
                return None
            decoder.feed(data)
        return answer
    finally:
        writer.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path, list[Sent]]]:
    data = tmp_path_factory.mktemp("fuzzed")
    log = data / "stderr.log"
    with log.open("w") as stderr, running_evq(
            "--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
            "--data", str(data / "store"), servers=2, stderr=stderr) as evq:

        async def store() -> list[Sent]:
            rng = random.Random(7)
            async with RemotingClient(HOST, port_of(evq.addresses["broker"])) as client:
                return [await send(client, i, rng) for i in range(STORED)]

        yield evq, log, run(store())
        assert evq.stop() == 0


@pytest.mark.parametrize(("to_broker", "code"), TARGETS,
                         ids=[f"{'broker' if b else 'namesrv'}-{int(c)}" for b, c in TARGETS])
def test_fuzzed_requests_leave_acknowledged_data_intact(
        served: tuple[Running, Path, list[Sent]], long_run: bool, report: Report,
        to_broker: bool, code: int) -> None:
    evq, log, stored = served
    ports = {True: port_of(evq.addresses["broker"]), False: port_of(evq.addresses["namesrv"])}
    shapes = BROKER_SHAPES if to_broker else NAMESRV_SHAPES
    offsets = tuple(int(s.msg_id[16:], 16) for s in stored)
    tried: dict[str, int] = {"cases": 0, "closed": 0}

    async def check(cmd: RemotingCommand) -> None:
        answer = await answer_of(ports[to_broker], cmd)
        if answer is None:
            tried["closed"] += 1
        else:
            assert answer.is_response and answer.opaque == cmd.opaque
            assert answer.code in frozenset(ResponseCode), answer
        async with RemotingClient(HOST, ports[True]) as client:
            kept = await read_kept(client)
        assert len(kept) == len(stored), "something else got into the kept topic"
        for s in stored:
            check_sent(s, kept[(s.queue_id, s.queue_offset)])

    @settings(max_examples=LONG_CASES if long_run else SHORT_CASES, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests(code, shapes, offsets))
    def case(cmd: RemotingCommand) -> None:
        tried["cases"] += 1
        run(check(cmd))
        assert evq.alive()
        assert handler_failures(log) == []

    case()
    report(code=int(code), server="broker" if to_broker else "namesrv",
           fuzzed_requests=tried["cases"], closed_without_answer=tried["closed"])
