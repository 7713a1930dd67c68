"""Hostile and careless clients against a real ``evq broker`` process: what they cost it.

Memory is read from the broker's ``/proc/PID/status`` (VmRSS, sampled while the abuse runs),
so the bounds are the process's own, not a model's: a compression bomb, connections that
pipeline pulls of a 4 MiB message and never read, and a consumer that reads slowly.  Every
case ends with the broker alive, still serving a well-behaved client, and the messages it
acknowledged before the abuse reading back byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from evq.domain import sysflag as sf
from evq.domain.codes import ResponseCode
from evq.domain.record import iter_records
from evq.net.codes import RequestCode
from evq.net.protocol import BINARY_FIXED, MAX_HEADER, FrameDecoder, RemotingCommand
from evq.net.transport import RemotingClient, run
from tests.chaos.conftest import Report
from tests.processes import Running, port_of, running_evq

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="reads process memory from /proc")

HOST = "127.0.0.1"
TIMEOUT = 30.0
MIB = 1024 * 1024
TOPIC = "Abused"
KEPT = 8
RSS_BOUND = 256 * MIB  # growth allowed over the baseline; each abuse once took 1.7-2.1 GiB
WATCH_S = 3.0


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@contextlib.contextmanager
def running_broker_alone(data: Path) -> Iterator[Running]:
    with running_evq("--log-level", "warning", "broker", "--port", "0", "--data", str(data),
                     servers=1) as broker:
        yield broker
        assert broker.stop() == 0


def send_fields(**extra: object) -> dict[str, object]:
    return {"producerGroup": "PG", "topic": TOPIC, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
            "bornTimestamp": 1_700_000_000_000, "flag": 0, "properties": "",
            "reconsumeTimes": 0, **extra}


def pull_fields(offset: int, count: int = 32) -> dict[str, object]:
    return {"consumerGroup": "G", "topic": TOPIC, "queueId": 0, "queueOffset": offset,
            "maxMsgNums": count, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
            "subVersion": 0}


async def call(client: RemotingClient, code: int, fields: dict[str, object],
               body: bytes = b"") -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), TIMEOUT)


async def store_kept(client: RemotingClient, big: int = 0) -> list[bytes]:
    """KEPT messages (the first ``big`` bytes long when asked), acknowledged."""
    bodies = [bytes([i]) * (big or 100 + i) for i in range(KEPT)]
    for body in bodies:
        r = await call(client, RequestCode.SEND_MESSAGE, send_fields(), body)
        assert r.code == ResponseCode.SUCCESS, r.remark
    return bodies


async def read_back(client: RemotingClient, bodies: list[bytes]) -> None:
    got: list[bytes] = []
    while len(got) < len(bodies):
        r = await call(client, RequestCode.PULL_MESSAGE, pull_fields(len(got), 1))
        assert r.code == ResponseCode.SUCCESS, r.remark
        got += [m.body for m in iter_records(r.body)]
    assert got == bodies


async def watch_rss(pid: int, baseline: int, seconds: float) -> int:
    """Sample the broker's memory for ``seconds`` while the abuse runs; the peak growth, which
    must stay under the bound at every sample."""
    peak = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss(pid) - baseline)
        assert peak < RSS_BOUND, f"the broker grew by {peak / MIB:.0f} MiB"
        await asyncio.sleep(0.02)
    return peak


def bomb(inflated: int) -> bytes:
    deflater = zlib.compressobj(9)
    chunk = bytes(MIB)
    return b"".join(deflater.compress(chunk) for _ in range(inflated // MIB)) + deflater.flush()


def test_compression_bombs_are_refused_for_the_cost_of_the_limit(tmp_path: Path,
                                                                 report: Report) -> None:
    payload = bomb(1024 * MIB)  # a 1 MiB request that asks for 1 GiB

    async def scenario(broker: Running) -> None:
        pid, port = broker.proc.pid, port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client:
            kept = await store_kept(client)
            baseline = rss(pid)

            async def one_bomb() -> RemotingCommand:
                async with RemotingClient(HOST, port) as c:
                    return await call(c, RequestCode.SEND_BATCH_MESSAGE,
                                      send_fields(sysFlag=sf.COMPRESSED, batch="true"), payload)

            bombs = asyncio.gather(*(one_bomb() for _ in range(4)))
            peak = await watch_rss(pid, baseline, WATCH_S)
            answers = await bombs
            assert [a.code for a in answers] == [ResponseCode.MESSAGE_ILLEGAL] * 4
            assert all("inflates past" in (a.remark or "") for a in answers)
            info = await call(client, RequestCode.GET_BROKER_RUNTIME_INFO, {})
            stall = float(json.loads(info.body)["table"]["evqLoopStallMaxMs"])
            await read_back(client, kept)
            report(bombs=4, request_bytes=len(payload), asked_bytes=1024 * MIB,
                   rss_growth_mib=round(peak / MIB, 1), loop_stall_max_ms=stall)

    with running_broker_alone(tmp_path / "data") as broker:
        run(scenario(broker))


async def pipeline_pulls(port: int, count: int) -> tuple[asyncio.StreamReader,
                                                          asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"".join(RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=i,
                                          ext_fields=pull_fields(0, 1)).encode()
                          for i in range(1, count + 1)))
    await writer.drain()
    return reader, writer


def test_connections_that_never_read_cost_a_bounded_amount(tmp_path: Path,
                                                           report: Report) -> None:
    """1,024 pipelined pulls of a 4 MiB message on each of two connections that read
    nothing: once 1.7 GiB (3.3 GiB with two)."""

    async def scenario(broker: Running) -> None:
        pid, port = broker.proc.pid, port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client:
            kept = await store_kept(client, big=4 * MIB - 1024)
            baseline = rss(pid)
            peers = [await pipeline_pulls(port, 1024) for _ in range(2)]
            peak = await watch_rss(pid, baseline, WATCH_S)
            r = await call(client, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
            assert r.code == ResponseCode.SUCCESS  # others are served meanwhile
            await read_back(client, kept)
            for _reader, writer in peers:
                writer.close()
            report(connections=2, pipelined_pulls=1024, answer_mib=4,
                   rss_growth_mib=round(peak / MIB, 1))
        async with RemotingClient(HOST, port) as client:
            await read_back(client, kept)

    with running_broker_alone(tmp_path / "data") as broker:
        run(scenario(broker))


def test_a_slow_reader_gets_every_answer_in_full(tmp_path: Path) -> None:
    pulls, size = 16, MIB

    async def scenario(broker: Running) -> None:
        port = port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client:
            kept = await store_kept(client, big=size)
        reader, writer = await pipeline_pulls(port, pulls)
        decoder = FrameDecoder()
        answers: list[RemotingCommand] = []
        try:
            while len(answers) < pulls:
                data = await asyncio.wait_for(reader.read(64 * 1024), TIMEOUT)
                assert data, "closed before every answer came"
                decoder.feed(data)
                while (cmd := decoder.next_command()) is not None:
                    answers.append(cmd)
                await asyncio.sleep(0.005)  # a consumer slower than the broker
        finally:
            writer.close()
        assert sorted(a.opaque for a in answers) == list(range(1, pulls + 1))
        assert all([m.body for m in iter_records(a.body)] == kept[:1] for a in answers)

    with running_broker_alone(tmp_path / "data") as broker:
        run(scenario(broker))




BATCH_ENTRY = 22  # the smallest batch entry: 20 header bytes, an empty body, no properties


def tiny_batch(size: int) -> bytes:
    """A batch body of exactly ``size`` bytes made of as many messages as fit: empty ones,
    the last padded with a body to make up the size."""
    count, spare = divmod(size, BATCH_ENTRY)
    empty = struct.pack(">iiiii", BATCH_ENTRY, 0, 0, 0, 0) + b"\0\0"
    last = struct.pack(">iiiii", BATCH_ENTRY + spare, 0, 0, 0, spare) + bytes(spare) + b"\0\0"
    return empty * (count - 1) + last


def test_a_batch_at_the_size_limit_is_stored_whole_while_the_loop_serves_others(
        tmp_path: Path, report: Report) -> None:
    """The largest batch a producer may send (4 MiB, RocketMQ's maxMessageSize, the same
    bound) packed with 190,650 empty messages: stored whole and contiguous while the broker
    goes on answering others; one byte more is refused.  Once it held the loop for 1.1 s
    (3.5 s for a 16 MiB frame of them)."""
    limit = 4 * MIB
    body = tiny_batch(limit)
    count = limit // BATCH_ENTRY

    async def scenario(broker: Running) -> None:
        pid, port = broker.proc.pid, port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client, RemotingClient(HOST, port) as other:
            kept = await store_kept(client)
            baseline = rss(pid)
            over = await call(client, RequestCode.SEND_BATCH_MESSAGE, send_fields(batch="true"),
                              tiny_batch(limit + 1))
            assert over.code == ResponseCode.MESSAGE_ILLEGAL
            assert f"exceeds the maximum {limit}" in (over.remark or "")

            sent = asyncio.ensure_future(call(client, RequestCode.SEND_BATCH_MESSAGE,
                                              send_fields(batch="true"), body))
            # A single send on another connection meanwhile: answered promptly, and stored
            # before or after the batch, never inside it.
            slowest, single = 0.0, None
            while not sent.done():
                began = time.monotonic()
                r = await call(other, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
                assert r.code == ResponseCode.SUCCESS
                slowest = max(slowest, time.monotonic() - began)
                if single is None:
                    single = await call(other, RequestCode.SEND_MESSAGE, send_fields(), b"one")
                    assert single.code == ResponseCode.SUCCESS, single.remark
                await asyncio.sleep(0.005)
            answer = await sent
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            growth = rss(pid) - baseline
            assert growth < RSS_BOUND, f"the broker grew by {growth / MIB:.0f} MiB"
            first = int(answer.ext_fields["queueOffset"])
            assert len(answer.ext_fields["msgId"].split(",")) == count
            assert single is not None
            lone = int(single.ext_fields["queueOffset"])
            assert lone in (KEPT, KEPT + count) and first == (KEPT + 1 if lone == KEPT else KEPT)
            r = await call(client, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
            assert int(r.ext_fields["offset"]) == KEPT + 1 + count
            info = await call(client, RequestCode.GET_BROKER_RUNTIME_INFO, {})
            stall = float(json.loads(info.body)["table"]["evqLoopStallMaxMs"])
            assert slowest < 0.25 and stall < 250, (slowest, stall)
            await read_back(client, kept)
            report(messages=count, batch_bytes=len(body), slowest_answer_ms=round(slowest * 1e3),
                   loop_stall_max_ms=stall, rss_growth_mib=round(growth / MIB, 1))

    with running_broker_alone(tmp_path / "data") as broker:
        run(scenario(broker))


def empty_fields_header(count: int) -> bytes:
    """A ROCKETMQ SEND_MESSAGE header of ``count`` distinct empty fields: the most Python
    objects a header's bytes can ask the broker to make."""
    fields = b"".join(struct.pack(">h", 7) + b"x%06x" % i + struct.pack(">i", 0)
                      for i in range(count))
    fixed = BINARY_FIXED.pack(RequestCode.SEND_MESSAGE, 0, 317, 3, 0)
    return fixed + struct.pack(">i", 0) + struct.pack(">i", len(fields)) + fields


