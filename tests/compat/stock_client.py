"""Drive the stock RocketMQ C++ client (PyPI ``rocketmq`` 0.4.4) in a child process.

The C++ library runs its own threads and may abort on protocol surprises, so the tests never
load it into the pytest process: they run this module and read one JSON object per line.

    python -m tests.compat.stock_client produce NAMESRV TOPIC MODE COUNT
    python -m tests.compat.stock_client consume NAMESRV TOPIC GROUP MODEL ORDERLY FAIL SECONDS
    python -m tests.compat.stock_client pull NAMESRV TOPIC GROUP
    python -m tests.compat.stock_client produce-forever NAMESRV TOPIC TAG

``produce-forever`` sends until it is killed, through broker crashes: every answer and every
failure is one line, so a chaos test can tell exactly what was acknowledged.  ``consume`` runs
until SIGTERM (a test stops it once it has seen what it waits for), or at most SECONDS, then
shuts the consumer down cleanly.

With ``STOCK_ACCESS_KEY`` and ``STOCK_SECRET_KEY`` in the environment, every client signs its
requests (``set_session_credentials``, channel ALIYUN), as an application on an ACL cluster.

A crash of the C++ library prints every thread's Python stack to stderr (:mod:`faulthandler`),
so a failing test shows where the library was.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rocketmq.client import (  # type: ignore[import-untyped]
    Message,
    MessageModel,
    Producer,
    PullConsumer,
    PushConsumer,
    RecvMessage,
)

from tests.compat.bodies import body_of

_out = threading.Lock()
T = TypeVar("T")


def emit(obj: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def with_credentials(client: Any) -> Any:
    """``client`` with the environment's session credentials set, when there are some."""
    access_key = os.environ.get("STOCK_ACCESS_KEY")
    if access_key:
        client.set_session_credentials(access_key, os.environ["STOCK_SECRET_KEY"], "ALIYUN")
    return client


def message(topic: str, i: int) -> Message:
    m = Message(topic)
    m.set_tags(f"T{i % 3}")
    m.set_keys(f"k{i}")
    m.set_property("seq", str(i))
    m.set_body(body_of(i))
    return m


def text(value: str | bytes | None) -> str | None:
    """The wrapper hands some fields back as bytes, some as str."""
    return value.decode() if isinstance(value, bytes) else value


def received(msg: RecvMessage) -> dict[str, Any]:
    seq = text(msg.get_property("seq")) or ""
    # A numbered message's body is body_of(seq); a produce-forever one's is its seq.
    expected = body_of(int(seq)) if seq.isdigit() else seq.encode()
    return {"topic": text(msg.topic), "tags": text(msg.tags), "keys": text(msg.keys),
            "queue": msg.queue_id, "offset": msg.queue_offset,
            "reconsume": msg.reconsume_times, "seq": seq, "body_ok": msg.body == expected}


ROUTE_RACE_RETRIES = 5
SEND_TIMEOUT_MS = 1000
"""produce-forever's send timeout (see :func:`produce_forever`)."""


def routed(send: Callable[..., T], *args: Any) -> T:
    """Run one send, again if the C++ client lost its own connect race.

    When a producer first learns a topic's route, the client's heartbeat thread connects to
    the broker while the send thread asks for the same transport; the send thread gives up on
    the transport lock at once (its log says "get timed_mutex timeout"), burns its retries in
    a millisecond and throws "No route info". An application would catch and resend, so the
    driver does the same rather than let the client's race fail a broker test.
    """
    for _ in range(ROUTE_RACE_RETRIES - 1):
        try:
            return send(*args)
        except Exception as exc:  # the wrapper raises its own untyped exception classes
            if "No route info" not in str(exc):
                raise
            time.sleep(0.2)
    return send(*args)


