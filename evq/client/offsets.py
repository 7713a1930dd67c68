"""Consumer progress: the next offset to consume per queue, and where it is kept.

Clustering groups keep it on the broker (QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET): any
member can take a queue over where another left it.  Broadcasting consumers each read every
message, so each keeps its own progress in a local JSON file, replaced whole and durably
(:func:`evq.durable_fs.replace_durably`, in a worker thread: it waits for the disk) so that a
crash or a power cut leaves the old or the new table, never half of one or none::

    {"offsetTable": {"<topic>@<brokerName>@<queueId>": <next offset>, ...}}
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from evq import logs
from evq.client.errors import BrokerRefused, ClientError
from evq.client.routes import BrokerPool
from evq.domain.codes import ResponseCode
from evq.domain.queues import MessageQueue
from evq.durable_fs import replace_durably
from evq.net import fastjson
from evq.net.codes import RequestCode
from evq.net.headers.admin import ResetOffsetRequest
from evq.net.headers.offsets import (
    GetMaxOffsetRequest,
    GetMaxOffsetResponse,
    GetMinOffsetRequest,
    QueryConsumerOffsetRequest,
    QueryConsumerOffsetResponse,
    SearchOffsetRequest,
    UpdateConsumerOffsetRequest,
)
from evq.net.protocol import HeaderFieldError, RemotingCommand
from evq.net.transport import TransportError

log = logs.get_logger(__name__)

AddressOf = Callable[[str], str | None]
"""Where a broker name's offsets are kept (the master, or a slave while it is down), None when
unknown."""
Failed = Callable[[str], None]
"""Told of an address a request failed to reach, so that :data:`AddressOf` avoids it."""


class OffsetStore(Protocol):
    def get(self, queue: MessageQueue) -> int | None: ...

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None: ...

    def remove(self, queue: MessageQueue) -> None: ...

    async def read(self, queue: MessageQueue) -> int:
        """The stored offset, -1 when there is none."""
        ...

    async def persist(self, queues: Iterable[MessageQueue]) -> None: ...


class OffsetTable:
    """The in-memory part both stores share; pure."""

    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}

    def get(self, queue: MessageQueue) -> int | None:
        return self.offsets.get(queue)

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record progress; ``increase_only`` ignores a late, smaller commit (consume tasks
        finish out of order)."""
        old = self.offsets.get(queue)
        if old is None or not increase_only or offset > old:
            self.offsets[queue] = offset

    def remove(self, queue: MessageQueue) -> None:
        self.offsets.pop(queue, None)


class RemoteOffsets(OffsetTable):
    """A clustering group's offsets, kept on each queue's master (or, while it is down, on a
    slave, which hands them to the master when it returns)."""

    def __init__(self, group: str, pool: BrokerPool, address_of: AddressOf,
                 failed: Failed | None = None) -> None:
        super().__init__()
        self.group = group
        self._pool = pool
        self._address_of = address_of
        self._failed = failed

    def _addr(self, queue: MessageQueue) -> str:
        addr = self._address_of(queue.broker_name)
        if addr is None:
            raise ClientError(f"broker {queue.broker_name!r} has no address in the routes")
        return addr

    async def _invoke(self, queue: MessageQueue, code: RequestCode, fields: dict[str, str]
                      ) -> RemotingCommand:
        """The request to where ``address_of`` says; after a transport failure, reported to
        ``failed``, once more to where it says then (a slave when the master just died)."""
        addr = self._addr(queue)
        try:
            return await self._pool.invoke(addr, RemotingCommand.request(code, fields))
        except TransportError:
            if self._failed is None:
                raise
            self._failed(addr)
            if (again := self._addr(queue)) == addr:
                raise
            return await self._pool.invoke(again, RemotingCommand.request(code, fields))

    async def read(self, queue: MessageQueue) -> int:
        answer = await self._invoke(queue, RequestCode.QUERY_CONSUMER_OFFSET,
                                    QueryConsumerOffsetRequest.write(
                                        consumer_group=self.group, topic=queue.topic,
                                        queue_id=queue.queue_id))
        if answer.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if answer.code != ResponseCode.SUCCESS:
            raise BrokerRefused(answer.code, answer.remark, "query consumer offset")
        return QueryConsumerOffsetResponse.read(answer.ext_fields).offset

    async def persist(self, queues: Iterable[MessageQueue]) -> None:
        for queue in queues:
            offset = self.offsets.get(queue)
            if offset is None:
                continue
            try:
                answer = await self._invoke(queue, RequestCode.UPDATE_CONSUMER_OFFSET,
                                            UpdateConsumerOffsetRequest.write(
                                                consumer_group=self.group, topic=queue.topic,
                                                queue_id=queue.queue_id, commit_offset=offset))
                if answer.code != ResponseCode.SUCCESS:
                    raise BrokerRefused(answer.code, answer.remark, "update consumer offset")
            except (ClientError, TransportError) as exc:
                log.warning("offset not persisted", queue=queue, offset=offset, error=str(exc))


