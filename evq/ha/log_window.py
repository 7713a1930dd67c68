"""One side's log as the handshake sees it: window CRCs and record starts, over MessageLog.

Blocking store calls: the HA shells run these methods off the event loop.

Record starts are found backwards without an index: a stored record carries its own physical
offset at byte 28 (see :mod:`evq.domain.record`), so a position ``q`` holding the v1 magic at
``q + 4`` and the value ``q`` at ``q + 28`` is a record start.  The magic is searched with
``bytes.rfind``, so a scan costs a few C-level searches per window, not a loop per byte.
"""

from __future__ import annotations

import attrs

from evq.domain.checksum import crc32
from evq.domain.log import MessageLog
from evq.domain.record import INT64, MAGIC_V1, PHYSICAL_OFFSET_AT, SIZE_MAGIC

_MAGIC_BYTES = MAGIC_V1.to_bytes(4, "big", signed=True)
_SCAN_STEP = 256 * 1024
_HEAD_BYTES = PHYSICAL_OFFSET_AT + INT64.size  # enough of a record to check where it starts


@attrs.frozen(slots=True)
class LogWindow:
    """:class:`evq.ha.handshake.LogSide` over a live :class:`MessageLog`."""

    log: MessageLog

    @property
    def min_offset(self) -> int:
        return self.log.min_physical_offset

    @property
    def max_offset(self) -> int:
        return self.log.max_physical_offset

    def read(self, start: int, end: int) -> bytes:
        """The log bytes in ``[start, end)`` (``read_log`` stops at segment ends; this does
        not), cut short at the log end."""
        out = bytearray()
        pos = start
        while pos < end:
            chunk = self.log.read_log(pos, end - pos)
            if not chunk:
                break
            out += chunk
            pos += len(chunk)
        return bytes(out)

    def crc(self, start: int, end: int) -> int:
        value = 0
        pos = start
        while pos < end:
            chunk = self.log.read_log(pos, end - pos)
            if not chunk:
                break
            value = crc32(chunk, value)
            pos += len(chunk)
        return value

    def record_start_at_or_before(self, position: int) -> int:
        floor = self.min_offset
        hi = min(position, self.max_offset)
        while hi > floor:
            lo = max(floor, hi - _SCAN_STEP)
            data = self.read(lo, hi + _HEAD_BYTES)
            found = _last_record_start(data, lo, hi)
            if found is not None:
                return found
            hi = lo
        return floor


def _last_record_start(data: bytes, base: int, limit: int) -> int | None:
    """The greatest record start ``q <= limit`` in ``data`` (which begins at log offset
    ``base``), or None."""
    end = limit - base + SIZE_MAGIC.size
    while True:
        at = data.rfind(_MAGIC_BYTES, 0, end)
        if at < 4:
            return None
        q = at - 4
        if len(data) >= q + _HEAD_BYTES:
            (offset,) = INT64.unpack_from(data, q + PHYSICAL_OFFSET_AT)
            if offset == base + q:
                return offset
        end = at + len(_MAGIC_BYTES) - 1
