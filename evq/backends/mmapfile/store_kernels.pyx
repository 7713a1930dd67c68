# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of the store's hot paths: ``append_records`` of
evq.backends.mmapfile.append_loop and ``put_entries`` of evq.backends.mmapfile.index_file (the
loops), ``chain_offsets`` (the key lookup's walk of an index chain), and ``append``
(:meth:`MmapMessageLog.append`), ``index_put``
(:meth:`IndexService.put`) and ``single`` (:meth:`AppendedBatch.single`), the steps a single
send runs around them: those were about 460 of the 820 bytecodes the broker ran for one, in
a dozen small Python frames (issue 18); and ``read_queue`` (:meth:`MmapMessageLog._read_queue`),
a pull's loop over its entries and records; and ``copy_runs`` and ``write_runs``, the index
head's write-back, made without holding the GIL.  The Python code stays the reference and the
fallback
(evq.backends.mmapfile.kernels and evq.backends.mmapfile.appended choose).

Each twin reads and leaves the same state as its reference, writes the same bytes, and stops
where it stops; tests/backends/test_store_kernels.py checks that over random workloads.  The
append loop gets there by another way: it keeps the state of the queue a run of records goes
to in C (:class:`QueueTail`) and sets the fields of the queue and the segment once a run,
not once a record, in the order readers rely on (see :func:`run_records`).  What
is rare stays Python, called from here where the reference calls it: the store fields of a
record with an IPv6 host (``run.patch_v6``), a ConsumeQueue entry outside its last file's
allocated part (:meth:`ConsumeQueue.put`), the fields of a record that is no PutRecord, a
record's rare step and a full disk (the store's methods), an index file that fills or a new
one (:meth:`IndexService.put_rest`), the transient store pool's deferred announcement, a
dispatch subscriber that raised.

