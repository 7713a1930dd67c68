"""A SyncProducer's sends made on the callers' own threads (evq.client.direct), against real
brokers in processes, and a line's bounds against a peer that answers what the test says."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evq.client.blocking import SyncProducer, SyncPullConsumer
from evq.client.direct import BlockingLine, BlockingLines
from evq.client.errors import BrokerRefused, ClientError, SendFailed
from evq.client.producer import SendResult, SendStatus
from evq.domain.codes import ResponseCode
from evq.domain.message import PropertyError, new_message
from evq.net.codes import RequestCode
from evq.net.protocol import MAX_FRAME, FrameDecoder, RemotingCommand
from evq.net.transport import ConnectError, ConnectionClosed, RequestTimeout
from tests.client.clocks import SlowAnswers
from tests.client.conftest import Served
from tests.cluster import running_cluster
from tests.processes import running_broker, running_namesrv
from tests.waiting import wait_for

WAIT_S = 30.0


def read_all(namesrv: str, topic: str, n: int) -> list[bytes]:
    """Every body of ``topic``, read from the beginning until ``n`` have come."""
    got: list[bytes] = []
    with SyncPullConsumer(f"read-{topic}", namesrv) as c:
        c.assign(c.queues(topic))
        deadline = time.monotonic() + WAIT_S
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n} from {topic}"
            got += [m.body for m in c.poll_all(32, wait_ms=200)]
    return got


def test_sends_after_the_first_are_made_on_the_callers_thread(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        results = [p.send(new_message("Direct", b"m%d" % i)) for i in range(200)]
        assert p.direct_sends == 199  # the first looked the route up and greeted the broker
        assert p.lines(cluster.broker) == 1
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert len({r.msg_id for r in results}) == len({r.offset_msg_id for r in results}) == 200
    by_queue: dict[int, list[int]] = {}
    for r in results:
        by_queue.setdefault(r.queue.queue_id, []).append(r.queue_offset)
    assert all(offsets == sorted(set(offsets)) for offsets in by_queue.values())
    assert sorted(read_all(cluster.namesrv, "Direct", 200)) == sorted(b"m%d" % i
                                                                       for i in range(200))


def test_batches_are_made_on_the_callers_thread_too(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        with pytest.raises(ClientError, match="all of one topic"):
            p.send_batch([new_message("Batches", b"x"), new_message("Other", b"y")])
        results = [p.send_batch([new_message("Batches", b"%d-%d" % (b, i)) for i in range(10)])
                   for b in range(20)]
        assert p.direct_sends == 19
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    keys = [key for r in results for key in r.msg_id.split(",")]
    assert len(keys) == len(set(keys)) == 200
    assert sorted(read_all(cluster.namesrv, "Batches", 200)) == sorted(
        b"%d-%d" % (b, i) for b in range(20) for i in range(10))


def test_threads_send_at_once_each_on_a_line(cluster: Served) -> None:
    threads, each = 8, 50
    results: list[SendResult] = []
    with SyncProducer("PG", cluster.namesrv) as p:
        p.send(new_message("Threads", b"first"))
        start = threading.Barrier(threads)

        def sender(t: int) -> None:
            start.wait()
            results.extend(p.send(new_message("Threads", b"%d-%d" % (t, i)))
                           for i in range(each))

        workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(WAIT_S)
        assert 1 <= p.lines(cluster.broker) <= threads
        assert p.direct_sends == threads * each
    assert len({r.msg_id for r in results}) == threads * each
    assert len(read_all(cluster.namesrv, "Threads", threads * each + 1)) == threads * each + 1


def test_the_fault_table_records_a_direct_sends_latency(cluster: Served) -> None:
    clock = SlowAnswers()
    with SyncProducer("PG", cluster.namesrv, clock=clock) as p:
        p.send(new_message("Slow", b"first"))  # the loop's: route, greeting
        fast = p.send(new_message("Slow", b"fast"))
        faults = p._producer.faults
        assert faults.is_available(fast.queue.broker_name)
        clock.slow = True
        slow = p.send(new_message("Slow", b"slow"))
        clock.slow = False
        assert p.direct_sends == 2
        assert not faults.is_available(slow.queue.broker_name)  # skipped for 30 s
        # The only broker is still the one a send goes to, and a direct one.
        assert p.send(new_message("Slow", b"after")).status is SendStatus.SEND_OK
        assert p.direct_sends == 3


def long_poll(topic: str, queue_id: int, suspend_ms: int) -> Callable[[int], tuple[
        RemotingCommand, None]]:
    """A PULL_MESSAGE of an empty queue that the broker holds for ``suspend_ms``."""
    fields = {"consumerGroup": "lines", "topic": topic, "queueId": queue_id, "queueOffset": 0,
              "maxMsgNums": 1, "sysFlag": 6, "commitOffset": 0, "subscription": "*",
              "suspendTimeoutMillis": suspend_ms, "subVersion": 0}

    def make(opaque: int) -> tuple[RemotingCommand, None]:
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, fields)
        cmd.opaque = opaque
        return cmd, None

    return make


def test_a_broker_gets_at_most_the_pools_lines(cluster: Served) -> None:
    """Two long polls hold both lines the pool allows: a third request is told to go another
    way (None) at once, and a line given back is taken again."""
    with SyncProducer("PG", cluster.namesrv) as p:
        p.send(new_message("Held", b"x"))  # the topic, with an empty queue to poll
    lines = BlockingLines(timeout=10.0, security=None, max_per_broker=2)
    held = [threading.Thread(target=lines.request, args=(cluster.broker,
                                                         long_poll("Held", 1, 1500)))
            for _ in range(2)]
    try:
        for t in held:
            t.start()
        wait_for("both lines to be in use", lambda: lines.lines(cluster.broker) == 2)
        assert lines.request(cluster.broker, long_poll("Held", 1, 0)) is None
        for t in held:
            t.join(WAIT_S)
        answer = lines.request(cluster.broker, long_poll("Held", 1, 0))
        assert answer is not None and answer.code == ResponseCode.PULL_NOT_FOUND
        assert lines.lines(cluster.broker) == 2 and lines.answered == 3
    finally:
        lines.close()
    assert lines.lines(cluster.broker) == 0


def test_a_message_that_cannot_be_framed_leaves_the_line_as_it_was(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        p.send(new_message("Framed", b"x"))
        bad = new_message("Framed", b"y")
        bad.properties["k"] = "a\x01b"
        with pytest.raises(PropertyError, match="separator"):
            p.send(bad)
        assert p.send(new_message("Framed", b"z")).status is SendStatus.SEND_OK
        assert p.direct_sends == 1 and p.lines(cluster.broker) == 1


def test_a_refusal_on_a_line_fails_the_send_at_once(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("maxMessageSize=1024\n")
    with running_namesrv() as namesrv, running_broker(namesrv, tmp_path / "data", "--config",
                                                      str(conf)) as broker:
        with SyncProducer("PG", namesrv, retries=2) as p:
            p.send(new_message("Big", bytes(1024)))
            with pytest.raises(BrokerRefused) as refused:
                p.send(new_message("Big", bytes(2048)))
            assert p.direct_sends == 1
            assert p.send(new_message("Big", b"after")).status is SendStatus.SEND_OK
            assert p.direct_sends == 2
        assert broker.stop() == 0
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL


def test_a_stopped_broker_times_the_line_out_and_a_new_one_follows(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv, retries=1, send_timeout=0.5) as p:
        p.send(new_message("Stopped", b"before"))
        cluster.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(SendFailed, match="2 times"):
                p.send(new_message("Stopped", b"lost in time"))
        finally:
            cluster.proc.send_signal(signal.SIGCONT)
        assert p.lines(cluster.broker) == 0  # the timed-out line was closed, not given back
        # Skipped for its failures a while, the only broker is still the one tried.
        assert p.send(new_message("Stopped", b"after")).status is SendStatus.SEND_OK


def test_a_killed_master_is_failed_over_and_loses_nothing(tmp_path: Path) -> None:
    """Two broker groups, each a master and a slave: SIGKILL one master between sends and
    every send still succeeds, on the other group (the failed one is skipped for RocketMQ's
    ten minutes); with the master started again, every acknowledged message is read back."""
    acked: list[bytes] = []

    def send(p: SyncProducer, body: bytes) -> SendResult:
        result = p.send(new_message("Kill", body))
        acked.append(body)
        return result

    with running_cluster(tmp_path) as cluster, SyncProducer("PG", cluster.namesrv) as p:
        before = [send(p, b"a%d" % i) for i in range(40)]
        assert {r.queue.broker_name for r in before} == {"broker-a", "broker-b"}
        killed = cluster.masters["broker-a"].proc
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(WAIT_S) == -signal.SIGKILL
        after = [send(p, b"b%d" % i) for i in range(40)]
        assert {r.queue.broker_name for r in after} == {"broker-b"}
        assert p.lines(cluster.addr("broker-a")) == 0
        cluster.restart_master("broker-a")  # with what it acknowledged before the kill
        read = read_all(cluster.namesrv, "Kill", len(acked))
    assert sorted(set(read)) == sorted(acked)


# --- a line against a peer that answers what the test says ------------------------------------


@contextlib.contextmanager
def peer(answer: Callable[[socket.socket, RemotingCommand], None]) -> Iterator[str]:
    """A server on 127.0.0.1: each request it reads, on any connection, ``answer`` answers."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve_one(conn: socket.socket) -> None:
        # The line may close while an answer is still being written (what some tests do).
        with conn, contextlib.suppress(ConnectionError):
            decoder = FrameDecoder()
            while data := conn.recv(65536):
                decoder.feed(data)
                while (cmd := decoder.next_command()) is not None:
                    answer(conn, cmd)

    def serve() -> None:
        with contextlib.suppress(OSError):  # the server closed: no more connections
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def ping(opaque: int) -> tuple[RemotingCommand, None]:
    cmd = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    cmd.opaque = opaque
    return cmd, None


