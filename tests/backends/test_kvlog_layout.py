"""The key-value layout: keys sort the way the range scans of kvlog.store assume."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evq.backends.kvlog import layout as lay
from tests.strategies import codec_topics, keys, non_negative_int32s, non_negative_int64s

store_times = st.integers(0, 2**62)


@given(a=non_negative_int64s, b=non_negative_int64s)
def test_log_keys_sort_as_offsets(a: int, b: int) -> None:
    assert (lay.log_key(a) < lay.log_key(b)) == (a < b)
    assert lay.log_key(a) < lay.LOG_KEY_END


@given(topic=codec_topics, queue_id=non_negative_int32s, other=codec_topics,
       a=non_negative_int64s, b=non_negative_int64s)
def test_queue_keys_group_by_queue_and_sort_by_offset(
    topic: str, queue_id: int, other: str, a: int, b: int
) -> None:
    prefix = lay.queue_prefix(topic, queue_id)
    assert lay.queue_topic(prefix) == (topic, queue_id)
    ka, kb = prefix + lay.U64.pack(a), prefix + lay.U64.pack(b)
    assert (ka < kb) == (a < b)
    # No other queue's key falls inside this queue's range.
    for q in (queue_id, queue_id + 1):
        foreign = lay.queue_prefix(other, q) + lay.U64.pack(a)
        if (other, q) != (topic, queue_id):
            lo, hi = prefix + lay.U64.pack(0), prefix + lay.U64.pack(2**64 - 1)
            assert not lo <= foreign <= hi


@given(topic=codec_topics, key=keys | st.text(min_size=200, max_size=400),
       ts=store_times, phys=non_negative_int64s, begin=store_times, end=store_times)
def test_index_bounds_hold_exactly_the_entries_stored_in_the_time_range(
    topic: str, key: str, ts: int, phys: int, begin: int, end: int
) -> None:
    prefix = lay.index_prefix(topic, key)
    assert len(prefix) <= 1 + lay.MAX_INLINE_INDEX_KEY  # within LMDB's 511-byte keys
    k = lay.index_key(prefix, ts, phys)
    start, stop = lay.index_bounds(prefix, begin, end)
    assert (start <= k < stop) == (begin <= ts <= end)
    assert lay.index_phys(k) == phys


@given(topic=codec_topics, a=keys, b=keys)
def test_index_prefixes_of_different_keys_never_nest(topic: str, a: str, b: str) -> None:
    """A backward scan under one key's prefix never meets another key's entries."""
    pa, pb = lay.index_prefix(topic, a), lay.index_prefix(topic, b)
    if a != b:
        assert not pb.startswith(pa) and not pa.startswith(pb)
