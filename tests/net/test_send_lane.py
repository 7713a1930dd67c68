"""The compiled send lane answers and stores exactly what the send processor does.

Two brokers on real sockets, one clock: one answers single sends through the lane (as
``evq serve`` does wherever the kernels are built), the other through the processor the lane
falls back on.  The same requests (sends the lane takes, and every kind it hands over) go to
both, and their answers and stored records must be the same, the brokers' own addresses
aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.backends.config import FlushMode
from evq.backends.registry import BACKENDS
from evq.client.producer import send_command
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.clock import ManualClock
from evq.domain.codes import ResponseCode
from evq.domain.ids import new_uniq_key
from evq.domain.log import GetStatus, PutStatus
from evq.domain.message import Message, Prop, host_bytes, new_message
from evq.domain.queues import MessageQueue
from evq.domain.record import decode, offset_msg_id
from evq.domain.sent import COMPILED_SENT
from evq.net.broker import BrokerServer
from evq.net.broker import send as send_processor
from evq.net.broker.names import names_checked
from evq.net.codes import RequestCode
from evq.net.headers.admin import CreateTopicRequest
from evq.net.protocol import ONEWAY_FLAG, FrameDecoder, RemotingCommand, SerializeType
from evq.net.send_header import COMPILED_PARSE
from evq.settings import build
from tests.net.harness import RawPeer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("evq.net.broker.send_lane") is None or COMPILED_PARSE is None
    or COMPILED_SENT is None,
    reason="the compiled kernels are not built here (or EVQ_PURE_PYTHON is set)")

TOPICS = ("lane", "%|lane_Other-9", "read-only", tp.RETRY_PREFIX + "g1", "never-made", "a" * 127,
          "bad topic")
MAX_BODY = 64 * 1024


@contextlib.asynccontextmanager
async def brokers(data: Path, clock: ManualClock, **values: object
                  ) -> AsyncIterator[tuple[BrokerServer, ...]]:
    """The lane's broker and the processor's, alike but for the V2 handler."""
    servers = []
    try:
        for name in ("lane", "reference"):
            server = BrokerServer(build({
                "listen_port": 0, "store_path_root_dir": str(data / name),
                "warm_segments": False, "commitlog_segment_size": 1 << 20,
                "max_message_size": MAX_BODY,
                # no offsets snapshot: written when a tick finds it due, which would put a
                # record between the same two sends on one broker and not the other
                "offset_snapshot_interval_ms": 10**12, **values}), clock=clock)
            await server.start()
            servers.append(server)
        lane, reference = servers
        assert lane.ctx is not None and reference.ctx is not None
        # The lane registered as the server registers it, kept here to read its counters.
        single = send_processor.handlers(lane.ctx)[RequestCode.SEND_MESSAGE_V2]
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            lane.server.dispatcher.register(code, names_checked(code, single))
        lane.lane = single  # type: ignore[attr-defined]
        general = send_processor.handlers(reference.ctx)[RequestCode.SEND_BATCH_MESSAGE]
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            reference.server.dispatcher.register(code, names_checked(code, general))
        for server in servers:
            core = server.ctx.core  # type: ignore[union-attr]
            for topic in TOPICS[:3]:
                perm = tp.PERM_READ if topic == "read-only" else tp.PERM_READ | tp.PERM_WRITE
                await asyncio.to_thread(core.create_topic, tp.TopicConfig(
                    topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=perm))
        yield lane, reference
    finally:
        for server in servers:
            await server.shutdown(grace=1.0)


def as_reference(frame: bytes, lane: BrokerServer, reference: BrokerServer) -> bytes:
    """The lane broker's answer as the reference broker would word it: its address, in a
    msgId (IPv4 then the port, in hex) or a remark (``('127.0.0.1', port)``), is the
    other's.  Ephemeral ports have five digits, so the frame's lengths stay true."""
    for spell in (lambda port: f"7F000001{port:08X}", lambda port: f"'127.0.0.1', {port})"):
        frame = frame.replace(spell(lane.server.port).encode(),
                              spell(reference.server.port).encode())
    return frame


async def ask(peer: RawPeer, cmd: RemotingCommand, opaque: int) -> bytes | None:
    """The answer frame's bytes (None for a oneway request: it gets none, checked by the
    next request's answer coming first)."""
    cmd.opaque = opaque
    await peer.send(cmd.encode())
    if cmd.flag & ONEWAY_FLAG:
        return None
    prefix = await peer.reader.readexactly(4)
    return prefix + await peer.reader.readexactly(struct.unpack(">i", prefix)[0])


