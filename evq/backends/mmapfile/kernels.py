"""The store's hot loops and its append: the pure-Python references or their compiled twins.

The twins live in evq/backends/mmapfile/store_kernels.pyx and are built where a C compiler
exists (setup.py).  They are used exactly where the record codec's are (see
:func:`evq.domain.record._compiled_kernels`: built, and not turned off by
:data:`~evq.domain.record.PURE_PYTHON_VARIABLE`), so one switch runs evq wholly pure.  Each
twin must leave the same bytes and state as its reference; tests/backends/test_store_kernels.py
checks that over random workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from evq.backends import disk, rules
from evq.backends.mmapfile import append_loop, consume_queue, index_file
from evq.backends.mmapfile.appended import REFUSED, AppendedBatch
from evq.backends.mmapfile.mapped_file import MappedFile
from evq.domain import record as rec
from evq.domain.clock import SystemClock
from evq.domain.log import Dispatched, GetStatus, LogClosed, ReadResult


@attrs.frozen(slots=True)
class StoreKernels:
    """One implementation of the store's loops (see :mod:`evq.backends.mmapfile.append_loop`
    and :func:`evq.backends.mmapfile.index_file.put_entries`, ``chain_offsets``, ``copy_runs``
    and ``write_runs`` for what each does)."""

    append_records: Callable[[append_loop.AppendRun, int], int]
    put_entries: index_file.PutEntries
    append_run: Callable[..., append_loop.AppendRun]
    """What makes the run ``append_records`` takes: the reference's class, or the compiled
    one (whose loop takes no other)."""
    append: Callable[[Any, Sequence[rec.PutRecord]], AppendedBatch] | None = None
    """The twin of the whole of :meth:`MmapMessageLog.append` (the store, the records), which
    the store installs as its ``append``; None: the method itself, the reference."""
    read_queue: Callable[..., ReadResult] | None = None
    """The twin of :meth:`MmapMessageLog._read_queue` (the store, the queue, the pull's
    arguments), installed the same way; None: the method itself."""
    chain_offsets: index_file.ChainOffsets = index_file.chain_offsets
    copy_runs: index_file.CopyRuns = index_file.copy_runs
    write_runs: index_file.WriteRuns = index_file.write_runs


PURE = StoreKernels(append_loop.append_records, index_file.put_entries, append_loop.AppendRun)


def _compiled() -> StoreKernels | None:
    """The compiled twins, bound to the layout constants; None where the record codec runs
    pure or they were not built."""
    if rec.COMPILED is None:
        return None
    try:
        from evq.backends.mmapfile import store_kernels
    except ImportError:
        return None
    store_kernels.bind(
        dispatched=Dispatched, put_record=rec.PutRecord, no_queue_entry=append_loop.NO_QUEUE_ENTRY,
        host_v6=append_loop.HOST_V6, sysflag_low_at=append_loop.SYSFLAG_LOW_AT,
        store_at=append_loop.STORE_AT, store_end=append_loop.STORE_END,
        queue_offset_at=rec.QUEUE_OFFSET_AT, physical_offset_at=rec.PHYSICAL_OFFSET_AT,
        cq_entry_size=consume_queue.ENTRY_SIZE, index_header_size=index_file.HEADER_SIZE,
        index_entry_size=index_file.ENTRY_SIZE, index_head_chunk=index_file.HEAD_CHUNK,
        max_time_diff=index_file.MAX_TIME_DIFF, blank_size=rec.BLANK_SIZE, log_closed=LogClosed,
        refused=REFUSED, no_space_fn=disk.no_space, store_fields=rec.STORE_V4.pack,
        appended_batch=AppendedBatch, system_clock=SystemClock, mapped_file=MappedFile,
        index_file=index_file.IndexFile, consume_queue=consume_queue.ConsumeQueue,
    )
    store_kernels.bind_reads(
        read_result=ReadResult, get_status=GetStatus, outside=rules.status_outside,
        scan_limit=rules.SCAN_LIMIT, blank_entry_size=rules.BLANK_ENTRY_SIZE,
    )
    return StoreKernels(store_kernels.append_records, store_kernels.put_entries,
                        store_kernels.AppendRun, store_kernels.append, store_kernels.read_queue,
                        store_kernels.chain_offsets, store_kernels.copy_runs,
                        store_kernels.write_runs)


COMPILED = _compiled()
"""The compiled twins, or None where they are not built or not wanted."""
KERNELS = COMPILED or PURE
"""The loops this process runs."""
