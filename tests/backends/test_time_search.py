"""The offset-for-time search every backend shares (:func:`evq.backends.rules.first_at_or_after`).

It must answer exactly what a binary search answers over any non-decreasing run of store times
(with -1 for offsets that have no record), cost few record reads on a steadily written queue
whatever its length, and never much more than a binary search on a badly shaped one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from evq.backends.rules import first_at_or_after


def counted(times: Callable[[int], int]) -> tuple[Callable[[int], int], list[int]]:
    probes: list[int] = []

    def store_time(qo: int) -> int:
        probes.append(qo)
        return times(qo)

    return store_time, probes


@st.composite
def queues(draw: st.DrawFn) -> tuple[int, list[int]]:
    """(first offset, store times from it): a leading run of -1 (expired), then times that
    never decrease, with bursts of one millisecond and long pauses."""
    missing = draw(st.integers(0, 5))
    steps = draw(st.lists(st.one_of(st.just(0), st.integers(1, 3), st.integers(1, 10**6)),
                          max_size=300))
    t = draw(st.integers(0, 2**41))
    times = [-1] * missing
    for step in steps:
        t += step
        times.append(t)
    return draw(st.integers(0, 10**9)), times


@given(queues(), st.data())
def test_answers_what_a_binary_search_answers(queue: tuple[int, list[int]],
                                              data: st.DataObject) -> None:
    first, times = queue
    known = [t for t in times if t >= 0]
    target = data.draw(st.one_of(st.integers(-5, 2**42), st.sampled_from(known or [0]),
                                 st.sampled_from([k + 1 for k in known] or [0])))
    store_time, probes = counted(lambda qo: times[qo - first])
    got = first_at_or_after(first, first + len(times), target, store_time)
    assert got == first + bisect.bisect_left(times, target)
    assert all(first <= qo < first + len(times) for qo in probes)
    # Never more than about twice a binary search's reads (plus the two end probes).
    assert len(probes) <= 2 * math.ceil(math.log2(len(times) + 1)) + 3


@given(st.integers(1, 10**7), st.integers(1, 50), st.data())
def test_a_steadily_written_queue_costs_a_few_reads_at_any_length(
    length: int, per_ms: int, data: st.DataObject
) -> None:
    """``per_ms`` records share each millisecond, as a queue written at a steady rate."""
    t0 = 1_700_000_000_000
    target = data.draw(st.integers(t0 - 10, t0 + length // per_ms + 10))
    store_time, probes = counted(lambda qo: t0 + qo // per_ms)
    got = first_at_or_after(0, length, target, store_time)
    expected = min(max(0, (target - t0) * per_ms), length)
    assert got == expected
    # Bounded by how far the estimate can miss (one millisecond's records), not by the length:
    # a binary search over 10**7 entries reads 24.
    assert len(probes) <= 2 * math.ceil(math.log2(per_ms + 1)) + 4


def test_an_empty_range_reads_nothing() -> None:
    store_time, probes = counted(lambda qo: 0)
    assert first_at_or_after(7, 7, 123, store_time) == 7
    assert probes == []