def produce(namesrv: str, topic: str, mode: str, count: int) -> None:
    producer = with_credentials(Producer(f"PG-{mode}", timeout=5000))
    producer.set_namesrv_addr(namesrv)
    producer.start()
    done = threading.Semaphore(0)
    try:
        if mode == "batch":
            r = routed(producer.send_batch, [message(topic, i) for i in range(count)])
            emit({"i": -1, "status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
        for i in range(count if mode != "batch" else 0):
            m = message(topic, i)
            if mode == "sync":
                r = routed(producer.send_sync, m)
            elif mode == "delay":
                m.set_delay_time_level(2)  # 5 s with the default levels
                r = routed(producer.send_sync, m)
            elif mode == "orderly":
                r = routed(producer.send_orderly, m, i % 2)
            elif mode == "oneway":
                routed(producer.send_oneway, m)
                emit({"i": i, "status": "ONEWAY"})
                continue
            else:
                def ok(r: Any, i: int = i) -> None:
                    emit({"i": i, "status": r.status.name, "msg_id": r.msg_id,
                          "offset": r.offset})
                    done.release()

                def failed(exc: Exception, i: int = i) -> None:
                    emit({"i": i, "status": "EXCEPTION", "error": str(exc)})
                    done.release()

                routed(producer.send_async, m, ok, failed)
                continue
            emit({"i": i, "status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
        if mode == "async":
            for _ in range(count):
                done.acquire(timeout=10)
    finally:
        producer.shutdown()


def produce_forever(namesrv: str, topic: str, tag: str) -> None:
    """Synchronous sends of ``TAG-i`` (as the ``seq`` property and the body) until killed; a
    failed send is reported and the next one follows (as an application that logs and goes
    on would), so a broker down for a while costs sends, not the producer.

    The send timeout is short: the C++ client does not notice its connection closed under a
    send in flight when the broker is SIGKILLed, so that send is answered by the timeout
    alone (and retried on the restarted broker), and a chaos round lasts at least this long.
    1 s is still hundreds of times a send's round trip on a loaded machine; a send that does
    time out is retried by the client or reported as failed, and a chaos test counts both
    (as duplicates, as failed sends) without failing on them."""
    producer = with_credentials(Producer(f"PG-{tag}", timeout=SEND_TIMEOUT_MS))
    producer.set_namesrv_addr(namesrv)
    producer.start()
    i = 0
    while True:
        seq = f"{tag}-{i}"
        m = Message(topic)
        m.set_keys(seq)
        m.set_property("seq", seq)
        m.set_body(seq.encode())
        try:
            r = producer.send_sync(m)
        except Exception as exc:  # the wrapper raises its own untyped exception classes
            emit({"seq": seq, "status": "EXCEPTION", "error": str(exc)[:200]})
            time.sleep(0.05)
        else:
            emit({"seq": seq, "status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
        i += 1


def consume(namesrv: str, topic: str, group: str, model: str, orderly: bool, fail: bool,
            seconds: float) -> None:
    """A push consumer until SIGTERM or for ``seconds``, under an instance name of its own
    (its pid).

    The library keeps broadcasting offsets in ``~/.rocketmq_offsets/<ip>@<instance
    name>/<group>/offsets.Json``, without the pid its client id carries: under the default
    name (``DEFAULT``) every member on one host shares one file, and members starting at the
    same moment race to create its directory (``LocalFileOffsetStore`` checks, then creates,
    and fails its ``start`` when another process created it in between; the wrapper then
    segfaults destroying the half-started consumer).  Members on one host need names of their
    own, as the Java client's default instance name (the pid) gives them."""
    consumer = with_credentials(PushConsumer(group, orderly=orderly, message_model=(
        MessageModel.BROADCASTING if model == "broadcasting" else MessageModel.CLUSTERING)))
    consumer.set_instance_name(f"stock-{os.getpid()}")
    consumer.set_namesrv_addr(namesrv)
    failed: set[str] = set()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def on_message(msg: RecvMessage) -> None:
        """Returning consumes the message; raising asks for it again later (the wrapper's
        only way to answer RECONSUME_LATER)."""
        seq = text(msg.get_property("seq"))
        if fail and seq == "0" and seq not in failed:
            failed.add(seq)
            emit({"failed": seq})
            raise RuntimeError("failing message 0 once, on purpose")
        emit(received(msg))

    consumer.subscribe(topic, on_message)
    consumer.start()
    emit({"started": True})
    # In slices: the signal may land on one of the library's threads, and then only the main
    # thread's next bytecode runs the handler, not a wait it is blocked in.
    deadline = time.monotonic() + seconds
    while not stop.wait(0.2) and time.monotonic() < deadline:
        pass
    consumer.shutdown()


def pull(namesrv: str, topic: str, group: str) -> None:
    consumer = with_credentials(PullConsumer(group))
    consumer.set_namesrv_addr(namesrv)
    consumer.start()
    try:
        for msg in consumer.pull(topic):
            emit(received(msg))
    finally:
        consumer.shutdown()


def main(argv: list[str]) -> None:
    action, namesrv, topic, *rest = argv
    if action == "produce":
        produce(namesrv, topic, rest[0], int(rest[1]))
    elif action == "consume":
        group, model, orderly, fail, seconds = rest
        consume(namesrv, topic, group, model, orderly == "1", fail == "1", float(seconds))
    elif action == "pull":
        pull(namesrv, topic, rest[0])
    elif action == "produce-forever":
        produce_forever(namesrv, topic, rest[0])
    else:
        raise SystemExit(f"unknown action {action!r}")
    emit({"done": True})


if __name__ == "__main__":
    faulthandler.enable()
    main(sys.argv[1:])
