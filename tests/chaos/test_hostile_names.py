"""Names and properties at and past their limits, against a real broker process.

Every legal character at every legal length (topics of 127 characters of ``[%|a-zA-Z0-9_-]``,
``%`` runs that look like percent escapes), properties up to RocketMQ's 32,767 bytes with any
Unicode in them: each is stored and read back exactly, including after a SIGKILL and restart.
One past each limit is refused with the code RocketMQ gives, and refusing it costs nothing
already stored.
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from evq.domain.codes import ResponseCode
from evq.domain.groups import MAX_GROUP_LENGTH
from evq.domain.message import MAX_PROPERTIES_BYTES, encode_properties
from evq.domain.record import iter_records
from evq.domain.topics import MAX_TOPIC_LENGTH, NOT_ALLOWED_SEND
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, run
from tests.chaos.conftest import Report
from tests.processes import port_of, running_evq
from tests.strategies import not_system_property, sendable_topics

HOST = "127.0.0.1"
TIMEOUT = 10.0
property_text = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]),
                        min_size=1, max_size=40)


def send_fields(topic: str, props: dict[str, str], group: str = "PG") -> dict[str, object]:
    return {"producerGroup": group, "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
            "bornTimestamp": 1_700_000_000_000, "flag": 0,
            "properties": encode_properties(props), "reconsumeTimes": 0}


async def call(client: RemotingClient, code: int, fields: dict[str, object],
               body: bytes = b"") -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), TIMEOUT)


async def read_all(client: RemotingClient, topic: str) -> list[tuple[bytes, dict[str, str]]]:
    r = await call(client, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "Reader", "topic": topic, "queueId": 0, "queueOffset": 0,
        "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
        "subVersion": 0})
    assert r.code == ResponseCode.SUCCESS, (topic, r.code, r.remark)
    return [(m.body, m.properties) for m in iter_records(r.body)]


def test_names_and_properties_at_their_limits_survive_sigkill(tmp_path: Path,
                                                              report: Report) -> None:
    rng = random.Random(11)
    sent: dict[str, list[tuple[bytes, dict[str, str]]]] = {}
    tried = {"stored": 0, "refused": 0}

    async def store(port: int, topic: str, props: dict[str, str]) -> None:
        async with RemotingClient(HOST, port) as c:
            body = rng.randbytes(rng.randint(0, 2000))
            r = await call(c, RequestCode.SEND_MESSAGE, send_fields(topic, props), body)
            assert r.code == ResponseCode.SUCCESS, (topic, r.remark)
            sent.setdefault(topic, []).append((body, props))
            tried["stored"] += 1

    async def refuse(port: int, fields: dict[str, object], code: ResponseCode) -> None:
        async with RemotingClient(HOST, port) as c:
            r = await call(c, RequestCode.SEND_MESSAGE, fields, b"x")
            assert r.code == code, (r.code, r.remark)
            tried["refused"] += 1

    with running_evq("--log-level", "warning", "broker", "--port", "0", "--flush",
                     "SYNC_FLUSH", "--data", str(tmp_path / "data"), servers=1) as broker:
        port = port_of(broker.addresses["broker"])

        user_names = property_text.filter(not_system_property)

        @settings(max_examples=60, deadline=None)
        @given(sendable_topics, st.dictionaries(user_names, property_text, max_size=5))
        def legal(topic: str, props: dict[str, str]) -> None:
            run(store(port, topic, props))

        legal()
        for topic in ("%" * MAX_TOPIC_LENGTH, "%RETRY%default", "%DLQ%cafe", "%25%2F%7C"):
            run(store(port, topic, {"k": "v"}))
        big = {"big": "ü" * ((MAX_PROPERTIES_BYTES - 200) // 2)}  # two bytes a character
        run(store(port, "BigProperties", big))
        run(refuse(port, send_fields("x" * (MAX_TOPIC_LENGTH + 1), {}),
                   ResponseCode.SYSTEM_ERROR))  # Java's TopicValidator answer
        run(refuse(port, send_fields("BigProperties", {"big": "x" * MAX_PROPERTIES_BYTES}),
                   ResponseCode.MESSAGE_ILLEGAL))
        for topic in sorted(NOT_ALLOWED_SEND):  # the broker writes these itself
            run(refuse(port, send_fields(topic, {}), ResponseCode.NO_PERMISSION))
        run(refuse(port, send_fields("T", {}, group="g" * (MAX_GROUP_LENGTH + 1)),
                   ResponseCode.SYSTEM_ERROR))
        broker.proc.kill()
        broker.proc.wait(10)

    with running_evq("--log-level", "warning", "broker", "--port", "0", "--data",
                     str(tmp_path / "data"), servers=1) as broker:

        async def read_back() -> None:
            async with RemotingClient(HOST, port_of(broker.addresses["broker"])) as c:
                for topic, messages in sent.items():
                    got = await read_all(c, topic)
                    assert [b for b, _ in got] == [b for b, _ in messages], topic
                    for (_, stored), (_, props) in zip(got, messages, strict=True):
                        assert {k: stored[k] for k in props} == props, topic

        run(read_back())
        assert broker.stop() == 0
    report(stored=tried["stored"], refused=tried["refused"], topics=len(sent))