def test_headers_of_empty_fields_cost_the_loop_the_bound_at_most(tmp_path: Path,
                                                                 report: Report) -> None:
    """Four connections each send a 15 MiB header of 1.1 million empty fields (refused from
    its header word), then a send carries a header of the bound's size full of them besides
    its own (stored: the broker ignores fields it does not know).  Each 15 MiB header once
    held the broker's loop for 0.6-0.7 s and grew it by 190 MiB."""
    huge = empty_fields_header(1_100_000)
    huge_frame = struct.pack(">ii", 4 + len(huge), 1 << 24 | len(huge)) + huge

    async def attack(port: int) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            writer.write(huge_frame)
            await writer.drain()
            await reader.read()  # the refusal, then the close (or a reset: it read no more)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def scenario(broker: Running) -> None:
        pid, port = broker.proc.pid, port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client:
            kept = await store_kept(client)
            baseline = rss(pid)
            attacks = asyncio.gather(*(attack(port) for _ in range(4)))
            peak = await watch_rss(pid, baseline, 1.0)
            await attacks
            own = send_fields()
            filler = (MAX_HEADER - 4096) // 13  # 13 bytes a field as JSON: "x000000":"",
            fields = {**{f"x{i:06x}": "" for i in range(filler)}, **own}
            request = RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"padded")
            header_bytes = len(request.encode()) - 8 - len(b"padded")
            assert MAX_HEADER - 8192 < header_bytes <= MAX_HEADER
            r = await client.invoke(request, TIMEOUT)
            assert r.code == ResponseCode.SUCCESS, r.remark
            info = await call(client, RequestCode.GET_BROKER_RUNTIME_INFO, {})
            stall = float(json.loads(info.body)["table"]["evqLoopStallMaxMs"])
            assert stall < 250, stall
            await read_back(client, [*kept, b"padded"])
            report(refused_header_bytes=len(huge), refused_fields=1_100_000,
                   bound_header_bytes=header_bytes, bound_fields=filler + len(own),
                   rss_growth_mib=round(peak / MIB, 1), loop_stall_max_ms=stall)

    with running_broker_alone(tmp_path / "data") as broker:
        run(scenario(broker))


