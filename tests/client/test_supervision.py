"""The clients' background loops under supervision, against a real name server and broker.

Each fault is an exception no loop expects, raised by code a user supplies (an allocation
strategy, flow limits, a subclass's heartbeat): it must be logged with its traceback and the
loop must go on (heartbeats continue, rebalancing still moves queues, every message is still
pulled), a loop that keeps failing must fail its client loudly, and shutdown must still stop
every loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
from structlog.testing import capture_logs

from evq.client.consumer import ConsumeFrom, ConsumerOptions, PushConsumer
from evq.client.errors import BackgroundFailed
from evq.client.flow_control import Exceeded, FlowLimits
from evq.client.process_queue import ProcessQueue
from evq.client.producer import Producer
from evq.client.pull_consumer import PullConsumer
from evq.client.supervision import SupervisionPolicy
from evq.domain.message import new_message
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import Averagely
from tests.client.conftest import Served
from tests.client.inbox import Inbox, produce

QUICK = SupervisionPolicy(max_failures=3, first_backoff_s=0.01, max_backoff_s=0.05)
FAST = ConsumerOptions(rebalance_s=0.2, heartbeat_s=0.1, consume_from=ConsumeFrom.FIRST_OFFSET,
                       supervision=QUICK)
WAIT_S = 20.0

Logs = list[dict[str, Any]]


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail after :data:`WAIT_S` naming ``what``."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def failures(logs: Logs, loop: str) -> list[dict[str, Any]]:
    """The ``background_step_failed`` records of ``loop`` (pull loops: its prefix)."""
    return [e for e in logs if e["event"] == "background_step_failed"
            and e["loop"].startswith(loop)]


def broke(entry: dict[str, Any]) -> bool:
    """The record carries the unexpected exception itself, for its traceback."""
    exc = entry.get("exc_info")
    return isinstance(exc, RuntimeError) and "broke" in str(exc) and entry["log_level"] == "error"


@attrs.define
class FlakyStrategy:
    """Allocates as AVG, but its next ``to_fail`` calls raise: a user's strategy with a bug
    (set once the consumer has started, whose first rounds must work)."""

    to_fail: int = 0
    failed: int = 0

    @property
    def name(self) -> str:
        return "FLAKY"

    def assign(self, group: str, current_id: str, queues: Sequence[MessageQueue],
               ids: Sequence[str]) -> list[MessageQueue]:
        if self.to_fail:
            self.to_fail -= 1
            self.failed += 1
            raise RuntimeError("strategy broke")
        return Averagely().assign(group, current_id, queues, ids)


class FailingHeartbeats(PushConsumer):
    """Its periodic heartbeat raises ``failing`` times, then works."""

    failing = 2
    beats = 0

    async def heartbeat(self) -> None:
        if self.failing:
            self.failing -= 1
            raise RuntimeError("heartbeat hook broke")
        await super().heartbeat()
        self.beats += 1


@attrs.frozen(slots=True, kw_only=True)
class FlakyLimits(FlowLimits):
    """Flow limits whose check raises on its first ``failing`` calls, whichever queue asks."""

    failing: list[int] = attrs.field(factory=lambda: [2])

    def exceeded(self, pq: ProcessQueue, *, orderly: bool) -> Exceeded | None:
        if self.failing[0]:
            self.failing[0] -= 1
            raise RuntimeError("flow limits broke")
        return super().exceeded(pq, orderly=orderly)


async def test_heartbeats_go_on_after_an_unexpected_failure(cluster: Served) -> None:
    c = FailingHeartbeats("GS1", cluster.namesrv, listener=Inbox(), options=FAST)
    c.subscribe("S1")
    with capture_logs() as logs:
        async with c:
            await until(lambda: c.beats >= 3, "heartbeats after the failed ones")
    failed = failures(logs, "heartbeat")
    assert len(failed) == 2 and all(broke(e) for e in failed), logs
    assert not [e for e in logs if e["event"] == "background_loop_gave_up"]


async def test_a_pull_loop_goes_on_after_an_unexpected_failure(cluster: Served) -> None:
    bodies = [b"%d" % i for i in range(12)]
    await produce(cluster.namesrv, "S2", bodies)  # over every queue of the topic
    inbox = Inbox()
    c = PushConsumer("GS2", cluster.namesrv, listener=inbox,
                     options=attrs.evolve(FAST, flow_limits=FlakyLimits()))
    c.subscribe("S2")
    with capture_logs() as logs:
        async with c:
            await inbox.until(len(bodies))
    assert sorted(inbox.payloads()) == sorted(bodies)
    failed = failures(logs, "pull ")
    assert len(failed) == 2 and all(broke(e) for e in failed), logs


async def test_rebalancing_goes_on_after_an_unexpected_failure(cluster: Served) -> None:
    await produce(cluster.namesrv, "S3", [b"x"])
    strategy = FlakyStrategy()
    a = PushConsumer("GS3", cluster.namesrv, listener=Inbox(),
                     options=attrs.evolve(FAST, strategy=strategy), client_id="cid-a")
    b = PushConsumer("GS3", cluster.namesrv, listener=Inbox(), options=FAST, client_id="cid-b")
    for c in (a, b):
        c.subscribe("S3")

    def owned(c: PushConsumer) -> int:
        return len([q for q in c.assigned if q.topic == "S3"])

    with capture_logs() as logs:
        async with a:
            assert owned(a) == 4
            strategy.to_fail = 2
            await until(lambda: strategy.failed == 2, "the strategy's two failures")
            async with b:  # a takes the new member into account: its loop still runs
                await until(lambda: owned(a) == 2 and owned(b) == 2, "an even split")
    failed = failures(logs, "rebalance")
    assert len(failed) == 2 and all(broke(e) for e in failed), logs


async def test_a_loop_that_keeps_failing_fails_the_push_consumer(cluster: Served) -> None:
    await produce(cluster.namesrv, "S4", [b"x"])
    strategy = FlakyStrategy()
    c = PushConsumer("GS4", cluster.namesrv, listener=Inbox(),
                     options=attrs.evolve(FAST, strategy=strategy))
    c.subscribe("S4")
    with capture_logs() as logs:
        await c.start()
        strategy.to_fail = 1000
        try:
            async with asyncio.timeout(WAIT_S):
                with pytest.raises(BackgroundFailed, match="'rebalance' failed 3 times") as e:
                    await c.wait()
        finally:
            await c.shutdown()
    assert isinstance(e.value.__cause__, RuntimeError)
    (gave_up,) = [e for e in logs if e["event"] == "background_loop_gave_up"]
    assert gave_up["loop"] == "rebalance" and gave_up["log_level"] == "error"
    assert len(failures(logs, "rebalance")) == 3


async def test_a_loop_that_keeps_failing_fails_the_pull_consumer(cluster: Served) -> None:
    await produce(cluster.namesrv, "S5", [b"x"])
    strategy = FlakyStrategy()
    pc = PullConsumer("GS5", cluster.namesrv, rebalance_s=0.2, strategy=strategy,
                      supervision=QUICK)
    pc.subscribe("S5")
    async with pc:
        assert len(pc.assignment) == 4
        strategy.to_fail = 1000
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(BackgroundFailed, match="'rebalance'"):
                while True:
                    await pc.poll_all(wait_ms=50)


async def test_a_loop_that_keeps_failing_fails_the_producer(cluster: Served) -> None:
    class BrokenHeartbeats(Producer):
        broken = False

        async def heartbeat(self, *, only_new: bool = False) -> None:
            if self.broken:
                raise RuntimeError("heartbeat hook broke")
            await super().heartbeat(only_new=only_new)

    async with BrokenHeartbeats("PS6", cluster.namesrv, heartbeat_s=0.05,
                                supervision=QUICK) as p:
        await p.send(new_message("S6", b"before"))
        p.broken = True
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(BackgroundFailed, match="'heartbeat'"):
                while True:
                    await p.send(new_message("S6", b"after"))
                    await asyncio.sleep(0.01)


async def test_shutdown_stops_every_loop_without_a_failure(cluster: Served) -> None:
    await produce(cluster.namesrv, "S7", [b"x"])
    inbox = Inbox()
    c = PushConsumer("GS7", cluster.namesrv, listener=inbox, options=FAST)
    c.subscribe("S7")
    with capture_logs() as logs:
        async with c:
            await inbox.until(1)
            waiting = asyncio.create_task(c.wait())
            await asyncio.sleep(0)
            assert not waiting.done()
        await waiting  # returns: the consumer stopped, nothing failed
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("push consumer GS7")]
    assert left == []
    assert not [e for e in logs if e["log_level"] == "error"], logs