The module imports nothing from evq: :func:`bind` hands it the layout numbers and the classes
it reads and builds, once, when evq.backends.mmapfile.kernels loads it.
"""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from evq.byte_order cimport get32, get64, put32, put64
from evq.slots cimport get_field, inherited_slot_offset, new_instance, replace_slot
from evq.slots cimport set_field, set_new, slot_at, slot_offset
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.errno cimport EINTR, errno
from libc.string cimport memcpy
from posix.unistd cimport pwrite
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

import os
from struct import error as struct_error

cdef extern from *:
    void prefetch "__builtin_prefetch"(const void*) noexcept nogil

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyLong_CheckExact(object)
    bint PyObject_TypeCheck(object, type)

# Bound by bind(): the numbers of evq's layouts (the modules that draw them own them).
cdef type Dispatched = None
cdef object object_new = object.__new__
DISPATCHED_FIELDS = ("topic", "queue_id", "queue_offset", "physical_offset", "size",
                     "tags_code", "store_timestamp", "sysflag")
# Where a Dispatched keeps each of DISPATCHED_FIELDS: a frozen attrs class sets each field
# through object.__setattr__ in its __init__, a microsecond a record, more than the rest of
# the loop, and the broker always has a subscriber to hand them to.
cdef Py_ssize_t DISPATCHED_AT[8]
cdef type PutRecord = None
# Where a PutRecord keeps each field (its slots), read without a getattr call each: six a
# record were a tenth of the loop.
cdef Py_ssize_t AT_DATA, AT_TOPIC, AT_QUEUE_ID, AT_SYSFLAG, AT_TAGS_CODE, AT_KEY_HASHES
cdef Py_ssize_t NO_QUEUE_ENTRY = 0
cdef Py_ssize_t HOST_V6 = 0
cdef Py_ssize_t SYSFLAG_LOW_AT = 0
cdef Py_ssize_t STORE_AT = 0
cdef Py_ssize_t STORE_SIZE = 0
cdef Py_ssize_t QUEUE_OFFSET_AT = 0
cdef Py_ssize_t CQ_ENTRY_SIZE = 0
cdef Py_ssize_t INDEX_ENTRY_SIZE = 0
cdef Py_ssize_t INDEX_HEADER_SIZE = 0
cdef Py_ssize_t INDEX_HEAD_CHUNK = 1
cdef Py_ssize_t BLANK_SIZE = 0
cdef int64_t MAX_TIME_DIFF = 0
# What the append refers to: evq's classes, refusals and rules, as bind() hands them over.
cdef object LogClosed = None
cdef object REFUSED = None
cdef object no_space = None
cdef object pack_store_fields = None
cdef object AppendedBatch = None  # a Sequence: ABCMeta's, not exactly a type
cdef Py_ssize_t AT_PLACES, AT_BATCH_TS, AT_BATCH_HOST
cdef type SystemClock = None  # a clock of exactly this class is read here (wall_ms)
# Where a MappedFile and an IndexFile keep the fields a single send's append reads and sets:
# through their descriptors, some thirty a send were about a tenth of its append (issue 18).
cdef type MappedFile = None
cdef Py_ssize_t MF_WRITER, MF_START, MF_WROTE, MF_SIZE, MF_ALLOCATED, MF_MM
cdef type IndexFile = None
cdef type ConsumeQueue = None
cdef Py_ssize_t CQ_NEXT_OFFSET, CQ_READY_BELOW, CQ_LAST
cdef Py_ssize_t IX_IMAGE, IX_FILE, IX_BASE, IX_MAX_ENTRIES, IX_COUNT, IX_BEGIN_TS, IX_BEGIN_PHYS
cdef Py_ssize_t IX_SLOT, IX_DIRTY, IX_SLOTS, IX_SLOTS_USED, IX_END_TS, IX_END_PHYS
# The same for the log's fields the append reads and sets (MmapMessageLog.__slots__), taken
# from the first log class an append is given (see :func:`know_log`).
LOG_FIELDS = ("_put_lock", "_closed", "_refused", "_clock", "_last_store_ts", "_run", "_log",
              "_subscribers", "_host", "_index", "_dispatched", "_warm_at", "_allocator",
              "_committer")
cdef enum:
    LOG_PUT_LOCK, LOG_CLOSED, LOG_REFUSED, LOG_CLOCK, LOG_LAST_TS, LOG_RUN, LOG_LOG
    LOG_SUBSCRIBERS, LOG_HOST, LOG_INDEX, LOG_DISPATCHED, LOG_WARM_AT, LOG_ALLOCATOR
    LOG_COMMITTER, LOG_COUNT
cdef type LogClass = None
cdef Py_ssize_t LOG_AT[LOG_COUNT]
cdef bint bound = False


def bind(*, dispatched, put_record, no_queue_entry, host_v6, sysflag_low_at, store_at, store_end,
         queue_offset_at, physical_offset_at, cq_entry_size, index_header_size,
         index_entry_size, index_head_chunk, max_time_diff, blank_size, log_closed, refused,
         no_space_fn, store_fields, appended_batch, system_clock, mapped_file,
         index_file, consume_queue) -> None:
    """Hand the kernels the layout numbers and the Dispatched class (called once, by
    evq.backends.mmapfile.kernels).  The writes below are drawn for the layouts as they are
    (two adjacent big-endian int64 offsets, 20-byte queue and index entries): a layout that
    changed stops the import rather than write wrong bytes."""
    global Dispatched, NO_QUEUE_ENTRY, HOST_V6, SYSFLAG_LOW_AT, STORE_AT, STORE_SIZE
    global QUEUE_OFFSET_AT, CQ_ENTRY_SIZE, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_HEAD_CHUNK
    global bound, BLANK_SIZE, MAX_TIME_DIFF, LogClosed, REFUSED, no_space, pack_store_fields
    global AppendedBatch, AT_PLACES, AT_BATCH_TS, AT_BATCH_HOST, SystemClock
    global MappedFile, MF_WRITER, MF_START, MF_WROTE, MF_SIZE, MF_ALLOCATED, MF_MM
    global ConsumeQueue, CQ_NEXT_OFFSET, CQ_READY_BELOW, CQ_LAST
    global IndexFile, IX_IMAGE, IX_FILE, IX_BASE, IX_MAX_ENTRIES, IX_COUNT, IX_BEGIN_TS
    global IX_BEGIN_PHYS, IX_SLOT, IX_DIRTY, IX_SLOTS, IX_SLOTS_USED, IX_END_TS, IX_END_PHYS
    global PutRecord, AT_DATA, AT_TOPIC, AT_QUEUE_ID, AT_SYSFLAG, AT_TAGS_CODE, AT_KEY_HASHES
    if (physical_offset_at != queue_offset_at + 8 or cq_entry_size != 20
            or index_entry_size != 20 or index_header_size != 40 or index_head_chunk <= 0):
        raise RuntimeError("a store layout changed: store_kernels.pyx writes the old one")
    fields = [(a.name, a.validator, a.converter) for a in dispatched.__attrs_attrs__]
    if (fields != [(name, None, None) for name in DISPATCHED_FIELDS]
            or hasattr(dispatched, "__attrs_post_init__")):
        raise RuntimeError(f"Dispatched changed: {fields}")
    for k, name in enumerate(DISPATCHED_FIELDS):
        DISPATCHED_AT[k] = slot_offset(dispatched, name)
    Dispatched = dispatched
    PutRecord = put_record
    AT_DATA, AT_TOPIC, AT_QUEUE_ID = (slot_offset(put_record, "data"), slot_offset(put_record, "topic"),
                                      slot_offset(put_record, "queue_id"))
    AT_SYSFLAG, AT_TAGS_CODE, AT_KEY_HASHES = (slot_offset(put_record, "sysflag"),
                                               slot_offset(put_record, "tags_code"),
                                               slot_offset(put_record, "key_hashes"))
    NO_QUEUE_ENTRY, HOST_V6, SYSFLAG_LOW_AT = no_queue_entry, host_v6, sysflag_low_at
    STORE_AT, STORE_SIZE = store_at, store_end - store_at
    QUEUE_OFFSET_AT, CQ_ENTRY_SIZE, INDEX_ENTRY_SIZE = queue_offset_at, cq_entry_size, index_entry_size
    INDEX_HEADER_SIZE, INDEX_HEAD_CHUNK = index_header_size, index_head_chunk
    MAX_TIME_DIFF, BLANK_SIZE = max_time_diff, blank_size
    LogClosed, REFUSED, no_space, pack_store_fields = log_closed, refused, no_space_fn, store_fields
    AppendedBatch = appended_batch
    AT_PLACES, AT_BATCH_TS, AT_BATCH_HOST = (slot_offset(appended_batch, "_places"),
                                             slot_offset(appended_batch, "_store_timestamp"),
                                             slot_offset(appended_batch, "_host"))
    SystemClock = system_clock
    MF_WRITER, MF_START, MF_WROTE, MF_SIZE, MF_ALLOCATED, MF_MM = (
        slot_offset(mapped_file, name)
        for name in ("writer", "start", "wrote", "size", "allocated", "mm"))
    MappedFile = mapped_file
    (IX_IMAGE, IX_FILE, IX_BASE, IX_MAX_ENTRIES, IX_COUNT, IX_BEGIN_TS, IX_BEGIN_PHYS, IX_SLOT,
     IX_DIRTY, IX_SLOTS, IX_SLOTS_USED, IX_END_TS, IX_END_PHYS) = (
        slot_offset(index_file, name)
        for name in ("_image", "file", "base", "max_entries", "count", "begin_ts", "begin_phys",
                     "slot", "_dirty", "slots", "slots_used", "end_ts", "end_phys"))
    IndexFile = index_file
    CQ_NEXT_OFFSET, CQ_READY_BELOW, CQ_LAST = (
        slot_offset(consume_queue, name) for name in ("next_offset", "ready_below", "_last"))
    ConsumeQueue = consume_queue
    bound = True


cdef inline object field(object r, Py_ssize_t at, str name):
    """``getattr(r, name)`` for a PutRecord (or a subclass: slots keep their places), read
    from its slot; any other object through getattr."""
    cdef PyObject* value
    if not PyObject_TypeCheck(r, PutRecord):
        return getattr(r, name)
    value = (<PyObject**>(<char*>(<PyObject*>r) + at))[0]
    if value is NULL:
        return getattr(r, name)  # never set: getattr raises what it raises
    return <object>value


cdef int know_log(type cls) except -1:
    """Take where objects of ``cls`` keep :data:`LOG_FIELDS`."""
    global LogClass
    for k, name in enumerate(LOG_FIELDS):
        LOG_AT[k] = inherited_slot_offset(cls, name)
    LogClass = cls
    return 0


cdef inline object log_field(object log, int k):
    """``getattr(log, LOG_FIELDS[k])`` from its slot (``log`` is a ``LogClass``)."""
    return slot_at(log, LOG_AT[k], LOG_FIELDS[k])


cdef inline int set_log_field(object log, int k, object value) except -1:
    """``setattr(log, LOG_FIELDS[k], value)`` into its slot (``log`` is a ``LogClass``)."""
    return replace_slot(log, LOG_AT[k], value)


cdef object new_dispatched(object topic, object queue_id, object queue_offset,
                           object physical_offset, object size, object tags_code,
                           object store_timestamp, object sysflag):
    """``Dispatched(...)``, its slots set directly (see DISPATCHED_AT)."""
    d = new_instance(Dispatched)
    set_new(d, DISPATCHED_AT[0], topic)
    set_new(d, DISPATCHED_AT[1], queue_id)
    set_new(d, DISPATCHED_AT[2], queue_offset)
    set_new(d, DISPATCHED_AT[3], physical_offset)
    set_new(d, DISPATCHED_AT[4], size)
    set_new(d, DISPATCHED_AT[5], tags_code)
    set_new(d, DISPATCHED_AT[6], store_timestamp)
    set_new(d, DISPATCHED_AT[7], sysflag)
    return d


cdef inline int writable(object obj, Py_buffer* view) except -1:
    return PyObject_GetBuffer(obj, view, PyBUF_WRITABLE)


# --- the append loop --------------------------------------------------------------------------


cdef class QueueTail:
    """Where a run of records to one ConsumeQueue writes its entries, kept in C.

    The records of a batch nearly always go to one queue, and each reading and setting the
    queue's ``next_offset`` and ``ready_below``, its last file's ``start``, ``allocated``,
    ``wrote`` and mapping, the key built and looked up (a dozen attribute lookups, three
    ints made and a buffer taken and given back) cost some 2,700 of the 4,150 machine
    instructions the loop ran a record (callgrind, embedded batches of 32 records of 1 KiB;
    issue 18).  So :func:`run_records` loads them here when a record's
    queue is not the previous one's, writes its entries into the buffer held here, and
    publishes ``next_offset`` and the file's ``wrote`` with :meth:`publish`, after the
    segment's ``wrote`` (see :func:`run_records` for when, and why a lag is harmless).

    What it puts is :meth:`ConsumeQueue.put`'s common case: the entry inside the last file's
    allocated part (where the ``ready_below`` check keeps it), a tags code that is an int64.
    Anything else goes to the method itself, after :meth:`drop`.
    """

    cdef object cq, topic, queue_id, last
    cdef int64_t next, next_was, ready, start, allocated, wrote, wrote_was
    cdef bint held
    cdef Py_buffer view

    cdef int load(self, object cq) except -1:
        """Take ``cq``'s state (after :meth:`drop`)."""
        self.next = self.next_was = get_field(cq, ConsumeQueue, CQ_NEXT_OFFSET, "next_offset")
        self.ready = get_field(cq, ConsumeQueue, CQ_READY_BELOW, "ready_below")
        last = get_field(cq, ConsumeQueue, CQ_LAST, "_last")
        if last is not None:
            self.start = get_field(last, MappedFile, MF_START, "start")
            self.allocated = get_field(last, MappedFile, MF_ALLOCATED, "allocated")
            self.wrote = self.wrote_was = get_field(last, MappedFile, MF_WROTE, "wrote")
            writable(get_field(last, MappedFile, MF_MM, "mm"), &self.view)
            self.held = True
        self.cq, self.last = cq, last
        return 0

    cdef bint put(self, int64_t qo, int64_t phys, Py_ssize_t n, object tags) except -1:
        """Write entry ``qo`` if it is the common case; False if the method must."""
        cdef int overflow = 0
        cdef int64_t rel, tags_code
        cdef uint8_t* p
        if not self.held or not PyLong_CheckExact(tags):
            return False
        tags_code = PyLong_AsLongLongAndOverflow(tags, &overflow)
        rel = qo * CQ_ENTRY_SIZE - self.start
        if overflow or not 0 <= rel <= self.allocated - CQ_ENTRY_SIZE:
            return False
        if rel + CQ_ENTRY_SIZE > self.view.len:
            raise IndexError("consume queue entry past its file")
        p = <uint8_t*>self.view.buf + rel
        put64(p, <uint64_t>phys)
        put32(p + 8, <uint32_t>n)
        put64(p + 12, <uint64_t>tags_code)
        if rel >= self.wrote:  # positions are whole entries
            self.wrote = rel + CQ_ENTRY_SIZE
        return True

    cdef int publish(self) except -1:
        """Set the queue's ``next_offset`` and its last file's ``wrote`` to where the run got
        (the queue's ``wrote`` last: a pull reads up to it)."""
        if self.cq is None:
            return 0
        if self.next != self.next_was:
            set_field(self.cq, ConsumeQueue, CQ_NEXT_OFFSET, "next_offset", self.next)
            self.next_was = self.next
        if self.wrote != self.wrote_was:
            set_field(self.last, MappedFile, MF_WROTE, "wrote", self.wrote)
            self.wrote_was = self.wrote
        return 0

    cdef int drop(self) except -1:
        """:meth:`publish`, give the buffer back and forget the queue."""
        try:
            self.publish()
        finally:
            if self.held:
                self.held = False
                PyBuffer_Release(&self.view)
            self.cq = self.topic = self.queue_id = self.last = None
        return 0

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef class AppendRun:
    """The twin of :class:`evq.backends.mmapfile.append_loop.AppendRun`: the same fields and
    ``at``, kept in C, so that the append and its loop read and write them without an
    attribute lookup each.  Those were some thirty an append, about 5 k of the 86 k machine
    instructions the broker's loop ran for a single send (callgrind; issue 18).  The store
    makes the run of its kernels (:attr:`StoreKernels.append_run
    <evq.backends.mmapfile.kernels.StoreKernels.append_run>`): this one where they are
    compiled, since the compiled loop takes no other."""

    cdef public object records, mf, mm, store_fields, cqs, patch_v6, places, indexed, notify
    cdef public int64_t start, pos, room, min_size, max_size, now
    cdef QueueTail tail  # run_records's, between two of its calls holding nothing

    def __init__(self, *, records, mf, mm, int64_t start, int64_t pos, int64_t room,
                 int64_t min_size, int64_t max_size, int64_t now, store_fields, cqs, patch_v6,
                 places=None, indexed=None, notify=None):
        self.records, self.mf, self.mm = records, mf, mm
        self.start, self.pos, self.room = start, pos, room
        self.min_size, self.max_size, self.now = min_size, max_size, now
        self.store_fields, self.cqs, self.patch_v6 = store_fields, cqs, patch_v6
        self.places = [] if places is None else places
        self.indexed = [] if indexed is None else indexed
        self.notify = notify

    def __cinit__(self, *args, **kwargs):
        self.tail = QueueTail()  # here, so that no AppendRun is without one

    def at(self, mf) -> None:
        """As the reference's ``at``: go on appending at the end of ``mf``."""
        self.set_at(mf)

    cdef int set_at(self, object mf) except -1:
        self.mf, self.mm = mf, get_field(mf, MappedFile, MF_WRITER, "writer")
        self.start = get_field(mf, MappedFile, MF_START, "start")
        self.pos = get_field(mf, MappedFile, MF_WROTE, "wrote")
        self.room = min(get_field(mf, MappedFile, MF_SIZE, "size"),
                        get_field(mf, MappedFile, MF_ALLOCATED, "allocated")) - BLANK_SIZE
        return 0


