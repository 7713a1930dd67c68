"""The synchronous wrappers, from plain (non-async) test functions, against a real name server
and broker."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time

import pytest

from evq.client.blocking import SyncProducer, SyncPullConsumer, SyncPushConsumer
from evq.client.consumer import ConsumeFrom, ConsumeResult, ConsumerOptions
from evq.client.errors import ClientError
from evq.client.producer import SendResult, SendStatus, order_queue
from evq.client.pulling import PullStatus
from evq.domain.message import Message, new_message
from tests.client.conftest import Served

KEY = "one queue"


def produce(namesrv: str, topic: str, n: int) -> None:
    with SyncProducer("PG", namesrv) as p:
        for i in range(n):
            p.send_orderly(new_message(topic, b"%d" % i), KEY)


def test_sync_pull_consumer_polls_commits_and_seeks(cluster: Served) -> None:
    produce(cluster.namesrv, "SP", 4)
    with SyncPullConsumer("G-sp", cluster.namesrv, auto_commit=False) as c:
        q = order_queue(c.queues("SP"), KEY)
        c.assign([q])
        assert [m.payload() for m in c.poll(q, 2).messages] == [b"0", b"1"]
        c.commit()
        assert c.committed(q) == 2
        c.seek(q, 3)
        assert [m.payload() for m in c.poll(q).messages] == [b"3"]
        assert c.poll(q).status is PullStatus.NO_NEW_MSG
        c.seek_to_begin(q)
        assert c.assignment == {q: 0}
        c.seek_to_end(q)
        assert c.assignment == {q: 4}
        c.seek_to_timestamp(q, 0)
        assert [m.payload() for m in c.poll(q).messages] == [b"%d" % i for i in range(4)]


def test_sync_pull_consumer_subscribed_polls_all_its_queues(cluster: Served) -> None:
    produce(cluster.namesrv, "SPS", 3)
    c = SyncPullConsumer("G-sps", cluster.namesrv)
    c.subscribe("SPS")
    with c:
        with pytest.raises(ClientError, match="before start"):
            c.subscribe("other")
        assert {q.topic for q in c.assignment} == {"SPS"}
        got = c.poll_all()
    assert sorted(m.payload() for m in got) == [b"0", b"1", b"2"]


def test_sync_push_consumer_runs_a_plain_listener_in_the_background(cluster: Served) -> None:
    produce(cluster.namesrv, "SPU", 5)
    got: list[Message] = []
    done = threading.Event()

    def listener(msgs: list[Message]) -> ConsumeResult:
        got.extend(msgs)
        if len(got) >= 5:
            done.set()
        return ConsumeResult.CONSUME_SUCCESS

    c = SyncPushConsumer("G-spu", cluster.namesrv,
                         options=ConsumerOptions(consume_from=ConsumeFrom.FIRST_OFFSET))
    c.subscribe("SPU")
    c.start(listener)
    try:
        assert done.wait(20)
        assert {q.topic for q in c.assigned} >= {"SPU"}
    finally:
        c.shutdown()
    assert sorted(m.payload() for m in got) == [b"%d" % i for i in range(5)]


def test_send_async_returns_at_once_and_its_future_gets_the_result(cluster: Served) -> None:
    """The broker is stopped (SIGSTOP) while the message is sent: a blocking send could not
    return before it goes on, send_async does, and the callback gets the result after."""
    results: list[SendResult] = []
    done = threading.Event()

    def on_done(future: concurrent.futures.Future[SendResult]) -> None:
        results.append(future.result())
        done.set()

    with SyncProducer("PG-async", cluster.namesrv) as p:
        p.send(new_message("SA", b"warm"))  # routes looked up, connection open
        os.kill(cluster.proc.pid, signal.SIGSTOP)
        try:
            future = p.send_async(new_message("SA", b"while stopped"))
            future.add_done_callback(on_done)
            time.sleep(0.5)
            assert not future.done()
        finally:
            os.kill(cluster.proc.pid, signal.SIGCONT)
        assert done.wait(10)
        assert results[0].status is SendStatus.SEND_OK
        too_big = p.send_async(new_message("SA", os.urandom(5 << 20)))  # over 4 MiB
        assert isinstance(too_big.exception(10), ClientError)