def sized_answer(request: RemotingCommand, frame_size: int) -> bytes:
    """The answer to ``request`` padded to a frame of exactly ``frame_size`` bytes."""
    empty = request.response().encode()
    return request.response(body=bytes(frame_size - len(empty))).encode()


def test_a_line_reads_an_answer_at_the_frame_limit_and_refuses_one_byte_more() -> None:
    with peer(lambda conn, cmd: conn.sendall(sized_answer(cmd, MAX_FRAME))) as addr:
        line = BlockingLine.open(addr, 10.0, None)
        assert len(line.request(ping).body) > MAX_FRAME - 200
        line.close()
    with peer(lambda conn, cmd: conn.sendall(sized_answer(cmd, MAX_FRAME + 1))) as addr:
        line = BlockingLine.open(addr, 10.0, None)
        with pytest.raises(ConnectionClosed, match="exceeds"):
            line.request(ping)
        assert line.closed


def test_a_line_skips_a_request_before_its_answer_and_fails_on_a_cut_answer() -> None:
    def asks_first(conn: socket.socket, cmd: RemotingCommand) -> None:
        conn.sendall(RemotingCommand.request(RequestCode.HEART_BEAT).encode()
                     + cmd.response().encode())

    with peer(asks_first) as addr:
        line = BlockingLine.open(addr, 10.0, None)
        assert line.request(ping).code == ResponseCode.SUCCESS
        assert line.request(ping).is_response  # the next request's own answer
        line.close()

    def cuts(conn: socket.socket, cmd: RemotingCommand) -> None:
        conn.sendall(cmd.response(body=b"x" * 100).encode()[:-10])
        conn.shutdown(socket.SHUT_WR)

    with peer(cuts) as addr:
        line = BlockingLine.open(addr, 10.0, None)
        with pytest.raises(ConnectionClosed, match="closed"):
            line.request(ping)