def append_records(AppendRun run, Py_ssize_t i) -> int:
    """The twin of :func:`evq.backends.mmapfile.append_loop.append_records`."""
    return run_records(run, i)


cdef Py_ssize_t run_records(AppendRun run, Py_ssize_t i) except -1:
    """:func:`append_records`, called from C by :func:`append` too.

    It leaves what the reference leaves, but sets the segment's ``wrote`` and the queue's
    fields (:class:`QueueTail`) once a run of records to one queue rather than once a
    record: when the next record's queue is another, before Python code that reads them
    (:meth:`ConsumeQueue.put`) or might (``run.patch_v6``), and when the loop ends, also by
    an exception.  The segment's ``wrote`` always goes first, so what another thread sees
    keeps the reference's order (see append_loop): a queue's ``wrote`` never covers an entry
    whose record lies past the segment's.  In between they lag behind the bytes, as at the
    start of a record in the reference: readers stop at a ``wrote`` (also the commit of a
    transient store pool buffer and a flush), and a ``next_offset`` read without the put
    lock (``_queue_end``) is read against the queue's ``wrote``.  An object made here may
    run the garbage collector, and a finalizer may give the GIL to another thread: it sees
    the state of the last publication, consistent and behind.  No other thread changes
    what is kept here: every writer of a queue's or the log's files holds the put lock."""
    cdef Py_buffer out, data_view
    cdef uint8_t* dst
    cdef const uint8_t* src
    cdef Py_ssize_t end, n, pos, published, room, min_size, max_size
    cdef int64_t start, qo, phys
    cdef long long sysflag
    cdef int v6
    cdef bint entry
    cdef PyObject* found
    cdef QueueTail tail = run.tail
    cdef object now, phys_obj, n_obj, qo_obj  # objects: one int each, not one a use
    if not bound:
        raise RuntimeError("store_kernels.bind was not called")
    records = run.records
    end = len(records)
    mf = run.mf
    start, pos, room = run.start, run.pos, run.room
    published = pos
    min_size, max_size = run.min_size, run.max_size
    now, store_fields = run.now, run.store_fields
    cqs, places, indexed, notify = run.cqs, run.places, run.indexed, run.notify
    if not isinstance(cqs, dict):
        raise TypeError("run.cqs must be a dict")
    if not PyBytes_CheckExact(store_fields) or PyBytes_GET_SIZE(store_fields) != STORE_SIZE:
        raise ValueError("run.store_fields must be the packed STORETIMESTAMP and host")
    # Lists, so that noting a record's results runs no Python code (see above).
    if type(places) is not list or type(indexed) is not list or not (
            notify is None or type(notify) is list):
        raise TypeError("run.places, run.indexed and run.notify must be lists")
    writable(run.mm, &out)
    dst = <uint8_t*>out.buf
    try:
        while i < end:
            r = records[i]
            data = field(r, AT_DATA, "data")
            n = len(data)
            if not min_size <= n <= max_size or pos + n > room:
                break
            sysflag = field(r, AT_SYSFLAG, "sysflag")
            entry = not sysflag & NO_QUEUE_ENTRY
            if not entry:
                qo = 0
            else:
                topic = field(r, AT_TOPIC, "topic")
                queue_id = field(r, AT_QUEUE_ID, "queue_id")
                # The same objects as the previous record's: the same queue, without a key.
                if tail.cq is None or topic is not tail.topic or queue_id is not tail.queue_id:
                    found = PyDict_GetItem(cqs, (topic, queue_id))
                    if found is NULL:
                        break
                    if <object>found is not tail.cq:
                        if pos != published:
                            published = pos
                            set_field(mf, MappedFile, MF_WROTE, "wrote", pos)
                        tail.drop()
                        tail.load(<object>found)
                    tail.topic, tail.queue_id = topic, queue_id
                qo = tail.next
                if qo >= tail.ready:
                    break
                tail.next = qo + 1
            if pos + n > out.len:
                raise IndexError("record past the end of its segment")
            phys = start + pos
            # The host widths are the bytes' own, and decide where the store fields go.
            if PyBytes_CheckExact(data):
                src = <const uint8_t*>PyBytes_AS_STRING(data)
                memcpy(dst + pos, src, n)
                v6 = src[SYSFLAG_LOW_AT] & HOST_V6
            else:
                PyObject_GetBuffer(data, &data_view, 0)
                try:
                    if data_view.len != n:
                        raise ValueError("record data changed size while being appended")
                    src = <const uint8_t*>data_view.buf
                    memcpy(dst + pos, src, n)
                    v6 = src[SYSFLAG_LOW_AT] & HOST_V6
                finally:
                    PyBuffer_Release(&data_view)
            if v6:
                if pos != published:
                    published = pos
                    set_field(mf, MappedFile, MF_WROTE, "wrote", pos)
                tail.publish()
                run.patch_v6(run.mm, pos, v6, now)
            else:
                memcpy(dst + pos + STORE_AT, PyBytes_AS_STRING(store_fields), STORE_SIZE)
            # PHYSICALOFFSET last (see the reference).
            put64(dst + pos + QUEUE_OFFSET_AT, <uint64_t>qo)
            put64(dst + pos + QUEUE_OFFSET_AT + 8, <uint64_t>phys)
            pos += n
            phys_obj, n_obj, qo_obj = phys, n, qo
            if entry:
                tags = field(r, AT_TAGS_CODE, "tags_code")
                if not tail.put(qo, phys, n, tags):
                    cq = tail.cq
                    published = pos
                    set_field(mf, MappedFile, MF_WROTE, "wrote", pos)
                    tail.drop()
                    cq.put(qo_obj, phys_obj, n_obj, tags)
                if notify is not None:
                    notify.append(new_dispatched(topic, queue_id, qo_obj, phys_obj, n_obj, tags,
                                                 now, (sysflag & ~HOST_V6) | v6))
            hashes = field(r, AT_KEY_HASHES, "key_hashes")
            if hashes:
                indexed.append((hashes, phys_obj))
            places.append((phys_obj, n_obj, qo_obj))
            i += 1
    finally:
        try:
            if pos != published:
                set_field(mf, MappedFile, MF_WROTE, "wrote", pos)
            tail.drop()
        finally:
            PyBuffer_Release(&out)
            run.pos = pos
    return i


