"""A sparse in-memory index of one queue's store times, for offset-for-time.

:func:`~evq.backends.rules.first_at_or_after` reads a record for every probe, and the reads it
needs grow with the queue (about 10 at 10^5 entries and 12 at 10^6 on a real timeline), each
read costlier in a larger store.  Keeping the store time of every :data:`STRIDE`-th entry in
memory turns that into a search among the samples plus a search within one stride.

A sample is read the first time a search among the samples probes it, and kept, so the first
lookup of a queue reads a logarithmic few at any length rather than all of them (it once read
them all: 39,063 records for a queue of 10^7, each a random disk read on a log out of the page
cache, before a reset by time could answer), and no sample is ever read twice.  The table
takes an 8-byte integer per ``STRIDE`` entries of a queue searched by time (31 MB for 10^9
messages), none for queues nobody searches by time.

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
a millisecond)."""

UNREAD = -2
"""A sample no search has probed yet (-1 is a probed offset without a record)."""


_UNREAD_RUN = array("q", [UNREAD])


@attrs.define(slots=True, eq=False)
class TimeSamples:
    """``times[i]`` is the store time of queue offset ``base + i * STRIDE`` (-1: no record,
    :data:`UNREAD`: not read yet)."""

    base: int = -1
    times: array[int] = attrs.field(factory=lambda: array("q"))
    unread: int = 0
    """How many of ``times`` are :data:`UNREAD`: at 0, a search among them is a bisect."""
    passed: int = 0
    """Samples below the queue's start as last searched: never searched again (the start
    only moves forward until :meth:`clear`), and none of them is left unread."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def clear(self) -> None:
        with self._lock:
            self.base = -1
            del self.times[:]
            self.unread = self.passed = 0

    def first_at_or_after(
        self, lo: int, hi: int, timestamp_ms: int, store_time: Callable[[int], int]
    ) -> int:
        """What :func:`~evq.backends.rules.first_at_or_after` answers for ``[lo, hi)``.
        Reads (under the lock: two lookups must not both read a sample) only the samples the
        search among them probes."""
        if lo >= hi:
            return lo
        with self._lock:
            if self.base < 0:
                self.base = lo
            base, times = self.base, self.times
            count = (hi - base + STRIDE - 1) // STRIDE  # samples at offsets below hi
            if count > len(times):
                self.unread += count - len(times)
                times.extend(_UNREAD_RUN * (count - len(times)))

            # From the first sample in the queue: one below it may have expired since the
            # samples before it were read, and an expired record reads as -1, which would
            # sort it before them.
            first = max(0, (lo - base + STRIDE - 1) // STRIDE)
            for i in range(self.passed, first):
                if times[i] == UNREAD:
                    times[i] = -1  # never read: a sample below the start orders nothing
                    self.unread -= 1
            self.passed = max(self.passed, first)
            if self.unread:
                k = self._search(first, count, timestamp_ms, store_time)
            else:  # all read: the same answer, without a Python loop
                k = bisect.bisect_left(times, timestamp_ms, first, count)
            below = base + (k - 1) * STRIDE
            above = base + k * STRIDE
            t_below = self._read(k - 1, store_time) if k > 0 else -1
            t_above = self._read(k, store_time) if k < count else None
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

    def _read(self, i: int, store_time: Callable[[int], int]) -> int:
        t = self.times[i]
        if t == UNREAD:
            t = self.times[i] = store_time(self.base + i * STRIDE)
            self.unread -= 1
        return t

    def _search(self, lo: int, hi: int, timestamp_ms: int,
                store_time: Callable[[int], int]) -> int:
        """The first sample number in ``[lo, hi)`` whose time is at or after
        ``timestamp_ms`` (``hi`` if none), reading the samples it probes.  A bisection whose
        every probe is the number in its range divisible by the largest power of two: the
        probes are the same whatever the range, so every lookup of a queue shares the upper
        levels of one tree of samples however the queue has grown or expired since, and a
        lookup reads at most one sample per bit of ``hi``.  (Interpolating among samples
        reads fewer on the first lookup, but each lookup then probes samples of its own.)"""
        times, base, read = self.times, self.base, 0
        try:
            while lo < hi:
                # lo and hi - 1 share the bits above the highest one where they differ, and
                # hi - 1 has that bit set: clearing the bits below it gives a number in range.
                bit = (lo ^ (hi - 1)).bit_length() - 1
                mid = (hi - 1) >> bit << bit if bit >= 0 else lo
                t = times[mid]
                if t == UNREAD:  # _read's step, inline: this loop runs once a probe
                    t = times[mid] = store_time(base + mid * STRIDE)
                    read += 1
                if t < timestamp_ms:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        finally:
            self.unread -= read  # a read that failed (a damaged record) counts none
