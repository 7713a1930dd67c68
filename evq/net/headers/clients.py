"""A client's membership of its groups, and a consumer giving a message back:
UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), NOTIFY_CONSUMER_IDS_CHANGED (40) and
CONSUMER_SEND_MSG_BACK (36)."""

from __future__ import annotations

from evq.net.headers import BOOL, INT, LONG, Header, header, wire


@header
class UnregisterClientRequest(Header):
    """A client leaving its producer group, its consumer group, or both."""

    client_id: str | None = wire("clientID", default=None)
    """Sent by every client, but the broker goes by the connection, not by this."""
    producer_group: str | None = wire("producerGroup", default=None, empty_as_absent=True)
    consumer_group: str | None = wire("consumerGroup", default=None, empty_as_absent=True)


@header
class GetConsumerListByGroupRequest(Header):
    consumer_group: str = wire("consumerGroup")


@header
class NotifyConsumerIdsChangedRequest(Header):
    consumer_group: str = wire("consumerGroup")


@header
class ConsumerSendMsgBackRequest(Header):
    offset: int = wire("offset", LONG)
    """The message's commit-log offset."""
    group: str = wire("group")
    delay_level: int = wire("delayLevel", INT, default=0)
    """0: the broker picks the level from the reconsume count; -1: straight to the DLQ."""
    origin_msg_id: str | None = wire("originMsgId", default=None)
    origin_topic: str | None = wire("originTopic", default=None)
    unit_mode: bool = wire("unitMode", BOOL, default=False)
    max_reconsume_times: int | None = wire("maxReconsumeTimes", INT, default=None)
    """Read from clients of V3_4_9 (version 121) on: older ones did not send it."""
