"""What one :meth:`MmapMessageLog.append` call returns: its records' places, kept compactly.

Building an :class:`~evq.domain.log.AppendResult` per record cost a sixth of the append path
(an attrs ``__init__`` call and an object each), while a caller usually reads one of them, the
last end offset to wait for.  So the loop keeps one ``(physical offset, size, queue offset)``
tuple a record and the results are made when they are read; the batch shares its status, store
time and host.  It behaves as the list of results did where callers used one: indexing,
slicing, iteration, ``len``, ``==`` and ``+`` (which gives a list); a send's answer reads its
summaries (:class:`~evq.domain.log.AppendedRecords`) from the places.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from evq.domain import record as rec
from evq.domain.log import AppendedRecords, AppendResult, AppendSummary, PutStatus
from evq.domain.record import offset_msg_id, offset_msg_ids


def _compiled_single() -> Callable[[Any], tuple[tuple[int, int, int], bytes] | None] | None:
    """The compiled twin of :meth:`AppendedBatch.single` (``single`` in store_kernels.pyx),
    where the store's kernels are built and wanted (as evq.backends.mmapfile.kernels
    chooses): the send lane asks it of every single send, and as a method it ran a Python
    frame of 25 bytecodes there."""
    if rec.COMPILED is None:
        return None
    try:
        from evq.backends.mmapfile.store_kernels import single
    except ImportError:
        return None
    return single  # type: ignore[no-any-return]


ILLEGAL = (-1, 0, -1)
"""The place of a record the log refused (MESSAGE_ILLEGAL): AppendResult's defaults."""
REFUSED = (-2, 0, -1)
"""The place of a record refused for want of disk space (SERVICE_NOT_AVAILABLE)."""


class AppendedBatch(AppendedRecords, Sequence[AppendResult]):
    __slots__ = ("_host", "_places", "_store_timestamp")

    def __init__(self, places: list[tuple[int, int, int]], store_timestamp: int, host: bytes):
        self._places = places
        self._store_timestamp = store_timestamp
        self._host = host

    def _result(self, place: tuple[int, int, int]) -> AppendResult:
        if place[0] < 0:
            return AppendResult(_refusal(place))
        physical, size, queue_offset = place
        return AppendResult(PutStatus.PUT_OK, physical, size, queue_offset,
                            self._store_timestamp, self._host)

    def status(self) -> PutStatus:
        places = self._places
        if not places or min(places)[0] >= 0:  # compared in C: nearly always all stored
            return PutStatus.PUT_OK
        return next(_refusal(p) for p in places if p[0] < 0)

    def end_offset(self) -> int:
        # Stored records' places rise, and refused ones are negative: the last stored
        # record ends furthest.
        for physical, size, _ in reversed(self._places):
            if physical >= 0:
                return physical + size
        return -1 if self._places else 0  # a refused record's result ends at -1

    def size(self) -> int:
        return sum([p[1] for p in self._places])

    def msg_ids(self) -> str:
        return offset_msg_ids(self._host, [p[0] for p in self._places])

    def summary(self) -> AppendSummary:
        places = self._places
        if len(places) == 1:  # a single send, nearly always stored: read off its one place
            physical, size, queue_offset = places[0]
            if physical >= 0:
                return (physical, queue_offset, physical + size,
                        offset_msg_id(self._host, physical), 1, size)
        if not places:
            return -1, -1, 0, "", 0, 0
        first = self._result(places[0])
        return (first.physical_offset, first.queue_offset, self.end_offset(), self.msg_ids(),
                len(places), self.size())

    def pure_single(self) -> tuple[tuple[int, int, int], bytes] | None:
        """:meth:`single`'s reference."""
        places = self._places
        if len(places) == 1 and places[0][0] >= 0:
            return places[0], self._host
        return None

    single = _compiled_single() or pure_single

    def __len__(self) -> int:
        return len(self._places)

    @overload
    def __getitem__(self, index: int) -> AppendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[AppendResult]: ...

    def __getitem__(self, index: int | slice) -> AppendResult | list[AppendResult]:
        if isinstance(index, slice):
            return [self._result(p) for p in self._places[index]]
        return self._result(self._places[index])

    def __iter__(self) -> Iterator[AppendResult]:
        return map(self._result, self._places)

    def __add__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*self, *other]

    def __radd__(self, other: Sequence[AppendResult]) -> list[AppendResult]:
        return [*other, *self]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


def _refusal(place: tuple[int, int, int]) -> PutStatus:
    return PutStatus.MESSAGE_ILLEGAL if place is ILLEGAL else PutStatus.SERVICE_NOT_AVAILABLE
