"""Half messages, commit/rollback through op records, and the check-back of forgotten halves."""

from __future__ import annotations

import attrs
import pytest

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.clock import ManualClock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.log import AppendResult
from evq.domain.message import Message, Prop
from evq.domain.transactions import TransactionService
from tests.domain.conftest import OpenBroker, bodies, close, msg, topic


@attrs.define
class Producers:
    """The check-back port as a live producer group answers it: the answers are recorded."""

    asked: list[Message] = attrs.field(factory=list)
    online: bool = True

    def check_back(self, producer_group: str, half: Message) -> bool:
        if self.online:
            self.asked.append(half)
        return self.online


def half(b: Broker, body: bytes = b"tx", group: str = "PG", **props: str) -> AppendResult:
    m = msg("T", body, queue_id=1, **{Prop.TRAN_MSG: "true", Prop.PGROUP: group}, **props)
    m.born_timestamp = b.clock.now_ms()
    r = b.put([m])
    assert (r.topic, r.queue_id) == (tp.TRANS_HALF_TOPIC, 0)
    return r.appended[0]


def test_half_messages_are_invisible_until_committed(broker: Broker) -> None:
    topic(broker)
    tx = TransactionService(broker)
    h = half(broker)
    assert bodies(broker, "g", "T", 1) == []
    result = tx.end("PG", h.queue_offset, h.physical_offset, commit=True)
    assert result is not None and result.ok
    (real,) = broker.pull("g", "T", 1, 0).messages()
    assert real.body == b"tx"
    assert real.sysflag & sf.TRANSACTION_MASK == sf.TRANSACTION_COMMIT_TYPE
    assert real.prepared_transaction_offset == h.physical_offset
    assert Prop.TRAN_MSG not in real.properties and Prop.REAL_TOPIC not in real.properties


def test_rollback_and_unknown_store_nothing_visible(broker: Broker) -> None:
    topic(broker)
    tx = TransactionService(broker)
    h = half(broker)
    assert tx.end("PG", h.queue_offset, h.physical_offset, commit=None) is None
    assert tx.end("PG", h.queue_offset, h.physical_offset, commit=False) is None
    assert bodies(broker, "g", "T", 1) == []
    assert broker.log.bounds(tp.TRANS_OP_HALF_TOPIC, 0) == (0, 1)


def test_end_checks_group_and_offsets(broker: Broker) -> None:
    topic(broker)
    tx = TransactionService(broker)
    h = half(broker)
    cases = [("OTHER", h.queue_offset, h.physical_offset, "producer group wrong"),
             ("PG", h.queue_offset + 1, h.physical_offset, "state table offset wrong"),
             ("PG", h.queue_offset, h.physical_offset + 1, "Find prepared")]
    for group, qo, phys, remark in cases:
        with pytest.raises(BrokerError) as e:
            tx.end(group, qo, phys, commit=True)
        assert e.value.code is ResponseCode.SYSTEM_ERROR and remark in e.value.remark


def test_a_second_answer_does_not_commit_twice(broker: Broker) -> None:
    topic(broker)
    tx = TransactionService(broker)
    h = half(broker)
    tx.end("PG", h.queue_offset, h.physical_offset, commit=True)
    assert tx.end("PG", h.queue_offset, h.physical_offset, commit=True) is None
    assert len(bodies(broker, "g", "T", 1)) == 1


def test_checker_asks_after_the_timeout_and_honours_the_answer(
    broker: Broker, clock: ManualClock
) -> None:
    topic(broker)
    producers = Producers()
    tx = TransactionService(broker, producers)
    h = half(broker)
    assert tx.check(clock.now_ms()).checked == 0  # younger than transactionTimeOut (6 s)
    clock.advance(7)
    assert tx.check(clock.now_ms()).checked == 1
    (asked,) = producers.asked
    assert asked.properties[Prop.TRANSACTION_CHECK_TIMES] == "1"
    assert asked.properties[Prop.TRAN_PREPARED_QUEUE_OFFSET] == str(h.queue_offset)
    tx.end("PG", asked.queue_offset, asked.commit_log_offset, commit=True)
    assert bodies(broker, "g", "T", 1) == [b"tx"]
    clock.advance(70)
    assert tx.check(clock.now_ms()).checked == 0  # committed: never asked again
    # A late answer for the first half must not commit it a second time.
    assert tx.end("PG", h.queue_offset, h.physical_offset, commit=True) is None
    assert bodies(broker, "g", "T", 1) == [b"tx"]


def test_checker_runs_on_the_tick_interval(broker: Broker, clock: ManualClock) -> None:
    topic(broker)
    producers = Producers()
    TransactionService(broker, producers)
    half(broker)
    clock.advance(30)
    broker.tick()
    assert producers.asked == []
    clock.advance(31)
    broker.tick()
    assert len(producers.asked) == 1


def test_immunity_time_property_delays_the_first_check(broker: Broker, clock: ManualClock
                                                       ) -> None:
    topic(broker)
    producers = Producers()
    tx = TransactionService(broker, producers)
    half(broker, **{Prop.CHECK_IMMUNITY_TIME_IN_SECONDS: "60"})
    clock.advance(30)
    assert tx.check(clock.now_ms()).waiting == 1
    clock.advance(31)
    assert tx.check(clock.now_ms()).checked == 1


def test_unanswered_halves_are_discarded_after_check_max(
    open_broker: OpenBroker, clock: ManualClock
) -> None:
    b = open_broker(transaction_check_max=3)
    topic(b)
    producers = Producers(online=False)
    tx = TransactionService(b, producers)
    half(b)
    reports = []
    for _ in range(5):
        clock.advance(61)
        reports.append(tx.check(clock.now_ms()))
    assert [r.checked for r in reports] == [1, 1, 1, 0, 0]
    assert [r.discarded for r in reports] == [0, 0, 0, 1, 0]
    assert b.log.bounds(tp.TRANS_CHECK_MAX_TIME_TOPIC, 0) == (0, 1)


def test_rollback_is_remembered_across_restart(open_broker: OpenBroker, clock: ManualClock
                                               ) -> None:
    b = open_broker()
    topic(b)
    tx = TransactionService(b)
    h = half(b)
    pending = half(b, b"pending")
    tx.end("PG", h.queue_offset, h.physical_offset, commit=False)
    close(b)
    b = open_broker()
    producers = Producers()
    tx = TransactionService(b, producers)
    clock.advance(7)
    assert tx.check(clock.now_ms()).checked == 1
    assert [m.body for m in producers.asked] == [b"pending"]
    assert producers.asked[0].properties[Prop.TRAN_PREPARED_QUEUE_OFFSET] == str(
        pending.queue_offset)


def test_transaction_messages_can_be_rejected(open_broker: OpenBroker) -> None:
    b = open_broker(reject_transaction_message=True)
    topic(b)
    with pytest.raises(BrokerError) as e:
        half(b)
    assert e.value.code is ResponseCode.NO_PERMISSION
