"""What every processor of one broker server shares."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import attrs

from evq.domain.broker import Broker
from evq.domain.log import PutStatus
from evq.domain.membership import GroupMembership
from evq.domain.message import Host
from evq.embedded import Broker as Engine
from evq.net import execution
from evq.net.broker.stats import BrokerStats
from evq.net.durable import DurableWaker
from evq.net.long_polling import PullHolds
from evq.net.loop_lag import LoopLag
from evq.net.protocol import RemotingCommand
from evq.net.read_budget import ReadBudget
from evq.net.refusals import Refusals
from evq.net.transport import Connection, Reply

_T = TypeVar("_T")


class LaneHandler(Protocol):
    """The compiled send lane (evq/net/broker/send_lane.pyx): a send handler whose counters
    are C integers, free on the hot path, which the runtime info reads."""

    @property
    def taken(self) -> int: ...

    @property
    def handed_over(self) -> int: ...

    def __call__(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply] | Reply: ...


@attrs.define(slots=True)
class BrokerContext:
    engine: Engine
    membership: GroupMembership
    holds: PullHolds
    loop: asyncio.AbstractEventLoop
    durable: DurableWaker | None = None  # SYNC_FLUSH: acknowledge sends once on disk
    topics_changed: Callable[[], None] = lambda: None  # re-register with the name servers
    # SYNC_MASTER: (log end offset, timeout s) -> whether a slave holds it (see evq.ha.master)
    replicated: Callable[[int, float], Awaitable[PutStatus]] | None = None
    # Per client connection: (language, version) from its heartbeat; the connections whose
    # close already drops them from the membership tables.
    clients: weakref.WeakKeyDictionary[object, tuple[int, int]] = attrs.field(
        factory=weakref.WeakKeyDictionary)
    loop_lag: LoopLag = attrs.field(factory=LoopLag)  # watched while the broker serves
    stats: BrokerStats = attrs.field(factory=lambda: BrokerStats(boot_ms=0))
    # Sends' puts, in arrival order, the large ones off the loop (see evq.net.execution).
    puts: execution.InTurn = attrs.field(factory=execution.InTurn)
    # The compiled send lane answering single sends, where it is built (evq.net.broker.send).
    send_lane: LaneHandler | None = None
    # The remoting server's connections turned away at its bound, and its read budget.
    refusals: Refusals | None = None
    read_budget: ReadBudget | None = None

    @property
    def core(self) -> Broker:
        return self.engine.core

    async def blocking(self, fn: Callable[..., _T], *args: object) -> _T:
        """Run a call that writes metadata (SQL commit, log flush) off the event loop
        (see :mod:`evq.net.execution`)."""
        return await execution.blocking(fn, *args)


@functools.lru_cache(maxsize=4096)
def parse_host(address: str) -> Host:
    """``"ip:port"`` from a connection or a client, as a record's host field.  Cached: a
    connection's every send names the same peer."""
    host, _, port = address.rpartition(":")
    try:
        return (host.strip("[]") or "0.0.0.0", int(port))
    except ValueError:
        return ("0.0.0.0", 0)
