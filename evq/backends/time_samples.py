"""A sparse in-memory index of one queue's store times, for offset-for-time.

:func:`~evq.backends.rules.first_at_or_after` reads a record for every probe, and the reads it
needs grow with the queue (about 10 at 10^5 entries and 12 at 10^6 on a real timeline), each
read costlier in a larger store.  Keeping the store time of every :data:`STRIDE`-th entry in
memory turns that into a bisection in memory plus a search within one stride, so a lookup
reads about the same few records at any length.  The samples are read lazily, on the first
lookup and then for whatever the queue has gained since: an 8-byte integer per ``STRIDE``
entries (31 MB for 10^9 messages), none for queues nobody searches by time.

A sample must never describe an entry that has since been replaced, so the owner of a queue
calls :meth:`TimeSamples.clear` whenever the queue is cut back (recovery, HA truncation).
Expiry needs nothing: an expired entry's sample still orders the entries after it.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Callable

import attrs

from evq.backends.rules import first_at_or_after, first_between

STRIDE = 256
"""Entries per sample: a search within one stride reads a few records (more when many share
a millisecond), and the first lookup of a queue of 10^6 entries reads 3,900 samples."""


@attrs.define(slots=True, eq=False)
class TimeSamples:
    """``times[i]`` is the store time of queue offset ``base + i * STRIDE`` (-1: no record)."""

    base: int = -1
    times: array[int] = attrs.field(factory=lambda: array("q"))
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def clear(self) -> None:
        with self._lock:
            self.base = -1
            del self.times[:]

    def first_at_or_after(
        self, lo: int, hi: int, timestamp_ms: int, store_time: Callable[[int], int]
    ) -> int:
        """What :func:`~evq.backends.rules.first_at_or_after` answers for ``[lo, hi)``."""
        if lo >= hi:
            return lo
        with self._lock:
            if self.base < 0:
                self.base = lo
            times = self.times
            nxt = self.base + len(times) * STRIDE
            while nxt < hi:
                times.append(store_time(nxt))
                nxt += STRIDE
            k = bisect.bisect_left(times, timestamp_ms)
            below = self.base + (k - 1) * STRIDE
            above = self.base + k * STRIDE
            t_below = times[k - 1] if k > 0 else -1
            t_above = times[k] if k < len(times) else None
        # Sample k-1 is earlier than the time and sample k is not, so the answer lies between
        # them, and their times bracket a search that reads neither.  A sample below the
        # queue's start brackets nothing (its record has expired); a record that expired after
        # sample k was read makes the search end on it, and one read tells.
        bracketed = k > 0 and below >= lo
        if t_above is None or above < lo:
            if not bracketed:
                return first_at_or_after(lo, hi, timestamp_ms, store_time)
            # Past the last sample: the queue's last record closes the bracket instead, so a
            # lookup in the unsampled tail interpolates as it does between two samples.
            last = hi - 1
            t_last = store_time(last)
            if t_last < timestamp_ms:
                return hi
            return first_between(below, t_below, last, t_last, timestamp_ms, store_time)
        if bracketed:
            found = first_between(below, t_below, above, t_above, timestamp_ms, store_time)
        else:
            found = first_at_or_after(lo, above + 1, timestamp_ms, store_time)
        if found < above or store_time(above) >= timestamp_ms:
            return found
        return first_at_or_after(above + 1, hi, timestamp_ms, store_time)