# --- the append -------------------------------------------------------------------------------


def append(object log, object records):
    """The twin of :meth:`evq.backends.mmapfile.store.MmapMessageLog.append` (reading and
    setting the same fields of ``log``); the store installs it as its ``append`` where the
    kernels are compiled.  What is rare stays the store's Python, called where the reference
    calls it: a record's rare step (``_prepare_record``), a full disk (``_found_no_space``,
    ``_index_failed``), a new index file (``IndexService.put_rest``), the transient store
    pool's deferred announcement (``CommitService.defer``), a subscriber that raised."""
    cdef Py_ssize_t count, i, prepared
    cdef AppendRun run
    if not bound:
        raise RuntimeError("store_kernels.bind was not called")
    if type(log) is not LogClass:
        know_log(type(log))
    # The put lock taken and given back by its methods: a with statement looks __enter__ and
    # __exit__ up as bound methods each time.
    lock = log_field(log, LOG_PUT_LOCK)
    lock.acquire()
    try:
        if log_field(log, LOG_CLOSED):
            raise LogClosed("the log is closed")
        if log_field(log, LOG_REFUSED):  # the disk is full: see evq.backends.shell
            return new_batch([REFUSED] * len(records), 0, log_field(log, LOG_HOST))
        clock = log_field(log, LOG_CLOCK)
        # The system clock read here, as its now_ms reads it, without a Python frame a send.
        now = wall_ms() if type(clock) is SystemClock else clock.now_ms()
        last = log_field(log, LOG_LAST_TS)
        if now < last:  # store times never go backwards
            now = last
        set_log_field(log, LOG_LAST_TS, now)
        run = log_field(log, LOG_RUN)
        files = log_field(log, LOG_LOG).files
        mf = files[len(files) - 1]  # (no negative indices here: wraparound=False)
        run.set_at(mf)
        if now != run.now:
            run.now, run.store_fields = now, pack_store_fields(now, log_field(log, LOG_HOST))
        run.records, run.places, run.indexed = records, [], []
        subscribers = log_field(log, LOG_SUBSCRIBERS)
        run.notify = [] if subscribers.listeners else None
        count, i, prepared = len(records), 0, -1
        try:
            while True:
                i = run_records(run, i)
                if i >= count:
                    break
                if i == prepared:  # its rare step left it off the fast path: a bug
                    raise RuntimeError(f"the append loop stopped twice at record {i}")
                prepared = i
                i += log._prepare_record(run, records[i])
        except OSError as exc:
            if not no_space(exc):
                raise
            log._found_no_space(exc)
            run.places += [REFUSED] * (count - len(run.places))
        places, indexed, notify, mf, pos = run.places, run.indexed, run.notify, run.mf, run.pos
        end = run.start + pos
        run.records = ()
        if indexed:
            try:
                put_index(log_field(log, LOG_INDEX), indexed, now)
            except OSError as exc:
                log._index_failed(indexed, exc)
        set_log_field(log, LOG_DISPATCHED, end)
        # MmapMessageLog._warm_ahead
        if get_field(mf, MappedFile, MF_START, "start") + pos >= log_field(log, LOG_WARM_AT):
            set_log_field(log, LOG_WARM_AT, log_field(log, LOG_ALLOCATOR).warm_ahead(mf, pos))
        if notify:
            committer = log_field(log, LOG_COMMITTER)
            if committer is not None:  # announced once they are in the file
                committer.defer(end, notify)
            else:  # DispatchSubscribers.notify
                for callback, wanted in subscribers.listeners:
                    if wanted is None or wanted:
                        try:
                            callback(notify)
                        except Exception:
                            subscribers.failed()
    finally:
        lock.release()
    return new_batch(places, now, log_field(log, LOG_HOST))


