"""Rows to messages: what one write task sends.

A row has ``topic`` (or the ``topic`` option), ``body`` (binary or string) and, optionally,
``keys`` (array or space-separated string), ``tags``, ``properties`` (map), and either
``queueId`` (that queue) or ``shardingKey`` (the queue of that key, as an orderly send).
Rows without a queue choice go out in batches of ``batchSize`` per topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from evq.client.blocking import SyncProducer
from evq.domain.message import Message, new_message
from evq.spark.options import OptionError, SinkOptions


@attrs.frozen(slots=True)
class Outgoing:
    msg: Message
    queue_id: int | None = None
    sharding_key: str | None = None


def to_message(row: Mapping[str, Any], default_topic: str | None) -> Outgoing:
    topic = row.get("topic") or default_topic
    if not topic:
        raise OptionError("topic", "a row has no 'topic' column value and no 'topic' option "
                                   "names one")
    body = row.get("body")
    if body is None:
        raise OptionError("body", f"a row for {topic!r} has no 'body'")
    data = body.encode() if isinstance(body, str) else bytes(body)
    # a map column is a dict in a Row and a list of pairs in an Arrow batch's values
    props = {str(k): str(v) for k, v in dict(row.get("properties") or {}).items()}
    msg = new_message(str(topic), data, tags=row.get("tags"), keys=row.get("keys"),
                      properties=props)
    queue_id = row.get("queueId")
    sharding = row.get("shardingKey")
    return Outgoing(msg, int(queue_id) if queue_id is not None else None,
                    str(sharding) if sharding is not None else None)


def _batches(items: Iterable[Outgoing], size: int) -> Iterator[list[Outgoing]]:
    """Consecutive rows of one topic with no queue choice together; the others alone."""
    batch: list[Outgoing] = []
    for item in items:
        alone = item.queue_id is not None or item.sharding_key is not None
        if batch and (alone or len(batch) == size or batch[0].msg.topic != item.msg.topic):
            yield batch
            batch = []
        if alone:
            yield [item]
        else:
            batch.append(item)
    if batch:
        yield batch


def send_rows(opts: SinkOptions, rows: Iterable[Any]) -> int:
    """Send every row; the number sent.  Raises on the first failure (Spark retries the
    task, which resends: at least once)."""
    sent = 0
    producer = SyncProducer(opts.group, opts.namesrv,
                            security=opts.security.client_security())
    try:
        outgoing = (to_message(r.asDict(recursive=True) if hasattr(r, "asDict") else r,
                               opts.topic) for r in rows)
        for batch in _batches(outgoing, opts.batch):
            first = batch[0]
            if first.queue_id is not None:
                producer.send_to_queue(first.msg, first.queue_id)
            elif first.sharding_key is not None:
                producer.send_orderly(first.msg, first.sharding_key)
            elif len(batch) == 1:
                producer.send(first.msg)
            else:
                producer.send_batch([o.msg for o in batch])
            sent += len(batch)
    finally:
        producer.shutdown()
    return sent