def queue_key(queue: MessageQueue) -> str:
    return f"{queue.topic}@{queue.broker_name}@{queue.queue_id}"


class LocalOffsets(OffsetTable):
    """A broadcasting consumer's offsets, in its own file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._saved: dict[str, int] = {}
        self._writing = asyncio.Lock()  # one write at a time: they share the temporary file
        if path.exists():
            try:
                self._saved = {str(k): int(v) for k, v in
                               json.loads(path.read_text())["offsetTable"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ClientError(f"unreadable offsets file {path}: {exc!r}") from None

    async def read(self, queue: MessageQueue) -> int:
        return self._saved.get(queue_key(queue), -1)

    async def persist(self, queues: Iterable[MessageQueue]) -> None:
        for queue in queues:
            if (offset := self.offsets.get(queue)) is not None:
                self._saved[queue_key(queue)] = offset
        text = json.dumps({"offsetTable": self._saved}, sort_keys=True)
        async with self._writing:
            await asyncio.to_thread(replace_durably, self.path, text.encode())


async def _queue_offset(pool: BrokerPool, addr: str, code: RequestCode,
                        fields: dict[str, str], what: str) -> int:
    answer = await pool.call(addr, RemotingCommand.request(code, fields), what)
    # the answers of GET_MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP are the same header
    return GetMaxOffsetResponse.read(answer.ext_fields).offset


async def max_offset(pool: BrokerPool, addr: str, queue: MessageQueue) -> int:
    """GET_MAX_OFFSET: where a consumer starting "from the last offset" begins."""
    return await _queue_offset(pool, addr, RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequest.write(
        topic=queue.topic, queue_id=queue.queue_id), "get max offset")


async def min_offset(pool: BrokerPool, addr: str, queue: MessageQueue) -> int:
    """GET_MIN_OFFSET: the oldest message the queue still holds."""
    return await _queue_offset(pool, addr, RequestCode.GET_MIN_OFFSET, GetMinOffsetRequest.write(
        topic=queue.topic, queue_id=queue.queue_id), "get min offset")


async def offset_for_time(pool: BrokerPool, addr: str, queue: MessageQueue,
                          timestamp_ms: int) -> int:
    """SEARCH_OFFSET_BY_TIMESTAMP: the first message stored at or after ``timestamp_ms``."""
    return await _queue_offset(pool, addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                               SearchOffsetRequest.write(
                                   topic=queue.topic, queue_id=queue.queue_id,
                                   timestamp=timestamp_ms),
                               "search offset by time")


def reset_offsets(body: bytes) -> dict[MessageQueue, int]:
    """The offsets of a ResetOffsetBody (RESET_CONSUMER_CLIENT_OFFSET, or the answer to
    INVOKE_BROKER_TO_RESET_OFFSET), in either form a broker writes: fastjson's map keyed by
    inline queue objects, or the array it sends C++ clients."""
    try:
        table = fastjson.loads(body.decode())["offsetTable"]
        if isinstance(table, list):
            return {MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"])):
                    int(e["offset"]) for e in table}
        return {q: int(o) for q, o in table.items() if isinstance(q, MessageQueue)}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ClientError(f"unreadable offset reset: {exc!r}") from None


def reset_notice(cmd: RemotingCommand, group: str) -> dict[MessageQueue, int]:
    """The offsets a RESET_CONSUMER_CLIENT_OFFSET sets for ``group``; nothing when it is for
    another group or unreadable (logged: a broker's oneway notice cannot be answered)."""
    try:
        if ResetOffsetRequest.read(cmd.ext_fields).group != group:
            return {}
        return reset_offsets(cmd.body)
    except (ClientError, HeaderFieldError) as exc:
        log.warning("offset reset ignored", group=group, error=str(exc))
        return {}
