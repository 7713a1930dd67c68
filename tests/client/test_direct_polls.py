"""A SyncPullConsumer's polls made on the callers' own threads (evq.client.direct), against
real brokers in processes: positions, seeks, long polls past a line's own timeout, a queue
taken away by a rebalance while its poll is in flight, and a killed master's slave."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import pytest

from evq.client.blocking import SyncProducer, SyncPullConsumer
from evq.client.errors import ClientError, RouteNotFound
from evq.client.pull_consumer import PULL_TIMEOUT_MARGIN_S
from evq.client.pulling import PullResult, PullStatus, Subscription, pull_request
from evq.domain.message import new_message
from evq.domain.queues import MessageQueue
from evq.net.protocol import SerializeType
from tests.client.conftest import Served
from tests.cluster import running_cluster
from tests.ha.group import admin_tables, log_end
from tests.waiting import wait_for

WAIT_S = 30.0


def routed_queues(c: SyncPullConsumer, topic: str) -> list[MessageQueue]:
    """``topic``'s queues once the name server routes it: a send that created the topic made
    the broker register it, and that registration may still be on its way (a CI run under
    load once assigned before it arrived)."""
    found: list[MessageQueue] = []

    def routed() -> bool:
        try:
            found[:] = c.queues(topic)
        except RouteNotFound:
            return False
        return True

    wait_for(f"the name server to route {topic!r}", routed)
    return found


def test_polls_are_made_on_the_callers_thread_and_move_the_positions(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        for i in range(60):
            p.send(new_message("Polled", b"m%d" % i))
    with SyncPullConsumer("Pollers", cluster.namesrv, auto_commit=False) as c:
        queues = routed_queues(c, "Polled")
        with pytest.raises(ClientError, match="not assigned"):  # the loop's poll says so
            c.poll(queues[0])
        c.assign(queues)
        read: dict[MessageQueue, list[int]] = {q: [] for q in queues}
        polls, deadline = 0, time.monotonic() + WAIT_S
        while sum(map(len, read.values())) < 60:
            assert time.monotonic() < deadline, f"read {sum(map(len, read.values()))} of 60"
            for q in queues:
                read[q] += [m.queue_offset for m in c.poll(q, 7).messages]
                polls += 1
        assert c.direct_polls == polls and c.lines(cluster.broker) == 1
        assert all(offsets == list(range(len(offsets))) for offsets in read.values())
        assert c.assignment == {q: len(read[q]) for q in queues}
        busiest = max(queues, key=lambda q: len(read[q]))
        c.seek(busiest, 1)
        again = c.poll(busiest, 2)
        assert [m.queue_offset for m in again.messages] == [1, 2]
        assert c.assignment[busiest] == 3 and c.direct_polls == polls + 1
        c.commit()
        assert c.committed(busiest) == 3


def test_a_long_poll_waits_on_the_callers_thread_past_the_lines_own_timeout(
        cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        queue = p.send(new_message("Waited", b"first")).queue
        with SyncPullConsumer("Waiters", cluster.namesrv) as c:
            assert queue in routed_queues(c, "Waited")
            c.assign([queue])
            assert [m.body for m in c.poll(queue).messages] == [b"first"]
            wait_ms = round((PULL_TIMEOUT_MARGIN_S + 0.5) * 1000)  # the line times out at 3 s
            started = time.monotonic()
            empty = c.poll(queue, wait_ms=wait_ms)
            assert empty.status is PullStatus.NO_NEW_MSG
            assert time.monotonic() - started >= wait_ms / 1000 - 0.5
            assert c.direct_polls == 2  # not timed out and done again by the loop

            got: list[PullResult] = []
            poller = threading.Thread(target=lambda: got.append(c.poll(queue, wait_ms=20_000)))
            started = time.monotonic()
            poller.start()
            p.send_to_queue(new_message("Waited", b"second"), queue.queue_id)
            poller.join(WAIT_S)
            assert [m.body for m in got[0].messages] == [b"second"]
            assert time.monotonic() - started < 15 and c.direct_polls == 3


def test_a_poll_in_flight_while_its_queue_is_taken_away_does_not_put_it_back(
        cluster: Served) -> None:
    """The poll reads its queue's position, a rebalance on the loop's thread gives the queue
    to a new member, then the poll's answer comes: the position is not written back, which
    would make this member read the queue again beside its new owner."""
    with SyncProducer("PG", cluster.namesrv) as p:
        p.send_to_queue(new_message("Balanced", b"zero"), 0)  # the topic, 4 queues, 3 empty
        first = SyncPullConsumer("Balancers", cluster.namesrv, client_id="a@first")
        first.subscribe("Balanced")
        with first:
            wait_for("the first member to take every queue", lambda: len(first.assignment) == 4)
            last = max(first.assignment)
            got: list[PullResult] = []
            poller = threading.Thread(target=lambda: got.append(first.poll(last,
                                                                           wait_ms=20_000)))
            poller.start()
            wait_for("the poll to be on its line", lambda: first.lines(cluster.broker) == 1)
            second = SyncPullConsumer("Balancers", cluster.namesrv, client_id="b@second")
            second.subscribe("Balanced")
            with second:
                # AVG gives the member first in order the first half of the queues.
                wait_for("the rebalance to take the last queue away",
                         lambda: last not in first.assignment and len(first.assignment) == 2)
                p.send_to_queue(new_message("Balanced", b"three"), last.queue_id)
                poller.join(WAIT_S)
                assert [m.body for m in got[0].messages] == [b"three"]
                assert last not in first.assignment and len(first.assignment) == 2
                assert first.direct_polls == 1
                wait_for("the second member to hold the rest",
                         lambda: set(second.assignment) == {q for q in set(first.queues(
                             "Balanced")) if q not in first.assignment})


def test_a_killed_masters_queues_are_polled_from_its_slave(tmp_path: Path) -> None:
    """Two broker groups, each a master and a slave: SIGKILL one master between polls and the
    polls go on from its slave, still on the caller's thread, and read every message exactly
    once."""
    bodies = [b"k%d" % i for i in range(80)]
    read: list[bytes] = []
    with running_cluster(tmp_path) as cluster:
        with SyncProducer("PG", cluster.namesrv) as p:
            sent = [p.send(new_message("KillPoll", body)) for body in bodies]
        assert {r.queue.broker_name for r in sent} == {"broker-a", "broker-b"}
        master, slave = cluster.addr("broker-a"), cluster.addr("broker-a", slave=True)
        wait_for("broker-a's slave to catch up",
                 lambda: asyncio.run(log_end(master)) == asyncio.run(log_end(slave)))
        # The topic's config reaches the slave in the log too, and is applied from there on the
        # slave's next tick: a pull before that is TOPIC_NOT_EXIST.
        wait_for("broker-a's slave to apply the KillPoll topic config",
                 lambda: "KillPoll" in ((asyncio.run(admin_tables(slave)) or {})
                                        .get("topicConfigTable") or {}))
        with SyncPullConsumer("KillPollers", cluster.namesrv, auto_commit=False) as c:
            queues = c.queues("KillPoll")
            c.assign(queues)

            def poll_until(n: int) -> None:
                deadline = time.monotonic() + WAIT_S
                while len(read) < n:
                    assert time.monotonic() < deadline, f"read {len(read)} of {n}"
                    for q in queues:
                        read.extend(m.body for m in c.poll(q, 4).messages)

            poll_until(20)
            assert c.lines(master) == 1
            killed = cluster.masters["broker-a"].proc
            killed.send_signal(signal.SIGKILL)
            assert killed.wait(WAIT_S) == -signal.SIGKILL
            before = c.direct_polls
            poll_until(len(bodies))
            assert c.lines(master) == 0 and c.lines(slave) == 1
            assert c.direct_polls > before
    assert sorted(read) == sorted(bodies)


@pytest.mark.parametrize(("expression", "kind"), [
    ("a || b\u00e9", SerializeType.ROCKETMQ),
    ("a || \udc80", SerializeType.JSON),  # a lone surrogate (surrogateescape's): no UTF-8
])
def test_a_pull_goes_in_the_binary_header_where_utf8_carries_it(
        expression: str, kind: SerializeType) -> None:
    """A consumer's pulls, the request it makes most, go as ROCKETMQ headers (the polls
    above run on them); a subscription no UTF-8 carries goes as JSON, which escapes it."""
    cmd = pull_request("G", MessageQueue("T", "b", 0), 5, Subscription("T", expression))
    assert cmd.serialize_type is kind