def decoded(frame: bytes) -> RemotingCommand:
    decoder = FrameDecoder()
    decoder.feed(frame)
    cmd = decoder.next_command()
    assert cmd is not None
    return cmd


def request(rng: random.Random, clock: ManualClock) -> RemotingCommand:
    """A send of every kind the lane takes or hands over."""
    topic = rng.choice([*TOPICS, "lane", "lane", "lane", "lane"])  # half the lane's own
    kind = rng.random()
    properties = {Prop.UNIQ_KEY: new_uniq_key(clock.now_ms())}
    if rng.random() < 0.5:
        properties[Prop.KEYS] = rng.choice(["k1", "k1 k2", "ключ", "\u00e9\U0001f600"])
    if rng.random() < 0.5:
        properties[Prop.TAGS] = rng.choice(["a", "TagB", "||"])
    if rng.random() < 0.5:
        properties["custom"] = "".join(rng.choice("ab:=\u00ff ") for _ in range(rng.randrange(9)))
    if kind < 0.05:
        properties[Prop.DELAY] = "18"  # routed (the processor's path); due in 2 h, after the test
    if kind > 0.97:
        properties[Prop.WAIT] = "false"
    size = rng.choice([0, 1, 1024, 4096, MAX_BODY, MAX_BODY + 1])
    msg = attrs.evolve(new_message(topic, rng.randbytes(size)), properties=properties,
                       born_timestamp=clock.now_ms(), flag=rng.choice([0, 7]))
    if 0.05 <= kind < 0.08:
        msg.sysflag |= sf.TRANSACTION_PREPARED_TYPE
    queue_id = rng.choice([0, 1, 3, 4, -1]) if kind < 0.95 else 9
    batch = 0.80 <= kind < 0.83
    cmd = send_command(rng.choice(["P", "P-2"]), MessageQueue(topic, "b", queue_id),
                       [msg, msg] if batch else [msg], batch=batch)
    if 0.83 <= kind < 0.95:
        cmd.code = RequestCode.SEND_MESSAGE  # the long names, as the stock C++ client sends
        cmd.ext_fields = {send_processor.send_header.V2_NAMES[k]: v
                          for k, v in cmd.ext_fields.items()}
    if rng.random() < 0.03 and queue_id >= 0:  # (a random queue is drawn before the answer)
        cmd.flag |= ONEWAY_FLAG
    if rng.random() < 0.03:
        cmd.ext_fields["g"] = "+" + cmd.ext_fields.get("g", "0")  # the reference parser's
    # Both serializations a client may send (evq's producer sends ROCKETMQ, the stock clients
    # JSON): each answered in its own.
    cmd.serialize_type = rng.choice([SerializeType.JSON, SerializeType.ROCKETMQ])
    return cmd


