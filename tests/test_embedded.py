"""The embedded API a service uses in-process: produce, consume, retry, transactions, query."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evq
from evq.backends.config import StoreConfig
from evq.domain.broker import SendResult
from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.log import StoreUnavailable
from evq.domain.message import COMPRESS_OVER, Prop
from evq.embedded import Broker


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    b = evq.Broker.open(tmp_path / "data", store_config=StoreConfig(warm_segments=False,
                                                                  commitlog_segment_size=1 << 20),
                        clock=clock, background=False)
    yield b
    b.close()


def test_produce_and_consume_in_a_few_lines(broker: Broker) -> None:
    broker.create_topic("orders", queues=2)
    for i in range(6):
        broker.send("orders", f"order {i}", tags="created" if i % 2 else "paid",
                    keys=[f"o-{i}"], sharding_key=f"customer-{i % 3}")
    got = list(broker.subscribe("billing", "orders", "created", idle_timeout=0.01))
    assert sorted(m.payload() for m in got) == [b"order 1", b"order 3", b"order 5"]
    assert all(m.uniq_key and len(m.uniq_key) == 32 for m in got)
    assert list(broker.subscribe("billing", "orders", idle_timeout=0.01)) == []  # committed


def test_sharding_key_keeps_order_in_one_queue(broker: Broker) -> None:
    broker.create_topic("orders", queues=4)
    queues = {broker.send("orders", str(i), sharding_key="customer-7").queue_id
              for i in range(10)}
    assert len(queues) == 1
    (q,) = queues
    r = broker.pull("g", "orders", q, 0)
    assert [m.payload() for m in r.messages()] == [str(i).encode() for i in range(10)]


def test_sql92_subscription(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    for amount in (5, 50, 500):
        broker.send("t", b"x", properties={"amount": str(amount), "region": "eu"})
    got = list(broker.subscribe("g", "t", "amount BETWEEN 10 AND 100 AND region = 'eu'",
                                expression_type="SQL92", idle_timeout=0.01))
    assert [m.properties["amount"] for m in got] == ["50"]


def test_batch_delay_and_deliver_at(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    r = broker.send_batch("t", [b"a", b"b", b"c"])
    assert r.msg_id.count(",") == 2
    broker.send("t", b"later", delay_level=1)
    broker.send("t", b"at", deliver_at_ms=clock.now_ms() + 60_000)
    assert [m.body for m in broker.subscribe("g", "t", idle_timeout=0.01)] == [b"a", b"b", b"c"]
    clock.advance(2)
    broker.tick()
    assert [m.body for m in broker.subscribe("g", "t", idle_timeout=0.01)] == [b"later"]
    clock.advance(60)
    broker.tick()
    assert [m.body for m in broker.subscribe("g", "t", idle_timeout=0.01)] == [b"at"]


def test_reconsume_later_comes_back_through_the_retry_topic(broker: Broker,
                                                             clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    broker.send("t", b"flaky")
    (m,) = list(broker.subscribe("g", "t", idle_timeout=0.01))
    broker.reconsume_later("g", m)
    clock.advance(11)  # first retry: level 3 = 10 s
    broker.tick()
    (again,) = list(broker.subscribe("g", "t", idle_timeout=0.01))
    assert (again.body, again.topic, again.reconsume_times) == (b"flaky", "t", 1)


def test_transactional_send(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    assert broker.send_transactional("t", b"yes", "PG", lambda m: True) is not None
    assert broker.send_transactional("t", b"no", "PG", lambda m: False) is None
    assert [m.body for m in broker.subscribe("g", "t", idle_timeout=0.01)] == [b"yes"]


def test_query_by_key_and_by_msg_id(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    r = broker.send("t", b"findme", keys=["k-1", "k-2"])
    assert [m.body for m in broker.query_by_key("t", "k-2")] == [b"findme"]
    assert broker.view(r.msg_id).body == b"findme"


def test_reset_offsets_replays(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    start = clock.now_ms()
    broker.send("t", b"1")
    clock.advance(1)
    broker.send("t", b"2")
    assert len(list(broker.subscribe("g", "t", idle_timeout=0.01))) == 2
    assert broker.reset_offsets("g", "t", start + 500) == {0: 1}
    assert [m.body for m in broker.subscribe("g", "t", idle_timeout=0.01)] == [b"2"]


def test_data_survives_reopen_and_errors_are_clear(tmp_path: Path) -> None:
    with evq.Broker.open(tmp_path, store_config=StoreConfig(warm_segments=False)) as b:
        b.create_topic("t", queues=1)
        b.send("t", b"kept", properties={Prop.KEYS: "k"})
        with pytest.raises(BrokerError) as e:
            b.send("no such/topic", b"x")
        assert e.value.code is ResponseCode.SYSTEM_ERROR
    with evq.Broker.open(tmp_path, store_config=StoreConfig(warm_segments=False)) as b:
        assert [m.body for m in b.subscribe("g", "t", idle_timeout=0.01)] == [b"kept"]


def test_a_store_that_cannot_be_opened_says_where(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    data = tmp_path / "a-file" / "data"
    with pytest.raises(StoreUnavailable, match=re.escape(f"the store at {data}: Not a dir")):
        evq.Broker.open(data, background=False)


def test_the_subpackages_are_reachable_from_import_evq() -> None:
    """The README writes ``import evq`` then ``evq.admin.Admin(...)``."""
    assert evq.admin.Admin.__name__ == "Admin"
    assert evq.client.__name__ == "evq.client"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        evq.nope  # noqa: B018


def _wait_until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting until {what}")
        time.sleep(0.001)


def test_a_waiting_subscriber_wakes_for_a_send_from_another_thread(tmp_path: Path) -> None:
    """The subscriber listens to the log's arrivals only while it iterates (a producer-only
    broker has no listener): one blocked in its wait is woken by the send, not its timeout."""
    with evq.Broker.open(tmp_path / "data", store_config=StoreConfig(
            warm_segments=False, commitlog_segment_size=1 << 20), background=False) as b:
        b.create_topic("t", queues=2)
        got: list[bytes] = []

        def consume() -> None:
            for m in b.subscribe("g", "t", idle_timeout=30.0):
                got.append(m.payload())
                return

        consumer = threading.Thread(target=consume)
        started = time.monotonic()
        consumer.start()
        _wait_until("the consumer listens for arrivals", lambda: b._arrivals._watchers == 1)
        b.send("t", b"wake up")
        consumer.join(timeout=20.0)
        assert not consumer.is_alive() and time.monotonic() - started < 20.0
        assert got == [b"wake up"]
        assert b._arrivals._watchers == 0  # stopped listening with the iterator


_FIELD_TEXT = st.text(st.characters(codec="utf-8"), max_size=8)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=16) | st.text(max_size=4)
                    | st.sampled_from([b"z" * (COMPRESS_OVER - 1), "z" * COMPRESS_OVER]),
                    max_size=3),
    tags=st.none() | _FIELD_TEXT,
    keys=st.none() | _FIELD_TEXT | st.lists(_FIELD_TEXT, max_size=3),
    properties=st.none() | st.dictionaries(
        _FIELD_TEXT | st.sampled_from([Prop.UNIQ_KEY, Prop.WAIT, Prop.TAGS, Prop.DELAY]),
        _FIELD_TEXT, max_size=3),
    queue_id=st.integers(-1, 1),
)
def test_send_batch_stores_what_the_message_path_stores(
    broker: Broker, bodies: list[bytes | str], tags: str | None,
    keys: str | list[str] | None, properties: dict[str, str] | None, queue_id: int,
) -> None:
    """send_batch (the plain path when nothing routes) against the broker's Message path
    for the messages :meth:`Broker.messages` makes: the same records but for where the log
    put them and each UNIQ_KEY (a counter), or the same error."""
    broker.create_topic("t", queues=2)
    fields = {"tags": tags, "keys": keys, "properties": properties}

    def general() -> SendResult:
        batch = broker.messages("t", bodies, **fields)  # type: ignore[arg-type]
        if batch:
            batch[0].queue_id = queue_id
        return broker.core.send(batch)

    user_key = properties is not None and Prop.UNIQ_KEY in properties
    random.seed(7)
    expected = _stored_or_error(broker, general, user_key)
    random.seed(7)
    got = _stored_or_error(broker, lambda: broker.send_batch(
        "t", bodies, queue_id=queue_id, **fields), user_key)  # type: ignore[arg-type]
    assert got == expected


def _stored_or_error(broker: Broker, send: Callable[[], SendResult], user_key: bool) -> object:
    """The stored messages (a made UNIQ_KEY only as its length, properties in their stored
    order), or the type of the error raised."""
    try:
        result = send()
    except Exception as exc:  # the comparison is the point: any type must match
        return type(exc)
    out = []
    for a in result.appended:
        m = broker.core.view_by_offset(a.physical_offset)
        uniq = m.properties.pop(Prop.UNIQ_KEY, None)
        out.append((result.queue_id, m.topic, m.body, m.sysflag, m.flag, m.born_timestamp,
                    m.born_host, list(m.properties.items()),
                    uniq if user_key or uniq is None else len(uniq)))
    return result.status, out
