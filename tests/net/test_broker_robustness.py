"""``evq serve`` (a broker and a name server in one process) under hostile traffic.

Known messages are stored first through well-formed sends.  Then many connections send broken
frames (random, truncated, corrupted, oversize) and well-framed requests with hostile headers
and bodies for every request code, while a well-behaved client keeps sending and pulling.
Afterwards the process is still alive, every hostile request was answered or its connection
closed, and every stored message reads back exactly as it was stored.  The servers run in a
child process because only a separate process shows that nothing brought it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import resource
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.codes import ResponseCode
from evq.domain.message import Message, Prop, encode_properties, new_message
from evq.domain.record import encode_batch, iter_records
from evq.net.codes import RequestCode
from evq.net.headers.pull import FLAG_SUBSCRIPTION, FLAG_SUSPEND
from evq.net.protocol import MAX_FRAME, FrameDecoder, RemotingCommand
from evq.net.send_header import V2_NAMES
from evq.net.transport import RemotingClient, run
from tests.net.harness import (
    HOST,
    TIMEOUT,
    broker,
    eventually,
    fuzz_payload,
    handler_tasks,
    hostile_peer,
)
from tests.processes import Running, port_of, running_evq
from tests.strategies import INT32_MAX, INT32_MIN, INT64_MAX, remoting_commands

KEPT = "Kept"  # the topic whose messages must survive; no hostile request names it to write
QUEUES = 4
CLUSTER = "DefaultCluster"  # the broker stamps its cluster into every stored message
STORED = 240
FUZZ_FRAMES = 1200
HOSTILE_REQUESTS = 3000
REQUESTS_PER_CONNECTION = 12
CONCURRENT_PEERS = 40
CONNECTIONS = 1000
HANDLER_FAILED = "request handler failed"  # the dispatcher's log line for an unexpected error
KNOWN_CODES = frozenset(ResponseCode)

# --- hostile values -------------------------------------------------------------------------

UNKNOWN_TOPICS = ("NoSuchTopic", "%RETRY%NoSuchGroup", "", "   ", "bad topic!", "x" * 300,
                  "主题", "TBW102|x")
READ_TOPICS = (*UNKNOWN_TOPICS, KEPT)  # for codes that only read: the kept topic is fair game
GROUPS = ("NoSuchGroup", "", "g" * 300, "%DLQ%NoSuchGroup", "组", "CID_ONSAPI_OWNER")
STRINGS = ("", "x", "\x00", "a" * 5000, "{}", "null", "||", "\x01\x02")
INTS = ("0", "-1", "1", "16", "1024", "1025", str(INT32_MAX), str(INT32_MIN), "+7", "-0")
LONGS = (*INTS, str(INT64_MAX), str(-INT64_MAX - 1), "-100", str(INT32_MAX + 1))
BOOLS = ("true", "false", "1", "0", "TRUE")
NOT_NUMBERS = ("abc", "", "1.5", "0x10", "1e3", str(INT64_MAX + 1), "9" * 400, "١٢", " 1", "+")
NOT_BOOLS = ("yes", "", "2", "maybe", "真")
EXPRESSIONS = ("*", "a || b", "((", "a ||", "", "||||", "x" * 3000)
PROPERTIES = (
    "", "\x01\x02", "a\x01", "KEYS\x01" + "k" * 40_000 + "\x02", "DELAY\x01999\x02",
    "DELAY\x01-5\x02", "DELAY\x01x\x02", "TRAN_MSG\x01true\x02", "UNIQ_KEY\x01\x02",
    encode_properties({Prop.TAGS: "t", Prop.KEYS: "k1 k2", "user": "值"}),
)
JSON_BODIES = (
    b"", b"{not json", b"[]", b"null", b"5", b'"x"', b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
    b'{"consumerDataSet": 5}', b'{"consumerDataSet": [5]}', b'{"consumerDataSet": [{}]}',
    b'{"consumerDataSet": [{"groupName": "NoSuchGroup", "subscriptionDataSet": [{}]}]}',
    b'{"consumerDataSet": [{"groupName": "G", "subscriptionDataSet": 7}]}',
    b'{"consumerDataSet": [{"groupName": "G", "consumeType": [], "messageModel": "x"}]}',
    b'{"producerDataSet": [{"groupName": null}], "clientID": []}',
    b'{"producerDataSet": 3}',
    b'{"mqSet": 5}', b'{"mqSet": [{}]}', b'{"mqSet": [7]}',
    b'{"mqSet": [{"topic": "T", "brokerName": "b", "queueId": "x"}]}',
    b'{"mqSet": [{"topic": "T", "brokerName": "b", "queueId": 1e400}], "clientId": null}',
    b'{"groupName": 5}', b'{"groupName": "G", "retryQueueNums": -1}',
    b'{"groupName": "G", "retryMaxTimes": "many"}', b'{"groupName": "' + b"g" * 300 + b'"}',
    b'{"topicConfigSerializeWrapper": 5}', b'{"filterServerList": {}}',
)

# Each code's header fields as the handler reads them: kind, and "!" when required.  Kinds:
# t topic written to, r topic only read, g group, s string, e subscription expression,
# p properties, i int, l long, o physical offset, b bool, k END_TRANSACTION's commit/rollback.
# Bodies: raw bytes, a batch, or JSON.
SEND = {"producerGroup": "g", "topic": "t!", "defaultTopic": "t", "defaultTopicQueueNums": "i",
        "queueId": "i!", "sysFlag": "i!", "bornTimestamp": "l!", "flag": "i",
        "properties": "p", "reconsumeTimes": "i", "maxReconsumeTimes": "i", "batch": "b"}
QUEUE = {"topic": "r!", "queueId": "i!"}
GROUP_QUEUE = {"consumerGroup": "g!", **QUEUE}
BROKER_SHAPES: dict[int, tuple[dict[str, str], str]] = {
    RequestCode.SEND_MESSAGE: (SEND, "raw"),
    RequestCode.SEND_MESSAGE_V2: (SEND, "raw"),
    RequestCode.SEND_BATCH_MESSAGE: (SEND, "batch"),
    RequestCode.PULL_MESSAGE: ({**GROUP_QUEUE, "queueOffset": "l!", "sysFlag": "i",
                                "maxMsgNums": "i", "commitOffset": "l", "subscription": "e",
                                "expressionType": "s", "subVersion": "l",
                                "suspendTimeoutMillis": "l"}, "raw"),
    RequestCode.QUERY_MESSAGE: ({"topic": "r!", "key": "s!", "maxNum": "i",
                                 "beginTimestamp": "l", "endTimestamp": "l",
                                 "_UNIQUE_KEY_QUERY": "b"}, "raw"),
    RequestCode.QUERY_CONSUMER_OFFSET: (GROUP_QUEUE, "raw"),
    RequestCode.UPDATE_CONSUMER_OFFSET: ({**GROUP_QUEUE, "commitOffset": "l!"}, "raw"),
    RequestCode.UPDATE_AND_CREATE_TOPIC: ({"topic": "t!", "readQueueNums": "i",
                                           "writeQueueNums": "i", "perm": "i", "order": "b",
                                           "topicSysFlag": "i", "topicFilterType": "s"}, "raw"),
    RequestCode.GET_ALL_TOPIC_CONFIG: ({}, "raw"),
    RequestCode.GET_BROKER_RUNTIME_INFO: ({}, "raw"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: ({**QUEUE, "timestamp": "l!"}, "raw"),
    RequestCode.GET_MAX_OFFSET: (QUEUE, "raw"),
    RequestCode.GET_MIN_OFFSET: (QUEUE, "raw"),
    RequestCode.GET_EARLIEST_MSG_STORETIME: (QUEUE, "raw"),
    RequestCode.VIEW_MESSAGE_BY_ID: ({"offset": "o!"}, "raw"),
    RequestCode.HEART_BEAT: ({}, "json"),
    RequestCode.UNREGISTER_CLIENT: ({"consumerGroup": "g", "producerGroup": "g",
                                     "clientID": "s"}, "raw"),
    RequestCode.CONSUMER_SEND_MSG_BACK: ({"group": "g!", "offset": "o!", "delayLevel": "i",
                                          "maxReconsumeTimes": "i"}, "raw"),
    RequestCode.END_TRANSACTION: ({"producerGroup": "g!", "tranStateTableOffset": "l!",
                                   "commitLogOffset": "o!", "commitOrRollback": "k!"}, "raw"),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ({"consumerGroup": "g!"}, "raw"),
    RequestCode.LOCK_BATCH_MQ: ({}, "json"),
    RequestCode.UNLOCK_BATCH_MQ: ({}, "json"),
    RequestCode.GET_ALL_CONSUMER_OFFSET: ({}, "raw"),
    RequestCode.GET_ALL_DELAY_OFFSET: ({}, "raw"),
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: ({}, "json"),
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: ({}, "raw"),
    RequestCode.GET_TOPIC_STATS_INFO: ({"topic": "r!"}, "raw"),
    RequestCode.GET_CONSUMER_CONNECTION_LIST: ({"consumerGroup": "g!"}, "raw"),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: ({"groupName": "g!"}, "raw"),
    RequestCode.GET_CONSUME_STATS: ({"consumerGroup": "g!", "topic": "r"}, "raw"),
    RequestCode.DELETE_TOPIC_IN_BROKER: ({"topic": "t!"}, "raw"),
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: ({"topic": "r!", "group": "g!",
                                                 "timestamp": "l!", "isForce": "b"}, "raw"),
}
BROKER_ADDRESS = {"brokerName": "g!", "brokerAddr": "s!", "clusterName": "g!",
                  "brokerId": "l!"}
NAMESRV_SHAPES: dict[int, tuple[dict[str, str], str]] = {
    RequestCode.PUT_KV_CONFIG: ({"namespace": "s!", "key": "s!", "value": "s!"}, "raw"),
    RequestCode.GET_KV_CONFIG: ({"namespace": "s!", "key": "s!"}, "raw"),
    RequestCode.DELETE_KV_CONFIG: ({"namespace": "s!", "key": "s!"}, "raw"),
    RequestCode.REGISTER_BROKER: ({**BROKER_ADDRESS, "haServerAddr": "s", "compressed": "b",
                                   "bodyCrc32": "i"}, "json"),
    RequestCode.UNREGISTER_BROKER: (BROKER_ADDRESS, "raw"),
    RequestCode.GET_ROUTEINFO_BY_TOPIC: ({"topic": "t!"}, "raw"),
    RequestCode.GET_BROKER_CLUSTER_INFO: ({}, "raw"),
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: ({}, "raw"),
    RequestCode.DELETE_TOPIC_IN_NAMESRV: ({"topic": "t!", "clusterName": "g"}, "raw"),
    RequestCode.GET_KVLIST_BY_NAMESPACE: ({"namespace": "s!"}, "raw"),
    RequestCode.GET_TOPICS_BY_CLUSTER: ({"cluster": "g!"}, "raw"),
}
UNKNOWN_CODES = (-1, 0, 9999, 32767, RequestCode.CHECK_TRANSACTION_STATE)


@attrs.frozen
class Hostile:
    """One hostile request and whether the header alone dooms it (missing or unparsable)."""

    request: RemotingCommand
    must_fail: bool


def _value(rng: random.Random, kind: str, offsets: tuple[int, ...]) -> tuple[str, bool]:
    """A value of ``kind``: usually well-typed but hostile, sometimes unparsable (True)."""
    numeric = kind in "ilok"
    if numeric and rng.random() < 0.15:
        return rng.choice(NOT_NUMBERS), True
    if kind == "b" and rng.random() < 0.15:
        return rng.choice(NOT_BOOLS), True
    pools: Mapping[str, tuple[str, ...]] = {
        "t": UNKNOWN_TOPICS, "r": READ_TOPICS, "g": GROUPS, "s": STRINGS, "e": EXPRESSIONS,
        "p": PROPERTIES, "i": INTS, "l": LONGS, "b": BOOLS,
        # Java answers nothing to a state other than commit (8) or rollback (12): left out.
        "k": ("8", "12"),
        "o": (*LONGS, *(str(o + d) for o in offsets for d in (0, 1, 7))),
    }
    return rng.choice(pools[kind]), False


def _body(rng: random.Random, kind: str) -> bytes:
    if kind == "json":
        return rng.choice(JSON_BODIES)
    if kind == "batch":
        good = encode_batch([new_message("T", b"x" * rng.randint(0, 300)) for _ in range(3)])
        return rng.choice([
            rng.randbytes(rng.randint(0, 200)), good[: rng.randint(0, len(good) - 1)],
            b"\x7f\xff\xff\xff" + good, b"\x00\x00\x00\x00" * 3, good,
        ])
    if rng.random() < 0.01:
        return bytes(1 << 20)
    return rng.choice([b"", rng.randbytes(rng.randint(1, 3000))])


def hostile_request(rng: random.Random, shapes: Mapping[int, tuple[dict[str, str], str]],
                    opaque: int, offsets: tuple[int, ...]) -> Hostile:
    """A well-framed request for one of ``shapes``' codes with hostile fields and body."""
    code = rng.choice([*shapes, *UNKNOWN_CODES])
    fields, body_kind = shapes.get(code, ({}, "raw"))
    ext: dict[str, str] = {}
    must_fail = False
    for name, spec in fields.items():
        kind, required = spec[0], spec.endswith("!")
        if rng.random() < 0.1:
            must_fail |= required
            continue
        ext[name], bad = _value(rng, kind, offsets)
        must_fail |= bad
    if code == RequestCode.PULL_MESSAGE:
        flags = ext.get("sysFlag", "")
        if flags.lstrip("+-").isdigit():  # a parked pull is tested elsewhere, not here
            ext["sysFlag"] = str(int(flags) & ~FLAG_SUSPEND)
    if code == RequestCode.SEND_MESSAGE_V2:
        ext = {short: ext[name] for short, name in V2_NAMES.items() if name in ext}
    request = RemotingCommand(code=code, opaque=opaque, ext_fields=ext,
                              body=_body(rng, body_kind),
                              version=rng.choice([0, 63, 121, 407, -1, 32767]))
    return Hostile(request, must_fail and code in shapes)


