"""Consumer send-back: retry topics at growing delay levels, then the dead-letter queue."""

from __future__ import annotations

from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.clock import ManualClock
from evq.domain.groups import SubscriptionGroupConfig
from evq.domain.message import Prop
from evq.domain.retry import dead_letters, resend_dead_letter, send_back
from evq.domain.schedule import DelayService
from tests.domain.conftest import msg, topic


def test_send_back_goes_to_the_retry_topic_at_level_3_plus_reconsumes(
    broker: Broker, clock: ManualClock
) -> None:
    topic(broker)
    DelayService(broker)
    original = broker.put([msg("T", b"job", keys="k1")]).appended[0]
    r = send_back(broker, "G", original.physical_offset)
    assert r is not None and (r.topic, r.queue_id) == (tp.SCHEDULE_TOPIC, 2)  # level 3
    clock.advance(9)
    broker.tick()
    assert broker.pull("G", tp.retry_topic("G"), 0, 0).messages() == []
    clock.advance(2)
    broker.tick()
    (retry,) = broker.pull("G", tp.retry_topic("G"), 0, 0).messages()
    assert retry.reconsume_times == 1
    assert retry.properties[Prop.RETRY_TOPIC] == "T"
    assert retry.properties[Prop.ORIGIN_MESSAGE_ID] == original.msg_id
    again = send_back(broker, "G", retry.commit_log_offset)
    assert again is not None and again.queue_id == 3  # level 4 for the second retry
    stored = broker.view_by_offset(again.appended[0].physical_offset)
    assert stored.properties[Prop.ORIGIN_MESSAGE_ID] == original.msg_id  # kept, not replaced


def test_after_max_reconsume_times_it_is_dead_lettered(broker: Broker) -> None:
    topic(broker)
    broker.create_group(SubscriptionGroupConfig(group_name="G", retry_max_times=2))
    offset = broker.put([msg("T", b"poison")]).appended[0].physical_offset
    for _ in range(2):
        r = send_back(broker, "G", offset)
        assert r is not None and r.topic == tp.SCHEDULE_TOPIC
        offset = r.appended[0].physical_offset  # send back the parked copy again
    r = send_back(broker, "G", offset)
    assert r is not None and r.topic == tp.dlq_topic("G")
    (dead,) = dead_letters(broker, "G")
    assert dead.message.body == b"poison" and dead.message.reconsume_times == 3


def test_negative_delay_level_dead_letters_at_once(broker: Broker) -> None:
    topic(broker)
    offset = broker.put([msg("T")]).appended[0].physical_offset
    r = send_back(broker, "G", offset, delay_level=-1)
    assert r is not None and r.topic == tp.dlq_topic("G")


def test_groups_without_retry_queues_drop_send_backs(broker: Broker) -> None:
    topic(broker)
    broker.create_group(SubscriptionGroupConfig(group_name="G", retry_queue_nums=0))
    offset = broker.put([msg("T")]).appended[0].physical_offset
    assert send_back(broker, "G", offset) is None


def test_direct_send_to_retry_topic_past_the_limit_is_dead_lettered(broker: Broker) -> None:
    m = msg(tp.retry_topic("G"))
    m.reconsume_times = 16
    r = broker.put([m])
    assert r.topic == tp.dlq_topic("G")
    m = msg(tp.retry_topic("G"))
    m.reconsume_times = 2
    assert broker.put([m], max_reconsume_times=2).topic == tp.dlq_topic("G")


def test_dead_letters_can_be_resent_to_their_topic(broker: Broker) -> None:
    topic(broker)
    offset = broker.put([msg("T", b"again")]).appended[0].physical_offset
    send_back(broker, "G", offset, delay_level=-1)
    r = resend_dead_letter(broker, "G", 0)
    assert r.ok and r.topic == "T"
    resent = broker.view_by_offset(r.appended[0].physical_offset)
    assert (resent.body, resent.reconsume_times) == (b"again", 0)
