"""The message queue: one (topic, broker, queue id) triple.

It is the unit everything per-queue is keyed by: rebalance hands queues to consumers, orderly
consumers lock them on the broker, offsets are committed per group and queue.  Clients name a
queue by all three fields (``{"topic", "brokerName", "queueId"}`` in JSON bodies), so the broker
name is part of the identity even inside one broker.

Ordering follows the fields in RocketMQ's order (topic, broker name, queue id).  Python compares
strings by code point where Java compares UTF-16 code units; the two differ only between
characters above U+FFFF and those in U+E000..U+FFFF, which legal topic and broker names never
contain.  Code that must sort exactly as Java does (rebalance) uses its own key.
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int
