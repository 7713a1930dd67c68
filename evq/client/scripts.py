"""``evq produce`` and ``evq consume``: stdin lines to a topic, a topic to stdout.

For quick starts and shell pipelines; each is one asyncio program over :mod:`evq.client`.
Both ask the name server for the topic's route before anything else, so that an unreachable
name server is a failure at once rather than a consumer waiting forever or a producer with
nothing to send exiting 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine, Iterator
from typing import IO, Any

import attrs

from evq.client.consumer import ConsumeFrom, ConsumeResult, ConsumerOptions, PushConsumer
from evq.client.errors import ClientError, RouteNotFound
from evq.client.producer import Producer, SendResult
from evq.client.routes import Routes
from evq.domain.message import Message, new_message
from evq.net.security import ClientSecurity
from evq.net.transport import run, run_until_signal


@attrs.frozen(slots=True, kw_only=True)
class ProduceOptions:
    namesrv: str
    topic: str
    group: str = "evq-cli-producer"
    tags: str | None = None
    keys: str | None = None
    batch: int = 1
    security: ClientSecurity | None = None


@attrs.frozen(slots=True, kw_only=True)
class ConsumeOptions:
    namesrv: str
    topic: str
    group: str
    expression: str = "*"
    from_beginning: bool = False
    count: int | None = None
    idle_timeout: float | None = None
    json: bool = False
    wait_for_topic: bool = False
    security: ClientSecurity | None = None


def _batches(lines: IO[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for line in lines:
        batch.append(line.rstrip("\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


async def topic_known(namesrv: str, topic: str, security: ClientSecurity | None = None
                      ) -> bool:
    """Whether a name server routes ``topic``; raises :class:`~evq.client.errors.ClientError`
    when no name server answers."""
    routes = Routes(namesrv, security=security)
    try:
        await routes.lookup(topic)
    except RouteNotFound:
        return False
    finally:
        await routes.close()
    return True


def result_json(r: SendResult, count: int) -> dict[str, object]:
    return {"status": r.status.name, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
            "brokerName": r.queue.broker_name, "queueId": r.queue.queue_id,
            "queueOffset": r.queue_offset, "messages": count}


def produce(opts: ProduceOptions, lines: IO[str] = sys.stdin, out: IO[str] = sys.stdout) -> int:
    """Send each line (or each ``batch`` lines) and print one JSON result per send."""

    async def main() -> int:
        # unknown is fine: the send creates it
        await topic_known(opts.namesrv, opts.topic, opts.security)
        async with Producer(opts.group, opts.namesrv, security=opts.security) as producer:
            for lines_ in _batches(lines, opts.batch):
                msgs = [new_message(opts.topic, text.encode(), tags=opts.tags, keys=opts.keys)
                        for text in lines_]
                r = (await producer.send(msgs[0]) if len(msgs) == 1
                     else await producer.send_batch(msgs))
                out.write(json.dumps(result_json(r, len(msgs))) + "\n")
                out.flush()
        return 0

    return run(main())


async def first_of(*work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until one of them ends, then cancel the others; what ended first raises
    its exception here, if it had one."""
    tasks = [asyncio.create_task(w) for w in work]
    try:
        ended, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in ended:
        task.result()


def message_json(m: Message) -> dict[str, object]:
    return {"topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
            "msgId": m.uniq_key, "tags": m.tags, "keys": m.keys,
            "properties": m.properties, "body": m.payload().decode(errors="replace"),
            "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp,
            "reconsumeTimes": m.reconsume_times}


def consume(opts: ConsumeOptions, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr
            ) -> int:
    """Print what arrives, one line (or one JSON object) per message; stop after ``count``
    messages, ``idle_timeout`` seconds without one, or at SIGTERM or SIGINT, committing the
    offsets of what was printed on the way out whichever way it stops.  A topic no name
    server knows is an error (a consumer would wait for it in silence) unless
    ``wait_for_topic``, and then ``err`` says what it waits for."""

    async def main(stop: asyncio.Event) -> int:
        if not await topic_known(opts.namesrv, opts.topic, opts.security):
            if not opts.wait_for_topic:
                raise ClientError(f"topic {opts.topic!r} does not exist on {opts.namesrv} "
                                  "(--wait-for-topic waits for it)")
            err.write(f"evq: waiting for topic {opts.topic!r} to be created "
                      f"(name servers {opts.namesrv})\n")
            err.flush()
        seen = 0
        done = asyncio.Event()
        activity = asyncio.Event()  # a message arrived, or enough did

        async def on_message(msgs: list[Message]) -> ConsumeResult:
            nonlocal seen
            for m in msgs:
                if opts.count is not None and seen >= opts.count:
                    done.set()
                    activity.set()
                    return ConsumeResult.RECONSUME_LATER  # not ours to take: leave it
                line = json.dumps(message_json(m)) if opts.json else m.payload().decode(
                    errors="replace")
                out.write(line + "\n")
                out.flush()
                seen += 1
                activity.set()
            if opts.count is not None and seen >= opts.count:
                done.set()
            return ConsumeResult.CONSUME_SUCCESS

        options = ConsumerOptions(consume_concurrency=1, consume_from=(
            ConsumeFrom.FIRST_OFFSET if opts.from_beginning else ConsumeFrom.LAST_OFFSET))
        consumer = PushConsumer(opts.group, opts.namesrv, listener=on_message, options=options,
                                security=opts.security)
        consumer.subscribe(opts.topic, opts.expression)

        async def idle() -> None:
            while not done.is_set():
                activity.clear()
                try:
                    async with asyncio.timeout(opts.idle_timeout):
                        await activity.wait()
                except TimeoutError:
                    return

        async with consumer:
            # a consumer that failed raises here
            await first_of(idle(), consumer.wait(), stop.wait())
        return 0

    return run_until_signal(main)
