"""The stock C++ client (PyPI ``rocketmq``) consumer through a master kill.

With the master SIGKILLed the name server drops it (its registration connection closes), so
the route of the broker group holds the slave alone; the C++ client's
``findBrokerAddressInSubscribe`` then falls back to it, and the slave answers pulls
(``slaveReadEnable``) and takes offset commits.  A consumer group started only after the kill
therefore reads everything from the slave; once the master is back, both that group and one
that ran all along go on with new messages, and neither loses one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from evq.client.routes import Routes
from tests.compat.conftest import Driver, stock
from tests.ha.group import broker_group, committed, wait_caught_up
from tests.waiting import wait_for

TOPIC = "HaStock"
PER_PHASE = 10
WAIT_S = 60.0
CONSUME_S = "120"
LATE = "G_ha_stock_late"
QUEUES = 4  # the auto-created topic's defaultTopicQueueNums


def consumed(lines: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """(queue, queue offset) of every message a driver consumed."""
    return {(m["queue"], m["offset"]) for m in list(lines) if "seq" in m}


def assert_nothing_lost(lines: list[dict[str, Any]], total: int) -> None:
    """Every queue's offsets from 0 without a gap, ``total`` messages in all, bodies intact:
    all the sends reached the consumer (the producer's acknowledgements were all OK)."""
    got = consumed(lines)
    by_queue: dict[int, set[int]] = {}
    for q, o in got:
        by_queue.setdefault(q, set()).add(o)
    assert len(got) == total, sorted(got)
    assert all(offs == set(range(len(offs))) for offs in by_queue.values()), by_queue
    assert all(m["body_ok"] for m in lines if "seq" in m)


async def routed_brokers(namesrv: str) -> dict[str, dict[int, str]]:
    """The topic's broker groups as the name server routes them now (id -> address)."""
    routes = Routes(namesrv)
    try:
        return (await routes.lookup(TOPIC)).brokers
    finally:
        await routes.close()


@pytest.mark.slow
def test_stock_consumer_reads_the_slave_while_the_master_is_down(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave()
        first = stock("produce", group.namesrv, TOPIC, "sync", str(PER_PHASE))
        assert [s["status"] for s in first] == ["OK"] * PER_PHASE
        before = Driver("consume", group.namesrv, TOPIC, "G_ha_stock", "clustering", "0", "0",
                        CONSUME_S)
        drivers = [before]
        try:
            early = before.lines
            wait_for("the first messages", lambda: len(consumed(early)) >= PER_PHASE,
                     within=WAIT_S, every=0.1)
            wait_caught_up(group)
            group.kill_master()
            # The name server drops the master as its registration connection closes: what
            # a client is routed to now is the slave alone.
            wait_for("a route to the slave alone",
                     lambda: [list(ids.items()) for ids in
                              asyncio.run(routed_brokers(group.namesrv)).values()]
                     == [[(1, group.slave_addr)]], within=WAIT_S, every=0.1)
            # A group that never met the master: with the master still down, the only broker
            # it can have read the first phase from is the slave.
            late_driver = Driver("consume", group.namesrv, TOPIC, LATE, "clustering", "0", "0",
                                 CONSUME_S)
            drivers.append(late_driver)
            late = late_driver.lines
            wait_for("the late group's messages from the slave",
                     lambda: len(consumed(late)) >= PER_PHASE, within=WAIT_S, every=0.1)
            assert_nothing_lost(late, PER_PHASE)
            per_queue = [sum(1 for q, _ in consumed(late) if q == i) for i in range(QUEUES)]
            wait_for("the late group's offset commits on the slave",
                     lambda: asyncio.run(committed(group.slave_addr, LATE, TOPIC, QUEUES))
                     == per_queue, within=WAIT_S, every=0.1)
            assert group.master is not None and not group.master.alive()
            group.start_master("ASYNC_MASTER")
            second = stock("produce", group.namesrv, TOPIC, "sync", str(PER_PHASE))
            assert [s["status"] for s in second] == ["OK"] * PER_PHASE
            for lines, who in ((early, "the first group"), (late, "the late group")):
                wait_for(f"{who}'s messages after the master's return",
                         lambda lines=lines: len(consumed(lines)) >= 2 * PER_PHASE,
                         within=WAIT_S, every=0.1)
                assert_nothing_lost(lines, 2 * PER_PHASE)
        finally:
            for driver in drivers:
                driver.kill()
