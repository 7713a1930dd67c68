"""Consumer send-back, retry topics and the dead-letter queue (RocketMQ §5.4 behaviour)."""

from __future__ import annotations

import random

import attrs

from evq import logs
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.log import GetStatus
from evq.domain.message import Message, Prop
from evq.domain.record import decode, offset_msg_id

log = logs.get_logger(__name__)

FIRST_RETRY_LEVEL = 3  # the first redelivery waits level 3 (10 s with the default levels)


def send_back(
    broker: Broker,
    group: str,
    physical_offset: int,
    *,
    delay_level: int = 0,
    max_reconsume_times: int | None = None,
) -> SendResult | None:
    """A consumer gives a message back (CONSUMER_SEND_MSG_BACK).

    The message goes to ``%RETRY%<group>`` at ``delay_level`` (0 = ``3 + reconsume times``),
    or to ``%DLQ%<group>`` once it has been reconsumed ``retryMaxTimes`` times (or when
    ``delay_level`` < 0).  Returns None when the group has retries switched off.
    """
    config = broker.ensure_group(group)
    if config.retry_queue_nums <= 0:
        return None
    original = broker.view_by_offset(physical_offset)
    props = dict(original.properties)
    props.setdefault(Prop.RETRY_TOPIC, original.topic)
    props.setdefault(Prop.ORIGIN_MESSAGE_ID, offset_msg_id(original.store_host, physical_offset))
    props.pop(Prop.WAIT, None)
    limit = config.retry_max_times if max_reconsume_times is None else max_reconsume_times
    retry = Message(
        topic=tp.retry_topic(group), body=original.body, flag=original.flag, properties=props,
        sysflag=original.sysflag, born_timestamp=original.born_timestamp,
        born_host=original.born_host, reconsume_times=original.reconsume_times + 1,
    )
    if original.reconsume_times >= limit or delay_level < 0:
        stored = broker.to_dlq(retry, group)
    else:
        broker.ensure_topic(retry.topic, config.retry_queue_nums)
        retry.queue_id = random.randrange(config.retry_queue_nums)
        stored = broker.delayed(retry, delay_level or FIRST_RETRY_LEVEL + original.reconsume_times)
    (result,) = broker.store([stored])
    return SendResult(result.status, stored.topic, stored.queue_id, (result,))


@attrs.frozen(slots=True)
class DeadLetter:
    queue_offset: int
    message: Message


def dead_letters(broker: Broker, group: str, offset: int = 0, max_count: int = 32
                 ) -> list[DeadLetter]:
    """Messages in the group's DLQ from ``offset``."""
    r = broker.log.read(tp.dlq_topic(group), 0, offset, max_count=max_count)
    if r.status is not GetStatus.FOUND:
        return []
    return [DeadLetter(qo, decode(v)) for v, qo in zip(r.records, r.queue_offsets, strict=True)]


def resend_dead_letter(broker: Broker, group: str, queue_offset: int) -> SendResult:
    """Send a dead letter again to the topic it was first sent to, as a fresh message (the
    reconsume count starts over)."""
    found = dead_letters(broker, group, queue_offset, 1)
    if not found or found[0].queue_offset != queue_offset:
        raise BrokerError(ResponseCode.NO_MESSAGE,
                          f"no dead letter at offset {queue_offset} of {tp.dlq_topic(group)}")
    m = found[0].message
    props = dict(m.properties)
    topic = props.get(Prop.RETRY_TOPIC) or m.topic
    for name in (Prop.DELAY, Prop.REAL_TOPIC, Prop.REAL_QID, Prop.CLUSTER):
        props.pop(name, None)
    again = Message(topic=topic, body=m.body, flag=m.flag, properties=props, queue_id=-1,
                    sysflag=m.sysflag, born_timestamp=broker.clock.now_ms(),
                    born_host=m.born_host)
    log.info("dead_letter_resent", group=group, queue_offset=queue_offset, topic=topic)
    return broker.send(again)