CONFIGS: dict[str, dict[str, object]] = {
    **{backend: {"backend": backend} for backend in BACKENDS},
    "mmap-transient-pool": {"backend": "mmap", "transient_store_pool_enable": True},
    "mmap-sync-flush": {"backend": "mmap", "flush": FlushMode.SYNC_FLUSH},
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
async def test_lane_answers_and_stores_as_the_processor(tmp_path: Path, config: str) -> None:
    """On every backend (the mmap store sums up its appends itself, the others answer a
    result a record), with the transient store pool, and under SYNC_FLUSH (all the
    processor's)."""
    clock = ManualClock(1_700_000_000_000)
    rng = random.Random(18)
    async with brokers(tmp_path, clock, **CONFIGS[config]) as (lane, reference), \
            RawPeer.connect(lane.server) as lane_peer, \
            RawPeer.connect(reference.server) as reference_peer:
        codes: dict[int, int] = {}
        kinds: dict[SerializeType, int] = {}
        for i in range(600):
            cmd = request(rng, clock)
            opaque = rng.choice([i + 1, 2**31 - 1, -(2**31), 0])
            # A send that leaves the queue to the broker gets a random one: the same on both.
            random.seed(i)
            got = await ask(lane_peer, cmd, opaque)
            random.seed(i)
            want = await ask(reference_peer, cmd, opaque)
            if got is not None:
                assert as_reference(got, lane, reference) == want, (i, got, want)
                answer = decoded(got)
                codes[answer.code] = codes.get(answer.code, 0) + 1
                assert answer.serialize_type == cmd.serialize_type
                if answer.code == ResponseCode.SUCCESS:
                    kinds[answer.serialize_type] = kinds.get(answer.serialize_type, 0) + 1
            if rng.random() < 0.2:
                clock.advance(rng.randrange(1, 2000) / 1000)
        # Both ways were taken, and every outcome the sequence meant to reach was reached.
        # (A backend whose append answers a result a record has its sends answered by the
        # processor's code after the lane's append.)
        assert lane.lane.handed_over > 100  # type: ignore[attr-defined]
        lane_answers = config in ("mmap", "mmap-transient-pool")
        assert (lane.lane.taken > 100) is lane_answers  # type: ignore[attr-defined]
        assert kinds.keys() == set(SerializeType), kinds
        # The runtime info reports the lane's counters, as `evq admin brokerStatus` shows them.
        info = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
        table = json.loads(decoded(await ask(lane_peer, info, 7) or b"").body)["table"]
        assert table["evqSendLaneTaken"] == str(lane.lane.taken)  # type: ignore[attr-defined]
        assert table["evqSendLaneHandedOver"] == str(
            lane.lane.handed_over)  # type: ignore[attr-defined]
        assert {ResponseCode.SUCCESS, ResponseCode.NO_PERMISSION, ResponseCode.MESSAGE_ILLEGAL,
                ResponseCode.SYSTEM_ERROR} <= codes.keys(), codes
        queues = [(t, q) for t in lane.ctx.core.topics() for q in range(8)]  # type: ignore[union-attr]
        # A transient pool's records are read once its commit service has written them.
        deadline = asyncio.get_running_loop().time() + 10
        while asyncio.get_running_loop().time() < deadline and any(
                stored(lane, *q) != stored(reference, *q) for q in queues):
            await asyncio.sleep(0.05)
        for topic, queue_id in queues:
            assert stored(lane, topic, queue_id) == stored(reference, topic, queue_id), (
                topic, queue_id)
        assert lane.ctx.stats.messages_put == reference.ctx.stats.messages_put  # type: ignore[union-attr]
        assert lane.ctx.stats.bytes_put == reference.ctx.stats.bytes_put  # type: ignore[union-attr]
        assert lane.ctx.stats.puts_refused == reference.ctx.stats.puts_refused  # type: ignore[union-attr]


def stored(server: BrokerServer, topic: str, queue_id: int) -> list[Message]:
    """A queue's records as messages, the broker's own addresses left out."""
    log = server.ctx.core.log  # type: ignore[union-attr]
    got = log.read(topic, queue_id, 0, max_count=10_000, max_bytes=1 << 30)
    if got.status is not GetStatus.FOUND:
        return []
    return [attrs.evolve(decode(r), store_host=("", 0), born_host=("", 0))
            for r in got.records]


async def test_lane_follows_topic_changes(tmp_path: Path) -> None:
    """A topic the lane has taken sends for, made read-only, then deleted: each send is
    answered as the processor answers it then."""
    clock = ManualClock(1_700_000_000_000)
    async with brokers(tmp_path, clock, auto_create_topic_enable=False) as (lane, reference), \
            RawPeer.connect(lane.server) as lane_peer, \
            RawPeer.connect(reference.server) as reference_peer:

        async def both(cmd: RemotingCommand, opaque: int) -> int:
            got = await ask(lane_peer, cmd, opaque)
            want = await ask(reference_peer, cmd, opaque)
            assert got is not None and want is not None
            assert as_reference(got, lane, reference) == want
            return decoded(got).code

        def send() -> RemotingCommand:
            msg = new_message("lane", b"x")
            msg.born_timestamp = clock.now_ms()
            msg.properties[Prop.UNIQ_KEY] = new_uniq_key(msg.born_timestamp)
            return send_command("P", MessageQueue("lane", "b", 2), [msg], batch=False)

        async def admin(cmd: RemotingCommand, peer: RawPeer) -> None:
            cmd.opaque = 99
            await peer.send(cmd.encode())
            answer = await peer.receive()
            assert answer is not None and answer.code == ResponseCode.SUCCESS, answer

        assert await both(send(), 1) == ResponseCode.SUCCESS
        for peer in (lane_peer, reference_peer):
            await admin(RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_TOPIC,
                                        ext_fields=CreateTopicRequest.write(
                                            topic="lane", read_queue_nums=4,
                                            write_queue_nums=4, perm=tp.PERM_READ)), peer)
        assert await both(send(), 2) == ResponseCode.NO_PERMISSION
        for peer in (lane_peer, reference_peer):
            await admin(RemotingCommand(code=RequestCode.DELETE_TOPIC_IN_BROKER,
                                        ext_fields={"topic": "lane"}), peer)
        assert await both(send(), 3) == ResponseCode.TOPIC_NOT_EXIST