def test_a_line_skips_frames_left_behind_an_earlier_answer() -> None:
    """A peer that answers each request twice: the copy read with the answer is left in the
    line's decoder, and the next request must pass over it (an answer to another opaque) to
    its own answer, which comes after it."""
    answers: list[int] = []

    def twice(conn: socket.socket, cmd: RemotingCommand) -> None:
        frame = cmd.response(fields={"n": len(answers)}).encode()
        answers.append(cmd.opaque)
        conn.sendall(frame + frame)

    with peer(twice) as addr:
        line = BlockingLine.open(addr, 10.0, None)
        got = [line.request(ping) for _ in range(3)]
        line.close()
    assert [a.opaque for a in got] == answers and len(set(answers)) == 3
    assert [a.ext_fields["n"] for a in got] == ["0", "1", "2"]


def test_a_line_idle_too_long_is_closed_and_a_new_one_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conns: list[socket.socket] = []  # each connection the peer answered on, kept alive

    def answer(conn: socket.socket, cmd: RemotingCommand) -> None:
        if conn not in conns:
            conns.append(conn)
        conn.sendall(cmd.response().encode())

    with peer(answer) as addr:
        lines = BlockingLines(timeout=10.0, security=None)
        assert lines.request(addr, ping) is not None
        monkeypatch.setattr("evq.client.direct.IDLE_REUSE_S", 0.0)  # every idle line too old
        assert lines.request(addr, ping) is not None
        assert lines.request(addr, ping) is not None
        assert len(conns) == 3 and lines.lines(addr) == 1 and lines.answered == 3
        monkeypatch.undo()
        assert lines.request(addr, ping) is not None
        assert len(conns) == 3  # a fresh line is reused
        lines.close()
        assert lines.lines(addr) == 0


def test_a_line_whose_peer_never_answers_times_out() -> None:
    with peer(lambda conn, cmd: None) as addr:
        line = BlockingLine.open(addr, 0.3, None)
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="did not answer"):
            line.request(ping)
        assert 0.25 <= time.monotonic() - started < 5
        assert line.closed


def test_a_line_in_use_as_the_pool_closes_is_closed_when_its_request_ends() -> None:
    with peer(lambda conn, cmd: conn.sendall(cmd.response().encode())) as addr:
        lines = BlockingLines(timeout=10.0, security=None)

        def closing_meanwhile(opaque: int) -> tuple[RemotingCommand, None]:
            lines.close()  # another thread's shutdown, while this request is under way
            return ping(opaque)

        answer = lines.request(addr, closing_meanwhile)
        assert answer is not None and answer.code == ResponseCode.SUCCESS
        assert lines.lines(addr) == 0 and lines.answered == 1
        assert lines.request(addr, ping) is None  # a closed pool opens no line


def test_a_line_to_nowhere_fails_to_connect() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ConnectError, match="cannot connect"):
        BlockingLine.open(addr, 1.0, None)