def test_frames_that_never_finish_hold_the_read_budget_at_most(tmp_path: Path,
                                                               report: Report) -> None:
    """Sixteen connections each send 15 MiB of a 16 MiB frame and never the rest (240 MiB
    asked of a broker whose ``maxBufferedBytes`` is 64 MiB): the broker holds about its
    budget, not what was sent, and a well-behaved client stores and reads back meanwhile."""
    budget, hogs = 64 * MIB, 16
    conf = tmp_path / "broker.conf"
    conf.write_text(f"maxBufferedBytes={budget}\n")
    header = b'{"code":%d,"opaque":1}' % RequestCode.SEND_MESSAGE
    frame = struct.pack(">ii", 4 + len(header) + 16 * MIB - 64, len(header)) + header
    unfinished = frame + bytes(15 * MIB)

    async def scenario(broker: Running) -> None:
        pid, port = broker.proc.pid, port_of(broker.addresses["broker"])
        async with RemotingClient(HOST, port) as client:
            baseline = rss(pid)
            writers = []
            for _ in range(hogs):
                _reader, writer = await asyncio.open_connection(HOST, port)
                writer.write(unfinished)  # what the broker does not read waits here and in TCP
                writers.append(writer)
            peak = await watch_rss(pid, baseline, WATCH_S)
            assert peak < budget + 64 * MIB, f"the broker grew by {peak / MIB:.0f} MiB"
            kept = await store_kept(client)
            await read_back(client, kept)
            for writer in writers:
                writer.transport.abort()  # close() would wait to send what the broker never reads
            report(connections=hogs, unfinished_bytes=hogs * len(unfinished),
                   budget_mib=budget // MIB, rss_growth_mib=round(peak / MIB, 1))

    with running_evq("--log-level", "warning", "broker", "--port", "0", "--data",
                     str(tmp_path / "data"), "--config", str(conf), servers=1) as broker:
        run(scenario(broker))
        assert broker.stop() == 0