# --- talking to the servers -----------------------------------------------------------------


async def ask_all(port: int, requests: list[Hostile]) -> None:
    """Send every request on one connection and check each one's answer as it comes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    pending = {h.request.opaque: h for h in requests}
    decoder = FrameDecoder(MAX_FRAME)
    try:
        writer.write(b"".join(h.request.encode() for h in requests))
        while pending:
            data = await asyncio.wait_for(reader.read(1 << 16), TIMEOUT)
            assert data, f"closed with {len(pending)} well-framed requests unanswered"
            decoder.feed(data)
            while (answer := decoder.next_command()) is not None:
                asked = pending.pop(answer.opaque)
                assert answer.is_response
                assert answer.code in KNOWN_CODES
                if asked.must_fail:
                    assert answer.code != ResponseCode.SUCCESS, (asked.request, answer)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def fuzz(port: int, payload: bytes) -> None:
    for answer in await hostile_peer(port, payload):
        assert answer.is_response and answer.code in KNOWN_CODES


def handler_failures(log: Path) -> list[dict[str, object]]:
    """Requests a handler failed with an exception of its own rather than refused with a
    BrokerError: each is bad input that got a vague SYSTEM_ERROR and a traceback in the log."""
    return [json.loads(line) for line in log.read_text().splitlines() if HANDLER_FAILED in line]


def send_fields(queue_id: int, props: Mapping[str, str]) -> dict[str, object]:
    return {"producerGroup": "PG", "topic": KEPT, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": QUEUES, "queueId": queue_id, "sysFlag": 0,
            "bornTimestamp": 1_700_000_000_000, "flag": 0,
            "properties": encode_properties(props), "reconsumeTimes": 0}


@attrs.frozen
class Sent:
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    properties: dict[str, str]


async def call(client: RemotingClient, code: int, fields: Mapping[str, object],
               body: bytes = b"") -> RemotingCommand:
    answer = await client.invoke(RemotingCommand.request(code, fields, body), TIMEOUT)
    assert answer.code == ResponseCode.SUCCESS, (code, answer.code, answer.remark)
    return answer


async def send(client: RemotingClient, i: int, rng: random.Random) -> Sent:
    props = {Prop.KEYS: f"key-{i}", Prop.TAGS: f"tag{i % 3}", Prop.UNIQ_KEY: f"U{i:08d}",
             "user": "ü" * (i % 5)}
    body = rng.randbytes(rng.choice([0, 1, 100, 3000]))
    queue_id = i % QUEUES
    r = await call(client, RequestCode.SEND_MESSAGE, send_fields(queue_id, props), body)
    return Sent(queue_id, int(r.ext_fields["queueOffset"]), r.ext_fields["msgId"], body, props)


async def pull(client: RemotingClient, queue_id: int, offset: int, count: int = 32
               ) -> tuple[list[Message], int]:
    r = await call(client, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "Reader", "topic": KEPT, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": count, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
        "subVersion": 0})
    return list(iter_records(r.body)), int(r.ext_fields["maxOffset"])


async def read_queue(client: RemotingClient, queue_id: int) -> list[Message]:
    messages, high = await pull(client, queue_id, 0)
    while len(messages) < high:
        more, high = await pull(client, queue_id, len(messages))
        messages += more
    return messages


async def read_kept(client: RemotingClient) -> dict[tuple[int, int], Message]:
    queues = await asyncio.gather(*(read_queue(client, q) for q in range(QUEUES)))
    return {(m.queue_id, m.queue_offset): m for q in queues for m in q}


def check_sent(sent: Sent, stored: Message) -> None:
    assert stored.body == sent.body
    assert stored.properties == {**sent.properties, Prop.CLUSTER: CLUSTER}
    assert (stored.queue_id, stored.queue_offset) == (sent.queue_id, sent.queue_offset)
    assert stored.commit_log_offset == int(sent.msg_id[16:], 16)


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    data = tmp_path_factory.mktemp("served")
    log = data / "stderr.log"
    with log.open("w") as stderr, running_evq(
            "--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
            "--data", str(data / "store"), servers=2, stderr=stderr) as evq:
        yield evq, log
        assert evq.stop() == 0


def test_hostile_traffic_neither_stops_the_servers_nor_touches_stored_messages(
        served: tuple[Running, Path]) -> None:
    evq, log = served
    broker, namesrv = port_of(evq.addresses["broker"]), port_of(evq.addresses["namesrv"])
    rng = random.Random(5)

    async def scenario() -> None:
        async with RemotingClient(HOST, broker) as client, \
                RemotingClient(HOST, namesrv) as names:
            stored = [await send(client, i, rng) for i in range(STORED)]
            stored.append(await send_batch(client))
            before = await read_kept(client)
            for s in stored:
                check_sent(s, before[(s.queue_id, s.queue_offset)])
            offsets = tuple(m.commit_log_offset for m in before.values())

            stop = asyncio.Event()
            acked: list[Sent] = []

            async def behave() -> None:
                for i in itertools.count(STORED + 1):
                    if stop.is_set():
                        return
                    s = await send(client, i, rng)
                    acked.append(s)
                    (m,), _ = await pull(client, s.queue_id, s.queue_offset, 1)
                    check_sent(s, m)
                    route = await call(names, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                       {"topic": KEPT})
                    assert evq.addresses["broker"].encode() in route.body

            well_behaved = asyncio.create_task(behave())
            await hostile_phase(broker, namesrv, rng, offsets)
            stop.set()
            await asyncio.wait_for(well_behaved, TIMEOUT)
            assert evq.alive()
            assert len(acked) >= 10  # served throughout, not only before and after

            after = await read_kept(client)
            for key, message in before.items():
                assert after[key] == message
            for s in acked:
                check_sent(s, after[(s.queue_id, s.queue_offset)])
            assert len(after) == len(before) + len(acked)  # nothing else got into the topic

    run(asyncio.wait_for(scenario(), 120))
    assert evq.alive()
    assert handler_failures(log) == []


async def send_batch(client: RemotingClient) -> Sent:
    """A batch of one: the batch path stores it like a single send."""
    message = new_message(KEPT, "批".encode() * 50, keys="batch-key", tags="b",
                          properties={Prop.UNIQ_KEY: "UBATCH"})
    r = await call(client, RequestCode.SEND_BATCH_MESSAGE,
                   {**send_fields(0, {}), "batch": "true"}, encode_batch([message]))
    return Sent(0, int(r.ext_fields["queueOffset"]), r.ext_fields["msgId"], message.body,
                message.properties)


async def hostile_phase(broker: int, namesrv: int, rng: random.Random,
                        offsets: tuple[int, ...]) -> None:
    """Broken frames and hostile requests from many connections, a few dozen at a time."""
    opaques = itertools.count(1)
    jobs = [fuzz(port, fuzz_payload(rng, MAX_FRAME))
            for port in rng.choices([broker, namesrv], weights=[3, 1], k=FUZZ_FRAMES)]
    for _ in range(HOSTILE_REQUESTS // REQUESTS_PER_CONNECTION):
        port, shapes = rng.choice([(broker, BROKER_SHAPES), (broker, BROKER_SHAPES),
                                   (namesrv, NAMESRV_SHAPES)])
        jobs.append(ask_all(port, [hostile_request(rng, shapes, next(opaques), offsets)
                                   for _ in range(REQUESTS_PER_CONNECTION)]))
    rng.shuffle(jobs)
    for start in range(0, len(jobs), CONCURRENT_PEERS):
        await asyncio.gather(*jobs[start:start + CONCURRENT_PEERS])


ANY_CODE = st.sampled_from([*BROKER_SHAPES, *NAMESRV_SHAPES, *UNKNOWN_CODES])


@given(cmd=remoting_commands(), code=ANY_CODE, to_broker=st.booleans())
def test_any_request_with_random_fields_gets_an_answer(
        served: tuple[Running, Path], cmd: RemotingCommand, code: int, to_broker: bool) -> None:
    evq, log = served
    cmd.code, cmd.flag = code, 0  # a request that wants its answer
    port = port_of(evq.addresses["broker" if to_broker else "namesrv"])
    with socket.create_connection((HOST, port), TIMEOUT) as sock:
        sock.sendall(cmd.encode())
        decoder = FrameDecoder(MAX_FRAME)
        while (answer := decoder.next_command()) is None:
            data = sock.recv(1 << 16)
            assert data, "closed without an answer"
            decoder.feed(data)
    assert answer.is_response and answer.opaque == cmd.opaque
    assert answer.code in KNOWN_CODES
    assert evq.alive()
    assert handler_failures(log) == []


PARKED_PULL = {"consumerGroup": "G", "topic": KEPT, "queueId": 0, "queueOffset": 1,
               "maxMsgNums": 32, "sysFlag": FLAG_SUSPEND | FLAG_SUBSCRIPTION,
               "suspendTimeoutMillis": 20_000, "subscription": "*", "subVersion": 0}
"""A pull past the end of a queue holding one message: it parks until a second comes."""


def _allow_open_files(needed: int) -> None:
    """Both ends of every connection live in this process: lift the soft fd limit toward
    the hard one when the default (often 1024) is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (
            needed if hard == resource.RLIM_INFINITY else min(needed, hard), hard))


