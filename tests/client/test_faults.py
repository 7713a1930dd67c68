"""The latency fault-tolerance table and queue selection (seed 001), by an injected clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evq.client.faults import (
    LATENCY_MAX_MS,
    NOT_AVAILABLE_MS,
    LatencyFaultTolerance,
    not_available_ms,
    select_queue,
)
from evq.domain.clock import ManualClock
from evq.domain.queues import MessageQueue

brokers = st.sampled_from(["b0", "b1", "b2"])
queue_sets = st.lists(st.builds(MessageQueue, st.just("T"), brokers, st.integers(0, 7)),
                      min_size=1, max_size=12, unique=True).map(sorted)


def test_bands_of_seed_001() -> None:
    assert [not_available_ms(x) for x in (0, 49, 50, 99, 100, 549)] == [0] * 6
    assert [not_available_ms(x) for x in LATENCY_MAX_MS] == list(NOT_AVAILABLE_MS)
    assert not_available_ms(10**9) == 600_000


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_slower_is_never_skipped_for_less_time(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert not_available_ms(lo) <= not_available_ms(hi)


def test_a_failure_skips_the_broker_ten_minutes() -> None:
    clock = ManualClock()
    faults = LatencyFaultTolerance(clock)
    faults.update("a", 10)
    faults.update("b", 0, failed=True)
    assert faults.is_available("a") and not faults.is_available("b")
    assert faults.is_available("never-seen")
    clock.advance(599.9)
    assert not faults.is_available("b")
    clock.advance(0.1)
    assert faults.is_available("b")


def test_least_bad_is_the_first_to_come_back() -> None:
    clock = ManualClock()
    faults = LatencyFaultTolerance(clock)
    assert faults.least_bad() is None
    faults.update("slow", 600)  # 30 s
    faults.update("dead", 0, failed=True)  # 600 s
    assert faults.least_bad() == "slow"


@given(queue_sets, st.integers(0, 100), st.sets(brokers), st.none() | brokers)
def test_selection_avoids_bad_brokers_when_it_can(
    queues: list[MessageQueue], start: int, down: set[str], last_failed: str | None
) -> None:
    faults = LatencyFaultTolerance(ManualClock())
    for b in down:
        faults.update(b, 0, failed=True)
    q = select_queue(queues, start, faults, last_failed)
    assert q in queues
    names = {x.broker_name for x in queues}
    good = names - down - {last_failed}
    if good:
        assert q.broker_name in good
    elif names - {last_failed}:
        assert q.broker_name != last_failed


@given(queue_sets)
def test_round_robin_over_healthy_queues(queues: list[MessageQueue]) -> None:
    faults = LatencyFaultTolerance(ManualClock())
    assert [select_queue(queues, i, faults) for i in range(len(queues))] == queues


reports = st.lists(st.tuples(st.integers(0, 700_000), brokers, st.integers(0, 20_000),
                             st.booleans()), max_size=30)


@given(reports, queue_sets, st.integers(0, 100), st.none() | brokers)
def test_the_table_answers_as_the_clock_and_bands_say(
    steps: list[tuple[int, str, int, bool]], queues: list[MessageQueue], start: int,
    last_failed: str | None,
) -> None:
    """Healthy reports skip the clock, and availability still reads as seed 001 puts it: a
    broker is available once the clock reaches its last report's time plus its band's skip."""
    clock = ManualClock()
    faults = LatencyFaultTolerance(clock)
    back_at: dict[str, int] = {}
    for advance_ms, broker, latency, failed in steps:
        clock.advance(advance_ms / 1000)
        faults.update(broker, latency, failed=failed)
        back_at[broker] = clock.ms + not_available_ms(30_000 if failed else latency)
        for b in ("b0", "b1", "b2"):
            assert faults.is_available(b) == (b not in back_at or clock.ms >= back_at[b])
    ring = [queues[(start + i) % len(queues)] for i in range(len(queues))]
    usable = [q for q in ring if q.broker_name != last_failed
              and (q.broker_name not in back_at or clock.ms >= back_at[q.broker_name])]
    chosen = select_queue(queues, start, faults, last_failed)
    if usable:
        assert chosen == usable[0]