def wall_ms():
    """``time.time_ns() // 1_000_000``, what :meth:`evq.domain.clock.SystemClock.now_ms`
    returns: the same clock (CLOCK_REALTIME, which time.time_ns reads on Linux), floored to
    the millisecond."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef object new_batch(list places, object store_timestamp, object host):
    """``AppendedBatch(places, store_timestamp, host)``, its slots set directly."""
    batch = object_new(AppendedBatch)
    set_new(batch, AT_PLACES, places)
    set_new(batch, AT_BATCH_TS, store_timestamp)
    set_new(batch, AT_BATCH_HOST, host)
    return batch


def single(object batch):
    """The twin of :meth:`evq.backends.mmapfile.appended.AppendedBatch.single`, which it
    replaces where the kernels are compiled (the send lane asks it of every send)."""
    places = batch._places
    if len(places) == 1:
        place = places[0]
        if place[0] >= 0:
            return place, batch._host
    return None


# --- the index entry loop ---------------------------------------------------------------------


cdef int prefetch_heads(int32_t* heads, int64_t slots, list items, Py_ssize_t done,
                        Py_ssize_t nitems) except -1:
    """Ask for the slots of the batch's hashes before reading any: a slot table is megabytes
    written at random (RocketMQ's 5 million slots are 20 MB), so nearly every slot read misses
    the caches, and one after another the misses cost more than the rest of the loop."""
    cdef Py_ssize_t k, j, m
    cdef int64_t h
    for k in range(done, nitems):
        hashes = (<tuple>items[k])[0] if type(items[k]) is tuple else None
        if type(hashes) is not tuple:
            return 0  # not what the append path hands over: the loop reports it
        m = len(hashes)
        for j in range(m):
            if not PyLong_CheckExact(hashes[j]):
                return 0
            h = hashes[j]
            if INT32_MIN <= h <= INT32_MAX:
                h %= slots
                prefetch(&heads[h + slots if h < 0 else h])
    return 0


def put_entries(object mm, object slot, object dirty, Py_ssize_t slots, Py_ssize_t base,
                list items, Py_ssize_t done, Py_ssize_t count, Py_ssize_t used, Py_ssize_t limit,
                int32_t diff) -> tuple:
    """The twin of :func:`evq.backends.mmapfile.index_file.put_entries`.  It holds the GIL
    throughout: a flush copying a head chunk sees a put whole or not at all."""
    cdef Py_ssize_t at[3]
    at[0], at[1], at[2] = done, count, used
    write_entries(mm, slot, dirty, slots, base, items, at, limit, diff)
    return at[0], at[1], at[2]


cdef int write_entries(object mm, object slot, object dirty, Py_ssize_t slots, Py_ssize_t base,
                       list items, Py_ssize_t* at, Py_ssize_t limit, int32_t diff) except -1:
    """:func:`put_entries`'s loop; ``at`` holds its ``(done, count, used)``, moved on as they
    are written (also when a hash out of range stops it half way)."""
    cdef Py_buffer out, table, flags
    cdef uint8_t* p
    cdef uint8_t* chunk_flags
    cdef int32_t* heads
    cdef int64_t h, phys, s
    cdef int32_t head
    cdef Py_ssize_t k, j, m, nitems = len(items)
    if slots <= 0:
        raise ZeroDivisionError("an index file without slots")
    writable(mm, &out)
    try:
        writable(slot, &table)
        try:
            writable(dirty, &flags)
            try:
                if table.len < slots * 4 or table.itemsize != 4:
                    raise ValueError("slot must be the native int view of the slot table")
                if flags.len * INDEX_HEAD_CHUNK < INDEX_HEADER_SIZE + slots * 4:
                    raise ValueError("dirty must hold a flag for each head chunk")
                heads = <int32_t*>table.buf
                chunk_flags = <uint8_t*>flags.buf
                prefetch_heads(heads, slots, items, at[0], nitems)
                for k in range(at[0], nitems):
                    hashes, phys_obj = items[k]
                    m = len(hashes)
                    if at[1] + m > limit:
                        break
                    phys = phys_obj
                    for j in range(m):
                        h = hashes[j]
                        if not INT32_MIN <= h <= INT32_MAX:
                            raise struct_error("an index key hash out of the int32 range")
                        s = h % slots
                        if s < 0:  # Python's modulo: a negative hash's slot is positive too
                            s += slots
                        head = heads[s]
                        if not head:
                            at[2] += 1
                        if base + (at[1] + 1) * INDEX_ENTRY_SIZE > out.len:
                            raise IndexError("index entry past the end of its file")
                        p = <uint8_t*>out.buf + base + at[1] * INDEX_ENTRY_SIZE
                        put32(p, <uint32_t>h)
                        put64(p + 4, <uint64_t>phys)
                        put32(p + 12, <uint32_t>diff)
                        put32(p + 16, <uint32_t>head)
                        heads[s] = <int32_t>at[1]
                        chunk_flags[(INDEX_HEADER_SIZE + 4 * s) // INDEX_HEAD_CHUNK] = 1
                        at[1] += 1
                    at[0] += 1
            finally:
                PyBuffer_Release(&flags)
        finally:
            PyBuffer_Release(&table)
    finally:
        PyBuffer_Release(&out)
    return 0


cdef Py_ssize_t file_put(object f, list items, object store_ts) except -1:
    """The twin of :meth:`evq.backends.mmapfile.index_file.IndexFile.put` (reading and
    setting the same fields of ``f``), its entry loop :func:`write_entries`."""
    cdef Py_ssize_t at[3]
    cdef Py_ssize_t nitems = len(items), base, max_entries, end, limit
    cdef int64_t diff
    if get_field(f, IndexFile, IX_IMAGE, "_image") is None:
        f.take_head()
    file = get_field(f, IndexFile, IX_FILE, "file")
    base = get_field(f, IndexFile, IX_BASE, "base")
    max_entries = get_field(f, IndexFile, IX_MAX_ENTRIES, "max_entries")
    count = get_field(f, IndexFile, IX_COUNT, "count")
    if count == 1:
        set_field(f, IndexFile, IX_BEGIN_TS, "begin_ts", store_ts)
        set_field(f, IndexFile, IX_BEGIN_PHYS, "begin_phys", items[0][1])
    # any int, as the reference takes it
    seconds = (store_ts - get_field(f, IndexFile, IX_BEGIN_TS, "begin_ts")) // 1000
    diff = 0 if seconds < 0 else MAX_TIME_DIFF if seconds > MAX_TIME_DIFF else seconds
    at[0], at[1], at[2] = 0, count, 0
    try:
        while at[0] < nitems:
            allocated = get_field(file, MappedFile, MF_ALLOCATED, "allocated")
            limit = (allocated - base) // INDEX_ENTRY_SIZE  # entries whose blocks exist
            write_entries(get_field(file, MappedFile, MF_MM, "mm"),
                          get_field(f, IndexFile, IX_SLOT, "slot"),
                          get_field(f, IndexFile, IX_DIRTY, "_dirty"),
                          get_field(f, IndexFile, IX_SLOTS, "slots"), base, items, at,
                          min(max_entries, limit), <int32_t>diff)
            if at[0] == nitems:
                break
            end = at[1] + len(items[at[0]][0])
            if end > max_entries:  # the file is full: the rest go to the next one
                break
            file.reserve(base + end * INDEX_ENTRY_SIZE)
    finally:
        if at[0]:
            set_field(f, IndexFile, IX_COUNT, "count", at[1])
            set_field(f, IndexFile, IX_SLOTS_USED, "slots_used",
                      get_field(f, IndexFile, IX_SLOTS_USED, "slots_used") + at[2])
            set_field(f, IndexFile, IX_END_TS, "end_ts", store_ts)
            set_field(f, IndexFile, IX_END_PHYS, "end_phys", items[at[0] - 1][1])
    return at[0]


def index_put(object service, list items, object store_ts) -> None:
    """The twin of :meth:`evq.backends.mmapfile.index_file.IndexService.put`: the put into
    the last file here, whatever follows it (a new file, the next one built ahead) in
    :meth:`~evq.backends.mmapfile.index_file.IndexService.put_rest`."""
    put_index(service, items, store_ts)


cdef int put_index(object service, list items, object store_ts) except -1:
    """:func:`index_put`, called from C by :func:`append` too (a call through Python was
    about a tenth of a single send's append)."""
    cdef Py_ssize_t done
    if not items:
        return 0
    files = service.files
    if not files:
        service.put(items, store_ts)
        return 0
    f = files[len(files) - 1]
    done = file_put(f, items, store_ts)
    if done < len(items) or get_field(f, IndexFile, IX_COUNT, "count") >= service._spare_at:
        service.put_rest(f, items, done, store_ts)
    return 0


# --- the key lookup ----------------------------------------------------------------------------

cdef int64_t TIME_BOUND = 1 << 62  # past any entry's whole seconds in ms (at most 2^41)


def chain_offsets(object mm, Py_ssize_t base, int64_t count, int64_t max_entries,
                  int64_t slot_value, int64_t h, object begin_ts, object begin_ms,
                  object end_ms, object limit) -> list:
    """The twin of :func:`evq.backends.mmapfile.index_file.chain_offsets` (``count`` at least
    1, as a file's is).  The store times are compared as offsets from ``begin_ts``, which
    Python's ints give exactly whatever the three times are: an entry's is within 2^41 ms of
    it, so bounds clamped to 2^62 compare as the reference's do.  It holds the GIL
    throughout, as the reference's reads do: no other thread closes the mapping meanwhile."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef int64_t i = slot_value, prev, seen = 0, at, t
    cdef int64_t lo = max(-TIME_BOUND, min(begin_ms - 1000 - begin_ts, TIME_BOUND))
    cdef int64_t hi = max(-TIME_BOUND, min(end_ms - begin_ts, TIME_BOUND))
    cdef int64_t most = max(-1, min(limit, TIME_BOUND))
    cdef list out = []
    PyObject_GetBuffer(mm, &view, 0)
    try:
        p = <const uint8_t*>view.buf
        while i >= count:  # counted_head
            at = entry_at(base, i, view.len)
            prev = get32(p + at + 16)
            if prev >= i:
                return out
            i = prev
        while 0 < i < count and len(out) < most and seen < max_entries:
            at = entry_at(base, i, view.len)
            t = <int64_t>get32(p + at + 12) * 1000
            if get32(p + at) == h and lo <= t <= hi:
                out.append(get64(p + at + 4))
            prev = get32(p + at + 16)
            if prev >= i:
                break
            i = prev
            seen += 1
        return out
    finally:
        PyBuffer_Release(&view)


cdef inline int64_t entry_at(Py_ssize_t base, int64_t i, Py_ssize_t size) except -1:
    """Where entry ``i`` sits in a mapping of ``size`` bytes; struct's error past its end."""
    cdef int64_t at = base + i * INDEX_ENTRY_SIZE
    if at < 0 or at + INDEX_ENTRY_SIZE > size:
        raise struct_error(f"an index entry at {at} past a mapping of {size} bytes")
    return at



# --- the index head's write-back ---------------------------------------------------------------


def copy_runs(object image, list runs) -> list:
    """The twin of :func:`evq.backends.mmapfile.index_file.copy_runs` (the ranges'
    offsets not negative, as :func:`~evq.backends.mmapfile.index_file.take_runs` makes
    them): the copies' bytes objects are made holding the GIL, then filled without it, all
    in one stretch.  Puts go on meanwhile and may change a slot as it is copied: the copy
    holds the old value or the new one (an aligned 4-byte slot is one store and one load),
    and a put's chunk was marked dirty again after its flag was taken, so the next flush
    copies its slot anyway.  The exported buffer keeps ``image`` from closing meanwhile."""
    cdef Py_buffer view
    cdef Py_ssize_t n = len(runs), k, start, end
    cdef char** dst = NULL
    cdef Py_ssize_t* src = NULL
    cdef Py_ssize_t* size = NULL
    cdef list copies = []
    PyObject_GetBuffer(image, &view, 0)
    try:
        dst = <char**>PyMem_Malloc(max(n, 1) * sizeof(char*))
        src = <Py_ssize_t*>PyMem_Malloc(max(n, 1) * sizeof(Py_ssize_t))
        size = <Py_ssize_t*>PyMem_Malloc(max(n, 1) * sizeof(Py_ssize_t))
        if dst == NULL or src == NULL or size == NULL:
            raise MemoryError()
        for k in range(n):
            start, end = runs[k]
            if start < 0 or end < 0:
                raise ValueError(f"a head range with a negative offset: {runs[k]!r}")
            start, end = min(start, view.len), min(end, view.len)  # as slicing clamps
            end = max(start, end)
            copy = PyBytes_FromStringAndSize(NULL, end - start)
            dst[k], src[k], size[k] = PyBytes_AS_STRING(copy), start, end - start
            copies.append((runs[k][0], copy))
        with nogil:
            for k in range(n):
                memcpy(dst[k], <const char*>view.buf + src[k], size[k])
        return copies
    finally:
        PyMem_Free(dst)
        PyMem_Free(src)
        PyMem_Free(size)
        PyBuffer_Release(&view)


def write_runs(int fd, list runs, Py_ssize_t skip_below) -> None:
    """The twin of :func:`evq.backends.mmapfile.index_file.write_runs`: every write made in
    one stretch without the GIL, where the reference gives it up and takes it back for each
    (the broker's loop handed it over once a write).  A failed write raises its ``OSError``
    after the runs before it were written, as the reference's does."""
    cdef Py_ssize_t n = len(runs), k, got = 0
    cdef Py_buffer* views = <Py_buffer*>PyMem_Malloc(max(n, 1) * sizeof(Py_buffer))
    cdef int64_t* ats = <int64_t*>PyMem_Malloc(max(n, 1) * sizeof(int64_t))
    cdef int err = 0
    try:
        if views == NULL or ats == NULL:
            raise MemoryError()
        for k in range(n):
            at, data = runs[k]
            ats[k] = at
            PyObject_GetBuffer(data, &views[k], 0)
            got += 1
        with nogil:
            err = write_all(fd, views, ats, n, skip_below)
    finally:
        for k in range(got):
            PyBuffer_Release(&views[k])
        PyMem_Free(views)
        PyMem_Free(ats)
    if err:
        raise OSError(err, os.strerror(err))


cdef int write_all(int fd, Py_buffer* views, int64_t* ats, Py_ssize_t n,
                   Py_ssize_t skip_below) noexcept nogil:
    """Write each view at its offset, less what lies below ``skip_below``; 0, or the errno
    of the write that failed (one interrupted by a signal is made again, as ``os.pwrite``
    makes it)."""
    cdef Py_ssize_t k, done, wrote
    for k in range(n):
        done = max(0, skip_below - ats[k])
        while done < views[k].len:
            wrote = pwrite(fd, <const char*>views[k].buf + done, views[k].len - done,
                           ats[k] + done)
            if wrote < 0:
                if errno == EINTR:
                    continue
                return errno
            done += wrote
    return 0

# --- the pull ----------------------------------------------------------------------------------

# Bound by bind_reads(): what a pull answers with, and its rules' numbers.
cdef object ReadResult = None
cdef object status_outside = None
cdef object FOUND = None, OFFSET_FOUND_NULL = None, NO_MATCHED_MESSAGE = None
cdef int64_t SCAN_LIMIT = 0, BLANK_ENTRY_SIZE = 0
cdef bint reads_bound = False
cdef int64_t LIMIT_BOUND = 1 << 62


def bind_reads(*, read_result, get_status, outside, scan_limit, blank_entry_size) -> None:
    """Hand :func:`read_queue` the answer's class and the rules' numbers (called once, by
    evq.backends.mmapfile.kernels, beside :func:`bind`)."""
    global ReadResult, status_outside, FOUND, OFFSET_FOUND_NULL, NO_MATCHED_MESSAGE
    global SCAN_LIMIT, BLANK_ENTRY_SIZE, reads_bound
    ReadResult, status_outside = read_result, outside
    FOUND, OFFSET_FOUND_NULL = get_status.FOUND, get_status.OFFSET_FOUND_NULL
    NO_MATCHED_MESSAGE = get_status.NO_MATCHED_MESSAGE
    SCAN_LIMIT, BLANK_ENTRY_SIZE = scan_limit, blank_entry_size
    reads_bound = True


def read_queue(object log, object cq, object offset, object count_limit, object byte_limit,
               object tag_filter):
    """The twin of :meth:`MmapMessageLog._read_queue <evq.backends.mmapfile.store.
    MmapMessageLog._read_queue>`: :func:`evq.backends.rules.read_queue` with the store's
    ``entries`` (a copy of the queue file's entries, within one file) and ``view`` (a slice of
    a view of the segment last found, up to what readers may see) done here, a record at a
    time in C; the store installs it as its ``_read_queue`` where the kernels are compiled.
    A pull ran about 7,500 machine instructions a record in Python (callgrind, 32 a pull)."""
    cdef int64_t lo, hi, qo, scan_end, chunk, n, pos, rel, end, k, count, phys, tags_code
    cdef int64_t found = 0, total = 0, last_phys = -1, seg_start = 0, seg_limit = 0, at
    cdef int64_t entries_per_file, log_min
    cdef int32_t size
    cdef bint full = False, broke
    cdef const uint8_t* p
    if not (bound and reads_bound):
        raise RuntimeError("store_kernels.bind_reads was not called")
    # Any int, as the reference takes them: past these bounds a limit acts as they do (a
    # pull scans and takes far fewer entries).
    cdef int64_t max_count = max(-LIMIT_BOUND, min(count_limit, LIMIT_BOUND))
    cdef int64_t max_bytes = max(-LIMIT_BOUND, min(byte_limit, LIMIT_BOUND))
    lo, hi = cq.min_offset, log._queue_end(cq)
    outside = status_outside(offset, lo, hi)
    if outside is not None:
        return outside
    cdef int64_t start = offset  # within [lo, hi) from here
    qo = start
    log_min = log._log.min_offset
    entries_per_file = log.config.consume_queue_entries
    scan_end = min(hi, qo + max(SCAN_LIMIT, max_count))
    cdef list records = [], qos = []
    chunk = max(max_count, 32)  # most pulls are satisfied by the first few entries
    files, find = cq.files, log._log.find
    seg = None
    while not full and qo < scan_end:
        n = min(chunk, scan_end - qo)
        chunk = scan_end - qo
        # ConsumeQueue.entries(qo, n): copied, as the reference unpacks a copy.
        pos = qo * CQ_ENTRY_SIZE
        mf = files.find(pos)
        if mf is None:
            break
        rel = pos - <int64_t>mf.start
        end = min(<int64_t>mf.wrote, rel + n * CQ_ENTRY_SIZE)
        if end <= rel:
            break
        raw = mf.mm[rel:end]
        if len(raw) % CQ_ENTRY_SIZE:
            raise struct_error(
                f"iterative unpacking requires a buffer of a multiple of {CQ_ENTRY_SIZE} bytes")
        count = len(raw) // CQ_ENTRY_SIZE
        if count == 0:
            break
        p = <const uint8_t*>PyBytes_AS_STRING(raw)
        broke = False
        for k in range(count):
            phys = get64(p + k * CQ_ENTRY_SIZE)
            size = get32(p + k * CQ_ENTRY_SIZE + 8)
            if found >= max_count or (found and total + size > max_bytes):
                full = broke = True
                break
            qo += 1
            if size == BLANK_ENTRY_SIZE or phys < log_min:
                continue
            last_phys = phys
            if tag_filter is not None:
                tags_code = get64(p + k * CQ_ENTRY_SIZE + 12)
                if not tag_filter(tags_code):
                    continue
            # The reference's view(phys, size): the segment last found, else find it.
            at = phys - seg_start
            if seg is None or at < 0 or at + size > seg_limit:
                seg_file = find(phys)
                if seg_file is None:
                    continue
                seg_start, seg_limit = seg_file.start, seg_file.read_end
                seg = memoryview(seg_file.mm)
                at = phys - seg_start
                if at + size > seg_limit:
                    continue
            records.append(seg[at:at + size])
            qos.append(qo - 1)
            total += size
            found += 1
        if not broke:
            full = found >= max_count
    if records:
        status = FOUND
    elif qo == start:
        status = OFFSET_FOUND_NULL
        qo = min((start // entries_per_file + 1) * entries_per_file, hi)
    else:
        status = NO_MATCHED_MESSAGE
    return ReadResult(status, qo, lo, hi, records, qos, last_phys)
