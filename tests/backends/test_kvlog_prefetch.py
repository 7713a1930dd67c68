"""The records an unfiltered pull on a key-value backend reads in one call
(:func:`evq.backends.kvlog.store._pull_prefix`): every record the pull then views must be
among them, or it is read again one by one, and at most one more than the pull keeps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evq.backends import rules
from evq.backends.kvlog.store import _pull_prefix


@given(
    sizes=st.lists(st.integers(1, 5000), max_size=100),
    max_count=st.integers(1, 64),
    max_bytes=st.integers(1, 64 * 1024),
)
def test_a_pull_views_only_what_was_read_ahead_and_leaves_at_most_one(
    sizes: list[int], max_count: int, max_bytes: int
) -> None:
    entries: list[rules.Entry] = []
    phys = 0
    for size in sizes:
        entries.append((phys, size, 0))
        phys += size
    read_ahead: list[int] = []
    viewed: list[int] = []

    def chunk(qo: int, count: int) -> list[rules.Entry]:
        """What the key-value log's pull does with each chunk of queue entries it scans."""
        got = entries[qo : qo + count]
        read_ahead.extend(_pull_prefix(got, max_count, max_bytes))
        return got

    def view(at: int, size: int) -> memoryview:
        viewed.append(at)
        return memoryview(b"x" * size)

    result = rules.read_queue(
        0, 0, len(entries), max_count=max_count, max_bytes=max_bytes, tag_filter=None,
        entries=chunk, view=view, log_min=0,
        entries_per_file=1000,
    )
    assert len(result.records) == len(viewed)
    assert viewed == read_ahead[: len(viewed)]
    assert len(read_ahead) <= len(viewed) + 1
