"""``evq broker --slave-read-enable``: a slave serves pulls while its master is down only when
asked to, as RocketMQ's slaveReadEnable (off by default: it answers PULL_RETRY_IMMEDIATELY)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from evq.domain.codes import ResponseCode
from evq.domain.record import iter_records
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, split_address
from tests.ha.group import broker_group, produce_numbered, wait_caught_up

TOPIC = "SlaveRead"
APPLY_WAIT_S = 10.0
CONFIG = "mappedFileSizeCommitLog=16777216\nwarmSegments=false\n"  # no slaveReadEnable


async def pull_all(addr: str) -> list[RemotingCommand]:
    """One pull from offset 0 of each of the topic's four queues."""
    async with RemotingClient(*split_address(addr)) as client:
        return [await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": TOPIC, "queueId": q, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "subscription": "*",
            "subVersion": 0}), 5.0) for q in range(4)]


@pytest.mark.parametrize("flag", [True, False], ids=["--slave-read-enable", "default"])
def test_a_slave_serves_reads_with_its_master_down_only_when_enabled(tmp_path: Path,
                                                                     flag: bool) -> None:
    (tmp_path / "broker.conf").write_text(CONFIG)
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave(*(["--slave-read-enable"] if flag else []))
        asyncio.run(produce_numbered(group.namesrv, TOPIC, "m", 4))
        wait_caught_up(group)
        group.kill_master()
        answers = asyncio.run(pull_all(group.slave_addr))
        deadline = time.monotonic() + APPLY_WAIT_S
        while any(a.code == ResponseCode.TOPIC_NOT_EXIST for a in answers):
            # The slave has the bytes (caught up) and applies the topic's record on its tick.
            assert time.monotonic() < deadline, "the slave never applied the topic's record"
            time.sleep(0.05)
            answers = asyncio.run(pull_all(group.slave_addr))
        if flag:
            bodies = sorted(m.body for a in answers if a.code == ResponseCode.SUCCESS
                            for m in iter_records(a.body))
            assert bodies == [b"m0", b"m1", b"m2", b"m3"]
        else:
            assert {a.code for a in answers} == {ResponseCode.PULL_RETRY_IMMEDIATELY}
