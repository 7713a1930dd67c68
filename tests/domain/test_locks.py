"""Orderly-consumption queue locks (evq.domain.locks; doc §5.12, seed 001)."""

from __future__ import annotations

import threading

import pytest
import structlog
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evq.domain.clock import ManualClock
from evq.domain.locks import LOCK_MAX_LIVE_S, RebalanceLockManager
from evq.domain.queues import MessageQueue

Q = [MessageQueue("orders", "broker-a", i) for i in range(4)]


@pytest.fixture
def locks(clock: ManualClock) -> RebalanceLockManager:
    return RebalanceLockManager(clock=clock)


def test_free_queues_are_granted(locks: RebalanceLockManager) -> None:
    assert locks.lock_batch("g", Q[:2], "c1") == set(Q[:2])
    assert locks.is_locked("g", Q[0], "c1")
    assert not locks.is_locked("g", Q[0], "c2")
    assert not locks.is_locked("g", Q[2], "c1")


def test_a_live_lock_of_another_client_is_refused(locks: RebalanceLockManager) -> None:
    locks.lock_batch("g", Q[:2], "c1")
    with structlog.testing.capture_logs() as logs:
        assert locks.lock_batch("g", Q[1:3], "c2") == {Q[2]}
    assert not locks.is_locked("g", Q[1], "c2")
    assert [e["event"] for e in logs] == ["queue_lock_refused"]
    assert logs[0]["held_by"] == {Q[1]: "c1"}


def test_groups_lock_independently(locks: RebalanceLockManager) -> None:
    locks.lock_batch("g1", Q[:1], "c1")
    assert locks.lock_batch("g2", Q[:1], "c2") == {Q[0]}


def test_a_lock_lives_60_seconds_after_its_last_refresh(
    locks: RebalanceLockManager, clock: ManualClock
) -> None:
    assert LOCK_MAX_LIVE_S == 60.0
    locks.lock_batch("g", Q[:1], "c1")
    clock.advance(60)
    assert locks.is_locked("g", Q[0], "c1")
    assert locks.lock_batch("g", Q[:1], "c2") == set()
    clock.advance(0.001)
    assert not locks.is_locked("g", Q[0], "c1")
    with structlog.testing.capture_logs() as logs:
        assert locks.lock_batch("g", Q[:1], "c2") == {Q[0]}
    assert logs[0]["event"] == "queue_lock_expired_taken_over"
    assert logs[0]["previous_owners"] == {Q[0]: "c1"}
    assert locks.is_locked("g", Q[0], "c2")


def test_relocking_refreshes(locks: RebalanceLockManager, clock: ManualClock) -> None:
    locks.lock_batch("g", Q[:1], "c1")
    for _ in range(5):
        clock.advance(20)  # C++ clients re-lock every 20 s
        assert locks.lock_batch("g", Q[:1], "c1") == {Q[0]}
    clock.advance(59)
    assert locks.lock_batch("g", Q[:1], "c2") == set()


def test_is_locked_does_not_refresh(locks: RebalanceLockManager, clock: ManualClock) -> None:
    locks.lock_batch("g", Q[:1], "c1")
    clock.advance(40)
    assert locks.is_locked("g", Q[0], "c1")
    clock.advance(21)
    assert not locks.is_locked("g", Q[0], "c1")


def test_an_expired_own_lock_is_granted_again(
    locks: RebalanceLockManager, clock: ManualClock
) -> None:
    locks.lock_batch("g", Q[:1], "c1")
    clock.advance(300)
    assert locks.lock_batch("g", Q[:1], "c1") == {Q[0]}
    assert locks.is_locked("g", Q[0], "c1")


def test_lifetime_is_configurable(clock: ManualClock) -> None:
    locks = RebalanceLockManager(clock=clock, max_live_s=5)
    locks.lock_batch("g", Q[:1], "c1")
    clock.advance(5.001)
    assert locks.lock_batch("g", Q[:1], "c2") == {Q[0]}


def test_unlock_releases_only_the_callers_locks(locks: RebalanceLockManager) -> None:
    locks.lock_batch("g", Q[:2], "c1")
    locks.lock_batch("g", Q[2:], "c2")
    assert locks.unlock_batch("g", Q, "c1") == set(Q[:2])
    assert locks.lock_batch("g", Q, "c3") == set(Q[:2])
    assert locks.is_locked("g", Q[3], "c2")
    assert locks.unlock_batch("nobody", Q, "c1") == set()


def test_concurrent_lockers_never_share_a_queue(locks: RebalanceLockManager) -> None:
    """Eight threads race for the same queues; each queue ends with exactly one holder."""
    queues = [MessageQueue("orders", "broker-a", i) for i in range(64)]
    barrier = threading.Barrier(8)
    won: dict[str, set[MessageQueue]] = {}

    def contend(cid: str) -> None:
        barrier.wait()
        won[cid] = set()
        for i in range(0, len(queues), 4):
            won[cid] |= locks.lock_batch("g", queues[i : i + 4], cid)

    threads = [threading.Thread(target=contend, args=(f"c{n}",)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holders = [cid for cid, qs in won.items() for _ in qs]
    assert len(holders) == len(queues)
    assert set().union(*won.values()) == set(queues)
    for cid, qs in won.items():
        assert all(locks.is_locked("g", q, cid) for q in qs)


class LockTableModel(RuleBasedStateMachine):
    """The lock manager against a dictionary model of RocketMQ's rules."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.locks = RebalanceLockManager(clock=self.clock, max_live_s=60)
        self.model: dict[MessageQueue, tuple[str, float]] = {}

    def live_owner(self, q: MessageQueue) -> str | None:
        held = self.model.get(q)
        if held is None or self.clock.monotonic() - held[1] > 60:
            return None
        return held[0]

    @rule(cid=st.sampled_from(["c1", "c2", "c3"]), qs=st.sets(st.sampled_from(Q)))
    def lock(self, cid: str, qs: set[MessageQueue]) -> None:
        expected = {q for q in qs if self.live_owner(q) in (None, cid)}
        assert self.locks.lock_batch("g", qs, cid) == expected
        for q in expected:
            self.model[q] = (cid, self.clock.monotonic())

    @rule(cid=st.sampled_from(["c1", "c2", "c3"]), qs=st.sets(st.sampled_from(Q)))
    def unlock(self, cid: str, qs: set[MessageQueue]) -> None:
        expected = {q for q in qs if q in self.model and self.model[q][0] == cid}
        assert self.locks.unlock_batch("g", qs, cid) == expected
        for q in expected:
            del self.model[q]

    @rule(seconds=st.sampled_from([1, 19.999, 20, 40, 59.999, 60, 61]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def holders_agree(self) -> None:
        for q in Q:
            for cid in ("c1", "c2", "c3"):
                assert self.locks.is_locked("g", q, cid) == (self.live_owner(q) == cid)


TestLockTableModel = LockTableModel.TestCase