async def test_a_thousand_connections_and_peers_vanishing_mid_frame_and_mid_long_poll(
        tmp_path: Path) -> None:
    _allow_open_files(2 * CONNECTIONS + 256)
    async with broker(tmp_path) as b, RemotingClient(HOST, b.server.port) as client:
        assert b.ctx is not None
        holds = b.ctx.holds
        await call(client, RequestCode.SEND_MESSAGE, send_fields(0, {}), b"first")
        peers = await asyncio.gather(
            *(asyncio.open_connection(HOST, b.server.port) for _ in range(CONNECTIONS)))

        async def ask(i: int) -> RemotingCommand:
            reader, writer = peers[i]
            writer.write(RemotingCommand(code=RequestCode.GET_MAX_OFFSET, opaque=i,
                                         ext_fields={"topic": KEPT, "queueId": 0}).encode())
            decoder = FrameDecoder()
            while (answer := decoder.next_command()) is None:
                decoder.feed(await asyncio.wait_for(reader.read(4096), TIMEOUT))
            return answer

        try:
            answers = await asyncio.gather(*(ask(i) for i in range(CONNECTIONS)))
            assert [(a.opaque, a.ext_fields["offset"]) for a in answers] == [
                (i, "1") for i in range(CONNECTIONS)]
            assert len(b.server.connections) == CONNECTIONS + 1  # and the client's

            # A third park a long poll past the end of the queue, a third stop mid-frame;
            # then both kinds vanish.
            polling, cut = range(0, CONNECTIONS, 3), range(1, CONNECTIONS, 3)
            for i in polling:
                peers[i][1].write(RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=i,
                                                  ext_fields=PARKED_PULL).encode())
            for i in cut:
                frame = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=i,
                                        ext_fields=send_fields(0, {}), body=bytes(500)).encode()
                peers[i][1].write(frame[: len(frame) // 2])
            await eventually(lambda: holds.parked == len(polling))
            assert len(handler_tasks()) == len(polling)
            for i in (*polling, *cut):
                peers[i][1].transport.abort()
            remaining = CONNECTIONS - len(polling) - len(cut) + 1
            await eventually(lambda: len(b.server.connections) == remaining)
            await eventually(lambda: not handler_tasks())  # cancelled, not left parked
            assert holds.parked == 0

            survivor = next(i for i in range(CONNECTIONS) if i % 3 == 2)
            assert (await ask(survivor)).ext_fields["offset"] == "1"
            woken = asyncio.ensure_future(call(client, RequestCode.PULL_MESSAGE, PARKED_PULL))
            await eventually(lambda: holds.parked == 1)
            await send(client, QUEUES, random.Random(1))  # to queue 0
            (second,) = iter_records((await asyncio.wait_for(woken, TIMEOUT)).body)
            assert second.queue_offset == 1
        finally:
            for _, writer in peers:
                writer.transport.abort()
        await eventually(lambda: len(b.server.connections) == 1)
        assert holds.parked == 0 and not handler_tasks()


async def test_a_broker_at_max_connections_closes_one_more_on_arrival(tmp_path: Path) -> None:
    """broker.conf's ``maxConnections`` bounds the broker's port: at it, one more connection
    is closed before it is read, and the clients connected keep sending."""
    async with broker(tmp_path, max_connections=3) as b:
        clients = [RemotingClient(HOST, b.server.port) for _ in range(3)]
        try:
            for i, c in enumerate(clients):
                await call(c, RequestCode.SEND_MESSAGE, send_fields(0, {}), b"m%d" % i)
            reader, writer = await asyncio.open_connection(HOST, b.server.port)
            assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # closed at once
            writer.close()
            assert b.server.refusals.count == 1
            await call(clients[0], RequestCode.SEND_MESSAGE, send_fields(0, {}), b"after")
            info = await call(clients[0], RequestCode.GET_BROKER_RUNTIME_INFO, {})
            table = json.loads(info.body)["table"]
            assert (table["evqConnectionsRefused"], table["evqReadBudgetUsed"],
                    table["evqReadBudgetWaits"]) == ("1", "0", "0")
        finally:
            for c in clients:
                await c.close()
