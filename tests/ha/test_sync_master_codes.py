"""A SYNC_MASTER's answer codes on the wire, in real processes: SLAVE_NOT_AVAILABLE while no
slave is connected, FLUSH_SLAVE_TIMEOUT while its slave is connected but frozen (SIGSTOP), and
SEND_OK again once the slave runs on."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from evq.client.producer import Producer
from evq.domain.codes import ResponseCode
from evq.domain.message import new_message
from tests.ha.group import broker_group, wait_caught_up

TOPIC = "HaSyncCodes"
SYNC_FLUSH_TIMEOUT_S = 5.0  # syncFlushTimeout's default: how long a send waits for the slave


async def send_code(namesrv: str) -> tuple[ResponseCode, float]:
    """One send's response code and how long its answer took."""
    async with Producer("ha-sync-codes", namesrv,
                        send_timeout=2 * SYNC_FLUSH_TIMEOUT_S) as producer:
        began = time.monotonic()
        r = await producer.send(new_message(TOPIC, b"x" * 100))
        return r.status.value, time.monotonic() - began


@pytest.mark.slow
def test_sync_master_answers_whether_a_slave_holds_the_message(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("SYNC_MASTER")
        code, _took = asyncio.run(send_code(group.namesrv))
        assert code is ResponseCode.SLAVE_NOT_AVAILABLE
        slave = group.start_slave()
        wait_caught_up(group)
        assert asyncio.run(send_code(group.namesrv))[0] is ResponseCode.SUCCESS
        slave.proc.send_signal(signal.SIGSTOP)
        try:
            code, took = asyncio.run(send_code(group.namesrv))
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        assert code is ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert took >= SYNC_FLUSH_TIMEOUT_S * 0.9
        assert asyncio.run(send_code(group.namesrv))[0] is ResponseCode.SUCCESS
        assert slave.stop() == 0, group.slave_log()