@given(host=st.tuples(st.ip_addresses(), st.integers(0, 65535)),
       physical_offset=st.integers(0, 2**63 - 1), queue_id=st.integers(0, 2**31 - 1),
       queue_offset=st.integers(0, 2**63 - 1), opaque=st.integers(-(2**31), 2**31 - 1),
       kind=st.sampled_from(SerializeType))
def test_lane_answer_frame_is_the_processors(host: tuple[object, int], physical_offset: int,
                                             queue_id: int, queue_offset: int, opaque: int,
                                             kind: SerializeType) -> None:
    """Spliced into the template, any values give the frame the processor's encoder writes,
    its msgId made as RocketMQ's offsetMsgId (IPv4 and IPv6 store hosts alike), in either
    serialization."""
    from evq.net.broker.send_lane import answer_frame, binary_answer_frame

    raw = host_bytes((str(host[0]), host[1]))
    cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=opaque, serialize_type=kind)
    want = send_processor.stored_response(cmd, send_processor.Stored(
        PutStatus.PUT_OK, queue_id, queue_offset, 0, offset_msg_id(raw, physical_offset), 1, 0,
        False)).encode()
    if kind is SerializeType.JSON:
        got = answer_frame(send_processor.answer_template(), raw, physical_offset, queue_id,
                           queue_offset, opaque)
    else:
        got = binary_answer_frame(send_processor.binary_answer_template(), raw,
                                  physical_offset, queue_id, queue_offset, opaque)
    assert got == want


async def test_the_lane_answers_single_sends_where_it_is_built(tmp_path: Path) -> None:
    """Every broker built with the kernels takes single sends through the lane (both codes);
    batches keep the processor."""
    from evq.net.broker.send_lane import SendLane

    clock = ManualClock(1_700_000_000_000)
    async with brokers(tmp_path, clock) as (lane, _):
        got = send_processor.handlers(lane.ctx)  # type: ignore[arg-type]
        assert isinstance(got[RequestCode.SEND_MESSAGE_V2], SendLane)
        assert isinstance(got[RequestCode.SEND_MESSAGE], SendLane)
        assert not isinstance(got[RequestCode.SEND_BATCH_MESSAGE], SendLane)


async def test_the_lane_remembers_only_topics_it_takes(tmp_path: Path) -> None:
    """A client's topic names, unknown, illegal or 400 KiB long (near the 512 KiB a request's
    header may hold), are answered as the processor answers them and never kept: the lane
    remembers the topics it takes, which the broker holds, and nothing a client can grow."""
    clock = ManualClock(1_700_000_000_000)
    async with brokers(tmp_path, clock, auto_create_topic_enable=False) as (lane, reference), \
            RawPeer.connect(lane.server) as lane_peer, \
            RawPeer.connect(reference.server) as reference_peer:
        # (The lane's own two topics last again: a retry topic among TOPICS creates one, and
        # the lane forgets what it knew whenever the metadata changes.)
        names = [*TOPICS, *(f"unknown-{i}" for i in range(300)), "x" * (400 * 1024), *TOPICS[:2]]
        for i, topic in enumerate(names):
            msg = new_message("lane", b"body")
            msg.topic, msg.born_timestamp = topic, clock.now_ms()
            msg.properties[Prop.UNIQ_KEY] = new_uniq_key(msg.born_timestamp)
            cmd = send_command("P", MessageQueue(topic, "b", 1), [msg], batch=False)
            got = await ask(lane_peer, cmd, i + 1)
            want = await ask(reference_peer, cmd, i + 1)
            assert got is not None and as_reference(got, lane, reference) == want, topic[:40]
        assert lane.lane.taken == 4  # type: ignore[attr-defined]  # "lane", "%|lane_...", twice
        assert lane.lane.cached_topics == 2  # type: ignore[attr-defined]
