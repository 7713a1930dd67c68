"""The per-record loop of :meth:`MmapMessageLog.append`: the records that take the fast path.

An append copies each record into the write segment, patches its store fields and offsets,
writes its ConsumeQueue entry and notes its place and index work.  Nearly every record needs
nothing else; a few need a rare step first: the segment rolls or its next chunk must be
allocated, the record's queue is new or needs its next file (:meth:`ConsumeQueue.prepare`), or
its size is illegal.  So the loop is split in two:

* :func:`append_records` (here, the reference; its compiled twin is ``append_records`` in
  store_kernels.pyx) appends records while each takes the fast path, and stops at the first
  that needs a rare step, returning its index;
* the store takes that step in Python (:meth:`MmapMessageLog._prepare_record`: the one place
  the rules of rolls, allocation, queue files and illegal sizes live) and calls the loop again
  from the same record, which then passes.

Both twins read and leave their state in one :class:`AppendRun` (the compiled loop in its
twin class, the same fields kept in C), so the store sees one algorithm whichever runs.  The
state a reader in another thread can see changes in the order recovery and reads rely on:
the record's bytes, then its PHYSICALOFFSET, then the segment's ``wrote``, then the queue
entry and its file's ``wrote`` (a pull skips an entry whose record it cannot see yet).  The
compiled twin sets the segment's ``wrote`` and the queue's ``next_offset`` and ``wrote`` once a
run of records to one queue instead of once a record, in that order (see ``run_records``
there): between, they lag behind the bytes, which a reader, stopping at a ``wrote``, does not
see.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence

import attrs

from evq.backends.mmapfile.consume_queue import ConsumeQueue
from evq.backends.mmapfile.mapped_file import MappedFile
from evq.domain import record as rec
from evq.domain import sysflag as sf
from evq.domain.log import Dispatched

HOST_V6 = sf.BORNHOST_V6 | sf.STOREHOST_V6  # in SYSFLAG's low byte, record byte 39
SYSFLAG_LOW_AT = rec.SYSFLAG_AT + 3
STORE_AT = rec.store_timestamp_at(0)  # STORETIMESTAMP + STOREHOSTADDRESS, IPv4 hosts
STORE_END = STORE_AT + rec.STORE_V4.size
# Prepared (0x4) and rollback (0xC) records get no ConsumeQueue entry, commit (0x8) and
# plain (0) ones do: the append path tests this one bit instead of sf.NOT_CONSUMABLE.
NO_QUEUE_ENTRY = sf.TRANSACTION_PREPARED_TYPE
_pack_offsets = rec.OFFSETS.pack_into

PatchV6 = Callable[[mmap.mmap, int, int, int], None]
"""``(buffer, position, host bits, store time)``: stamp the store fields of a record with an
IPv6 host (rare; they sit elsewhere, and the check of the store's host is the shell's)."""


@attrs.define(slots=True, kw_only=True)
class AppendRun:
    """The state of one append call's loop, shared by the loop and the store's rare steps.

    ``room``: how far (segment-relative) the write segment takes records without a rare step,
    leaving space for a BLANK after the last and allocated up to there.  ``places``,
    ``indexed`` and ``notify`` are the call's results, appended to in record order.
    """

    records: Sequence[rec.PutRecord]
    mf: MappedFile  # the write segment
    mm: mmap.mmap  # its writer: the mapping, or a transient store pool buffer
    start: int  # the segment's log offset
    pos: int  # where the next record goes, relative to ``start`` (the segment's ``wrote``)
    room: int
    min_size: int
    max_size: int
    now: int
    store_fields: bytes  # STORETIMESTAMP + STOREHOSTADDRESS of an IPv4 store host
    cqs: dict[tuple[str, int], ConsumeQueue]
    patch_v6: PatchV6
    places: list[tuple[int, int, int]] = attrs.field(factory=list)
    indexed: list[tuple[tuple[int, ...], int]] = attrs.field(factory=list)
    notify: list[Dispatched] | None = None

    def at(self, mf: MappedFile) -> None:
        """Go on appending at the end of ``mf``: where an append starts, or where a rare step
        left the write segment (rolled, or allocated further)."""
        self.mf, self.mm, self.start, self.pos = mf, mf.writer, mf.start, mf.wrote
        # Each record must leave room for the BLANK after it, and that BLANK be allocated.
        self.room = min(mf.size, mf.allocated) - rec.BLANK_SIZE


def append_records(run: AppendRun, i: int) -> int:
    """Append ``run.records[i:]`` while each takes the fast path; returns the index of the
    first that needs a rare step (``len(run.records)`` when none does).

    A record stops the loop when its size is illegal, when it does not fit in ``run.room``,
    when its queue does not exist or its next entry needs :meth:`ConsumeQueue.prepare`.
    """
    records = run.records
    end = len(records)
    mf, mm, start, pos, room = run.mf, run.mm, run.start, run.pos, run.room
    min_size, max_size, now, store_fields = run.min_size, run.max_size, run.now, run.store_fields
    cqs, places, indexed, notify = run.cqs, run.places, run.indexed, run.notify
    try:
        while i < end:
            r = records[i]
            data = r.data
            n = len(data)
            if not min_size <= n <= max_size or pos + n > room:
                break
            if r.sysflag & NO_QUEUE_ENTRY:
                qo = 0
                cq = None
            else:
                cq = cqs.get((r.topic, r.queue_id))
                if cq is None:
                    break
                qo = cq.next_offset
                if qo >= cq.ready_below:
                    break
                cq.next_offset = qo + 1
            phys = start + pos
            mm[pos : pos + n] = data
            # The host widths are the bytes' own (Message.sysflag leaves the V6 bits to the
            # encoder), and decide where the store fields are patched.
            v6 = data[SYSFLAG_LOW_AT] & HOST_V6
            if v6:
                run.patch_v6(mm, pos, v6, now)
            else:
                mm[pos + STORE_AT : pos + STORE_END] = store_fields
            # PHYSICALOFFSET last: recovery takes a record whose PHYSICALOFFSET matches its
            # position as wholly patched, and STORETIMESTAMP has no CRC to tell otherwise.
            _pack_offsets(mm, pos + rec.QUEUE_OFFSET_AT, qo, phys)
            pos += n
            mf.wrote = pos
            if cq is not None:
                cq.put(qo, phys, n, r.tags_code)
                if notify is not None:
                    notify.append(Dispatched(r.topic, r.queue_id, qo, phys, n, r.tags_code,
                                             now, r.sysflag & ~HOST_V6 | v6))
            hashes = r.key_hashes
            if hashes:
                indexed.append((hashes, phys))
            places.append((phys, n, qo))
            i += 1
    finally:
        run.pos = pos
    return i
