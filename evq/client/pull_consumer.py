"""The pull consumer: the application chooses queues and offsets and asks for messages.

Offsets it commits go to the broker like a clustering group's (:class:`RemoteOffsets`), so a
push consumer of the same group, or a later pull consumer, continues from them.
"""

from __future__ import annotations

from collections.abc import Iterable

from evq.client.errors import ClientError, NotStarted
from evq.client.offsets import RemoteOffsets, max_offset
from evq.client.pulling import PullResult, Subscription, parse_pull, pull_request
from evq.client.routes import BrokerPool, Routes
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.queues import MessageQueue


class PullConsumer:
    def __init__(self, group: str, namesrv: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.group = group
        self._namesrv = namesrv
        self._clock = clock
        self._assigned: dict[MessageQueue, int] = {}
        self._routes: Routes | None = None
        self._pool: BrokerPool | None = None
        self._offsets: RemoteOffsets | None = None

    async def start(self) -> None:
        self._routes = Routes(self._namesrv, self._clock)
        self._pool = BrokerPool(clock=self._clock)
        self._offsets = RemoteOffsets(self.group, self._pool, self._routes.master)

    async def shutdown(self) -> None:
        if self._routes is not None and self._pool is not None:
            await self.commit()
            await self._pool.close()
            await self._routes.close()
        self._routes = self._pool = self._offsets = None

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of ``topic``."""
        routes, _, _ = self._started()
        return (await routes.route(topic)).subscribe_queues()

    async def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume these queues from the group's committed offsets (0 when none)."""
        _, _, offsets = self._started()
        self._assigned = {}
        for q in queues:
            await self._addr(q)
            stored = await offsets.read(q)
            self._assigned[q] = max(stored, 0)

    @property
    def assignment(self) -> dict[MessageQueue, int]:
        """Assigned queues and the offset the next :meth:`poll` of each reads from."""
        return dict(self._assigned)

    def seek(self, queue: MessageQueue, offset: int) -> None:
        if queue not in self._assigned:
            raise ClientError(f"{queue} is not assigned")
        self._assigned[queue] = offset

    async def seek_to_end(self, queue: MessageQueue) -> None:
        _, pool, _ = self._started()
        self.seek(queue, await max_offset(pool, await self._addr(queue), queue))

    async def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, *,
                   expression: str = "*", wait_ms: int = 0) -> PullResult:
        """Messages of ``queue`` from ``offset``; ``wait_ms`` > 0 long-polls that long."""
        _, pool, _ = self._started()
        sub = Subscription(queue.topic, expression)
        cmd = pull_request(self.group, queue, offset, sub, max_nums=max_nums, suspend_ms=wait_ms)
        answer = await pool.invoke(await self._addr(queue), cmd, wait_ms / 1000 + 3.0)
        return parse_pull(answer, sub)

    async def poll(self, queue: MessageQueue, max_nums: int = 32, *, wait_ms: int = 0
                   ) -> PullResult:
        """Pull an assigned queue from its position and move the position past the result."""
        if queue not in self._assigned:
            raise ClientError(f"{queue} is not assigned")
        result = await self.pull(queue, self._assigned[queue], max_nums, wait_ms=wait_ms)
        self._assigned[queue] = result.next_begin_offset
        return result

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store ``offsets`` (default: every assigned queue's position) on the brokers."""
        _, _, store = self._started()
        chosen = self._assigned if offsets is None else offsets
        for q, offset in chosen.items():
            store.update(q, offset, increase_only=False)
        await store.persist(chosen)

    async def committed(self, queue: MessageQueue) -> int:
        """The group's stored offset of ``queue``, -1 when none."""
        _, _, store = self._started()
        await self._addr(queue)
        return await store.read(queue)

    async def _addr(self, queue: MessageQueue) -> str:
        routes, _, _ = self._started()
        addr = (await routes.route(queue.topic)).master(queue.broker_name)
        if addr is None:
            raise ClientError(f"broker {queue.broker_name!r} has no master")
        return addr

    def _started(self) -> tuple[Routes, BrokerPool, RemoteOffsets]:
        if self._routes is None or self._pool is None or self._offsets is None:
            raise NotStarted(f"pull consumer {self.group!r} is not started")
        return self._routes, self._pool, self._offsets
