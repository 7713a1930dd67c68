"""The sampled store times in front of the offset-for-time search
(:class:`evq.backends.time_samples.TimeSamples`).

Whatever a queue goes through (growth, expiry at the front, a cut-back and different records
written again), the samples must answer what a binary search over the queue answers; and after
the first lookup has read the samples, a lookup must read a few records at any length.
"""

from __future__ import annotations

import bisect
import math

from hypothesis import given
from hypothesis import strategies as st

from evq.backends.time_samples import STRIDE, TimeSamples
from tests.backends.test_time_search import counted


def expected(times: list[int], lo: int, hi: int, target: int) -> int:
    """A binary search over ``[lo, hi)``, -1 (no record) sorting first."""
    return bisect.bisect_left(times, target, lo, hi)


ops = st.one_of(
    st.tuples(st.just("grow"), st.integers(1, 3 * STRIDE), st.integers(0, 2)),
    st.tuples(st.just("pause"), st.integers(1, 10**6), st.just(0)),
    st.tuples(st.just("expire"), st.integers(1, 2 * STRIDE), st.just(0)),
    st.tuples(st.just("cut"), st.integers(1, 2 * STRIDE), st.just(0)),
)


@given(st.lists(st.tuples(ops, st.integers(-5, 2 * 10**6)), max_size=40), st.integers(0, 2000))
def test_answers_what_a_binary_search_answers_through_growth_expiry_and_cuts(
    steps: list[tuple[tuple[str, int, int], int]], first: int
) -> None:
    """The queue lives at offsets ``[first + lo, first + len(times))``; expiry turns the
    front into -1 (records gone, entries kept) and moves ``lo``; a cut drops the tail and
    clears the samples, as the backends do, before later growth writes new times there."""
    samples = TimeSamples()
    times: list[int] = []
    lo = 0
    clock = 1_700_000_000_000
    for (op, n, per_ms), target_delta in steps:
        if op == "grow":
            for i in range(n):
                times.append(clock)
                clock += 1 if per_ms == 0 or i % (per_ms + 1) == 0 else 0
        elif op == "pause":
            clock += n
        elif op == "expire":
            gone = min(len(times), lo + n)
            times[lo:gone] = [-1] * (gone - lo)
            lo = gone if times[gone:] else lo
        else:
            del times[max(lo, len(times) - n):]
            samples.clear()
        target = clock - target_delta
        store_time, probes = counted(lambda qo: times[qo - first])
        got = samples.first_at_or_after(first + lo, first + len(times), target, store_time)
        assert got == first + expected(times, lo, len(times), target)
        assert all(first <= qo < first + len(times) for qo in probes)


def search_bound(entries: int) -> int:
    """The most records :func:`~evq.backends.rules.first_at_or_after` reads over ``entries``
    (tests/backends/test_time_search.py holds it to this)."""
    return 2 * math.ceil(math.log2(entries + 1)) + 3


@given(st.integers(1, 20), st.data())
def test_a_lookup_reads_a_few_records_at_any_length_the_first_one_too(
    per_ms: int, data: st.DataObject
) -> None:
    """A queue written at a steady ``per_ms`` records a millisecond with a pause now and
    then.  Every lookup, the first included, reads at most a search among the samples, the two
    samples bracketing the answer and a search within one stride: logarithmic in the length
    (15 samples at 10^7 entries), where reading every sample on the first lookup took 39,063
    reads at 10^7."""
    t0 = 1_700_000_000_000

    def timeline(qo: int) -> int:
        return t0 + qo // per_ms + 5_000 * (qo // 1_000_003)

    for length in (10**5, 10**6, 10**7):
        samples = TimeSamples()
        store_time, probes = counted(timeline)
        bound = search_bound(length // STRIDE + 1) + 2 + search_bound(STRIDE) + 1
        for _ in range(5):
            target = data.draw(st.integers(t0 - 10, timeline(length - 1) + 10))
            probes.clear()
            got = samples.first_at_or_after(0, length, target, store_time)
            assert timeline(got - 1) < target if got > 0 else True
            assert got == length or timeline(got) >= target
            assert len(probes) <= bound


def test_samples_once_read_are_not_read_again() -> None:
    """The same lookup twice: the second reads no sample (no offset on a stride), only the
    stride it lands in."""
    t0 = 1_700_000_000_000
    store_time, probes = counted(lambda qo: t0 + qo)
    samples = TimeSamples()
    target = t0 + 123_456
    assert samples.first_at_or_after(0, 10**6, target, store_time) == 123_456
    probes.clear()
    assert samples.first_at_or_after(0, 10**6, target, store_time) == 123_456
    assert probes and not [qo for qo in probes if qo % STRIDE == 0]
    assert len(probes) <= search_bound(STRIDE)
