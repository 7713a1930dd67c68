"""Delay levels and deliver-at timers: parked, released on time, in order, across restarts."""

from __future__ import annotations

import pytest

from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.clock import ManualClock
from evq.domain.delay import DelayLevels
from evq.domain.message import Prop
from evq.domain.schedule import DelayService, TimerService
from tests.domain.conftest import OpenBroker, bodies, close, msg, topic


def test_delay_levels_parse_rocketmq_units() -> None:
    levels = DelayLevels.parse("1s 2m 3h 1d")
    assert levels.delays_ms == (1000, 120_000, 10_800_000, 86_400_000)
    assert (levels.clamp(9), levels.queue_of(2), levels.delay_ms(1)) == (4, 1, 1000)
    assert DelayLevels.parse().delay_ms(18) == 7_200_000
    for bad in ("", "1x", "s", "1.5s"):
        with pytest.raises(ValueError):
            DelayLevels.parse(bad)


def test_delayed_messages_arrive_after_their_level_in_order(
    broker: Broker, clock: ManualClock
) -> None:
    topic(broker)
    service = DelayService(broker)
    for i in range(5):
        broker.put([msg("T", bytes([i]), queue_id=1, DELAY="2")])  # level 2 = 5 s
        clock.advance(0.5)
    broker.tick()
    assert bodies(broker, "g", "T", 1) == []
    clock.advance(3.6)  # stored at +0, +0.5 and +1 s: due by +6.1 s
    broker.tick()
    assert bodies(broker, "g", "T", 1) == [b"\0", b"\1", b"\2"]
    clock.advance(10)
    broker.tick()
    assert bodies(broker, "g", "T", 1) == [bytes([i]) for i in range(5)]
    assert service.backlog()[2] == 0
    delivered = broker.pull("g", "T", 1, 0).messages()[0]
    assert Prop.DELAY not in delivered.properties
    assert delivered.properties[Prop.REAL_TOPIC] == "T"  # left in place, as RocketMQ does


def test_delay_levels_run_independently(broker: Broker, clock: ManualClock) -> None:
    topic(broker)
    DelayService(broker)
    broker.put([msg("T", b"slow", DELAY="3")])  # 10 s
    broker.put([msg("T", b"fast", DELAY="1")])  # 1 s
    clock.advance(1.2)
    broker.tick()
    assert bodies(broker, "g", "T", 0) == [b"fast"]
    clock.advance(9)
    broker.tick()
    assert bodies(broker, "g", "T", 0) == [b"fast", b"slow"]


def test_delay_progress_survives_restart_without_loss_or_duplicates(
    open_broker: OpenBroker, clock: ManualClock
) -> None:
    b = open_broker()
    topic(b)
    DelayService(b)
    for i in range(4):
        b.put([msg("T", bytes([i]), DELAY="1")])
    clock.advance(1.5)
    b.tick()
    b.put([msg("T", b"later", DELAY="1")])
    close(b)
    b = open_broker()
    DelayService(b)
    clock.advance(1.5)
    b.tick()
    assert bodies(b, "g", "T", 0) == [b"\0", b"\1", b"\2", b"\3", b"later"]


def test_deliver_at_timer_releases_in_time_order(broker: Broker, clock: ManualClock) -> None:
    topic(broker)
    timers = TimerService(broker)
    now = clock.now_ms()
    for body, at in ((b"c", now + 30_000), (b"a", now + 10_000), (b"b", now + 20_000)):
        r = broker.put([msg("T", body, **{Prop.START_DELIVER_TIME: str(at)})])
        assert r.topic == tp.TIMER_TOPIC
    assert timers.pending == 3
    clock.advance(15)
    broker.tick()
    assert bodies(broker, "g", "T", 0) == [b"a"]
    clock.advance(20)
    broker.tick()
    assert bodies(broker, "g", "T", 0) == [b"a", b"b", b"c"]
    assert Prop.START_DELIVER_TIME not in broker.pull("g", "T", 0, 0).messages()[0].properties


def test_deliver_at_in_the_past_is_delivered_at_once(broker: Broker, clock: ManualClock
                                                     ) -> None:
    topic(broker)
    r = broker.put([msg("T", **{Prop.START_DELIVER_TIME: str(clock.now_ms() - 1)})])
    assert r.topic == "T"


def test_timers_survive_restart(open_broker: OpenBroker, clock: ManualClock) -> None:
    b = open_broker()
    topic(b)
    TimerService(b)
    now = clock.now_ms()
    for i, delay in enumerate((5_000, 60_000, 1_000, 30_000)):
        b.put([msg("T", bytes([i]), **{Prop.START_DELIVER_TIME: str(now + delay)})])
    clock.advance(10)
    b.tick()  # delivers 2 (1 s) and 0 (5 s); 1 and 3 stay parked below and above them
    assert sorted(bodies(b, "g", "T", 0)) == [b"\0", b"\2"]
    close(b)
    b = open_broker()
    timers = TimerService(b)
    assert timers.pending == 2
    clock.advance(60)
    b.tick()
    assert sorted(bodies(b, "g", "T", 0)) == [b"\0", b"\1", b"\2", b"\3"]
