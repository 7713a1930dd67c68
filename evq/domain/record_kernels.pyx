# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of the stored-record codec and of the send path: the same functions as the
pure-Python ones in :mod:`evq.domain.record` and :mod:`evq.domain.sent`, which stay the
reference and the fallback (see the end of each).

Only the per-record loops live here, typed and reading the buffer directly: compiling whole
modules as they are made the broker slower (bigger code, colder caches), so everything else
stays Python.  Each kernel must give what its pure twin gives, byte for byte and error type for
error type; tests/domain/test_record_kernels.py and tests/domain/test_sent.py check that over
the whole input space.

The module imports nothing from evq: :func:`bind` and :func:`bind_sent` hand it the classes
and helpers it builds on, once, when evq.domain.record and evq.domain.sent load it (so there
is no import cycle to get wrong).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_CheckExact
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from evq.byte_order cimport get16, get32, get64, put32, put64
from evq.slots cimport new_instance, set_new, slot_offset
from libc.stdint cimport (
    INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, int16_t, int32_t, int64_t, uint8_t, uint32_t,
    uint64_t,
)
from libc.stdio cimport snprintf
from libc.string cimport memchr, memcmp, memcpy, memset

import zlib

from evq.domain import checksum

cdef extern from "Python.h":
    ctypedef int (*descrsetfunc)(PyObject*, PyObject*, PyObject*) except -1
    ctypedef struct TypeSlots "PyTypeObject":
        descrsetfunc tp_descr_set
    TypeSlots* type_of "Py_TYPE"(object)
    object PyNumber_Index(object)
    enum: PyBUF_READ
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyLong_CheckExact(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL
    object PyUnicode_New(Py_ssize_t, Py_UCS4)
    void* PyUnicode_DATA(object)
    unsigned long long PyLong_AsUnsignedLongLong(object) except? <unsigned long long>-1

# Layout constants: the same numbers as evq.domain.record's (its module docstring draws them).
cdef enum:
    YIELD_EVERY_MASK = 4095  # the GIL is offered every 4,096 records of a long loop
    MAGIC_V1 = -626843481
    MAGIC_V2 = -626843477
    MIN_RECORD_SIZE = 91
    HEADER_V4_SIZE = 88
    BORN_HOST_AT = 48
    BORNHOST_V6 = 0x1 << 4
    STOREHOST_V6 = 0x1 << 5
    HOST_CACHE_LIMIT = 4096
    COMPRESSED = 0x1  # evq.domain.sysflag's
    COMPRESS_OVER = 4096  # evq.domain.message's: a batch entry's body this long is deflated
    TRANSACTION_MASK = 0xC
    TRANSACTION_ROLLBACK_TYPE = 0xC
    MAX_PROPERTIES_BYTES = 32767
    FEW_NAMES = 16  # up to this many properties, repeats are found by comparing pairs

# Bound by bind(): evq's classes and the pure helpers the kernels share.
cdef object RecordError = None
cdef object struct_error = None
cdef type Message = None
cdef type Fields = None
cdef type PutRecord = None
cdef list message_slots = []  # each class's slot descriptors, in the order set below
cdef list fields_slots = []
cdef Py_ssize_t PUT_RECORD_AT[7]  # where a PutRecord keeps each field, in the order set below
cdef object ip_text = None  # bytes -> str, the pure module's cached ipaddress round trip
cdef object encode_properties = None

cdef object crc32 = checksum.crc32
cdef object compress = zlib.compress
cdef object object_new = object.__new__
cdef dict v4_hosts = {}  # the 8 stored bytes as an int -> (ip, port)
cdef enum:
    TEXT_SLOTS = 17  # the topic, then the names of a record's first 16 properties
cdef list recent_texts = [(b"", "")] * TEXT_SLOTS  # (stored bytes, str), each replaced whole


def bind(*, record_error, message, fields, put_record, host_text, properties_text,
         struct_error_type) -> None:
    """Hand the kernels the classes they build and raise, and the pure helpers they share
    (called once by evq.domain.record)."""
    global RecordError, struct_error, Message, Fields, PutRecord, ip_text, encode_properties
    RecordError, struct_error = record_error, struct_error_type
    Message, Fields, PutRecord = message, fields, put_record
    ip_text, encode_properties = host_text, properties_text
    message_slots[:] = _slots(message, (
        "topic", "body", "flag", "properties", "queue_id", "sysflag", "born_timestamp",
        "born_host", "store_timestamp", "store_host", "reconsume_times",
        "prepared_transaction_offset", "queue_offset", "commit_log_offset", "body_crc"))
    fields_slots[:] = _slots(fields, (
        "size", "queue_id", "queue_offset", "physical_offset", "sysflag", "store_timestamp",
        "topic", "properties", "crc_ok"))
    names = ("data", "topic", "queue_id", "sysflag", "tags_code", "keys", "key_hashes")
    _slots(put_record, names)  # every field, in this order
    for k, name in enumerate(names):
        PUT_RECORD_AT[k] = slot_offset(put_record, name)


cdef list _slots(type cls, tuple names):
    # attrs' own __init__ of a slots class ends in these descriptors' __set__ (frozen classes
    # too); calling them directly builds an instance without running Python bytecode.  Every
    # field must be set, or an instance would lack it: a field added to the class and not
    # here stops the import (loudly, in every test) rather than build half-made objects.
    fields = [a.name for a in cls.__attrs_attrs__]
    if list(names) != fields:
        raise RuntimeError(f"{cls.__name__} fields changed: {fields}")
    return [cls.__dict__[name] for name in names]


cdef inline int set_slot(object descriptor, object obj, object value) except -1:
    return type_of(descriptor).tp_descr_set(<PyObject*>descriptor, <PyObject*>obj,
                                            <PyObject*>value)


# --- buffers ----------------------------------------------------------------------------------


cdef struct Bytes:
    const uint8_t* data
    Py_ssize_t size


cdef class Reader:
    """A read-only view of a bytes-like argument: bytes directly, anything else through the
    buffer protocol (released when the reader goes).  It holds the object too: a caller may
    keep readers of objects nothing else references (encode_batch's entries)."""

    cdef Py_buffer view
    cdef bint held
    cdef Bytes b
    cdef object obj

    def __cinit__(self, object obj):
        self.obj = obj
        if PyBytes_CheckExact(obj):
            self.b.data = <const uint8_t*>PyBytes_AS_STRING(obj)
            self.b.size = len(<bytes>obj)
        else:
            PyObject_GetBuffer(obj, &self.view, PyBUF_SIMPLE)
            self.held = True
            self.b.data = <const uint8_t*>self.view.buf
            self.b.size = self.view.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


# --- decoding ---------------------------------------------------------------------------------


cdef object utf8(const uint8_t* p, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)


cdef dict properties_of(const uint8_t* p, Py_ssize_t n):
    """decode_properties(bytes(p[:n]).decode()) without the whole string: the separators are
    ASCII, and no byte of a multi-byte UTF-8 character is below 0x80, so the text is valid
    UTF-8 exactly when every piece between separators is; each piece is decoded (and so
    checked) once, the ones the pure parser drops included."""
    cdef dict props = {}
    cdef const uint8_t* end = p + n
    cdef const uint8_t* piece_end
    cdef const uint8_t* sep
    cdef Py_ssize_t slot = 1
    while True:
        piece_end = <const uint8_t*>memchr(p, 2, end - p)
        if piece_end == NULL:
            piece_end = end
        sep = <const uint8_t*>memchr(p, 1, piece_end - p)
        if sep == NULL:
            utf8(p, piece_end - p)  # dropped, but the pure parser decoded it
        elif sep == p:
            utf8(sep + 1, piece_end - sep - 1)
        else:
            PyDict_SetItem(props, recalled(p, sep - p, slot),
                           utf8(sep + 1, piece_end - sep - 1))
            slot += 1
        if piece_end == end:
            return props
        p = piece_end + 1


cdef object recalled(const uint8_t* p, Py_ssize_t n, Py_ssize_t slot):
    """The text of the ``n`` bytes at ``p``, which come in the records at position ``slot``
    (0 the topic, 1.. the property names in order): the previous record's str object when
    the bytes repeat, as they do through a pull answer or a batch, so that the decoding and
    the hash (a dict key, a set member) are done once."""
    if slot >= TEXT_SLOTS:
        return utf8(p, n)
    cdef tuple cached = <tuple>recent_texts[slot]
    cdef bytes raw = <bytes>cached[0]
    if len(raw) == n and memcmp(PyBytes_AS_STRING(raw), p, n) == 0:
        return cached[1]
    text = utf8(p, n)
    recent_texts[slot] = (PyBytes_FromStringAndSize(<const char*>p, n), text)
    return text


cdef object host_at(const uint8_t* p, bint v6):
    """The (ip, port) stored at ``p``; IPv4 hosts come from a cache keyed by their 8 bytes."""
    cdef char text[16]
    cdef int n
    cdef object host
    cdef PyObject* cached
    if v6:
        return (ip_text(PyBytes_FromStringAndSize(<const char*>p, 16)),
                <uint32_t>get32(p + 16))
    key = <uint64_t>get64(p)
    cached = PyDict_GetItem(v4_hosts, key)
    if cached != NULL:
        return <object>cached
    n = snprintf(text, sizeof(text), "%u.%u.%u.%u", p[0], p[1], p[2], p[3])
    host = (text[:n].decode("ascii"), <uint32_t>get32(p + 4))
    if len(v4_hosts) >= HOST_CACHE_LIMIT:
        v4_hosts.clear()
    PyDict_SetItem(v4_hosts, key, host)
    return host


cdef struct Layout:
    # Where a record's variable-width fields are, as evq.domain.record._scan finds them.
    Py_ssize_t pos, size, born_at, store_at, after, body_at, topic_at, props_at
    int32_t flags, blen, tlen, plen


cdef int scan(const uint8_t* buf, Py_ssize_t end, Py_ssize_t pos, Layout* at) except -1:
    """The layout of the record at ``pos``: evq.domain.record._scan's checks, in its order,
    raising its errors (decoding the texts is the caller's)."""
    cdef const uint8_t* r = buf + pos
    cdef int32_t size, magic
    cdef Py_ssize_t rec_end, p, tlen_len
    if pos < 0 or pos + MIN_RECORD_SIZE > end:
        raise RecordError("truncated record header")
    size = get32(r)
    magic = get32(r + 4)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise RecordError(f"bad magic {<uint32_t>magic:#x}")
    if size < MIN_RECORD_SIZE or pos + size > end:
        raise RecordError(f"bad total size {size}")
    at.pos, at.size = pos, size
    rec_end = pos + size
    tlen_len = 1 if magic == MAGIC_V1 else 2
    at.flags = get32(r + 36)
    at.born_at = pos + BORN_HOST_AT
    at.store_at = at.born_at + (20 if at.flags & BORNHOST_V6 else 8) + 8
    at.after = at.store_at + (20 if at.flags & STOREHOST_V6 else 8)
    if at.after + 16 + tlen_len + 2 > rec_end:
        raise RecordError(f"total size {size} too small for the record header")
    at.blen = get32(buf + at.after + 12)
    at.body_at = at.after + 16
    if at.blen < 0 or at.body_at + at.blen + tlen_len + 2 > rec_end:
        raise RecordError(f"bad body length {at.blen}")
    p = at.body_at + at.blen
    at.tlen = buf[p] if magic == MAGIC_V1 else get16(buf + p)
    at.topic_at = p + tlen_len
    if at.tlen <= 0 or at.topic_at + at.tlen + 2 > rec_end:
        raise RecordError(f"bad topic length {at.tlen}")
    at.plen = get16(buf + at.topic_at + at.tlen)
    at.props_at = at.topic_at + at.tlen + 2
    if at.plen < 0 or at.props_at + at.plen != rec_end:
        raise RecordError("record fields do not add up to its total size")
    return 0


cdef object message_at(const uint8_t* buf, Py_ssize_t end, Py_ssize_t pos, bint check_crc):
    """The record at ``pos`` as a Message: evq.domain.record.decode."""
    cdef Layout at
    scan(buf, end, pos, &at)
    cdef const uint8_t* r = buf + pos
    try:
        topic = recalled(buf + at.topic_at, at.tlen, 0)
        properties = properties_of(buf + at.props_at, at.plen)
    except UnicodeDecodeError as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from None
    body = PyBytes_FromStringAndSize(<const char*>buf + at.body_at, at.blen)
    cdef int32_t crc = get32(r + 8)
    if check_crc and (crc32(body) & 0x7FFFFFFF) != crc:
        raise RecordError(f"body CRC mismatch at {pos}")
    m = object_new(Message)
    cdef list s = message_slots
    set_slot(s[0], m, topic)
    set_slot(s[1], m, body)
    set_slot(s[2], m, get32(r + 16))
    set_slot(s[3], m, properties)
    set_slot(s[4], m, get32(r + 12))
    set_slot(s[5], m, at.flags & ~(BORNHOST_V6 | STOREHOST_V6))
    set_slot(s[6], m, get64(r + 40))
    set_slot(s[7], m, host_at(buf + at.born_at, at.flags & BORNHOST_V6))
    set_slot(s[8], m, get64(buf + at.store_at - 8))
    set_slot(s[9], m, host_at(buf + at.store_at, at.flags & STOREHOST_V6))
    set_slot(s[10], m, get32(buf + at.after))
    set_slot(s[11], m, get64(buf + at.after + 4))
    set_slot(s[12], m, get64(r + 20))
    set_slot(s[13], m, get64(r + 28))
    set_slot(s[14], m, crc)
    return m


def read_fields(buf, Py_ssize_t pos, *, bint check_crc):
    """evq.domain.record.read_fields, compiled: the body is only CRC-checked, in place."""
    cdef Reader reader = Reader(buf)
    cdef const uint8_t* b = reader.b.data
    cdef Layout at
    scan(b, reader.b.size, pos, &at)
    try:
        topic = recalled(b + at.topic_at, at.tlen, 0)
        properties = utf8(b + at.props_at, at.plen)
    except UnicodeDecodeError as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from None
    # The view is over memory the reader holds exported until this call returns.
    ok = not check_crc or (crc32(PyMemoryView_FromMemory(
        <char*>b + at.body_at, at.blen, PyBUF_READ)) & 0x7FFFFFFF) == get32(b + pos + 8)
    f = object_new(Fields)
    cdef list s = fields_slots
    set_slot(s[0], f, at.size)
    set_slot(s[1], f, get32(b + pos + 12))
    set_slot(s[2], f, get64(b + pos + 20))
    set_slot(s[3], f, get64(b + pos + 28))
    set_slot(s[4], f, at.flags)
    set_slot(s[5], f, get64(b + at.store_at - 8))
    set_slot(s[6], f, topic)
    set_slot(s[7], f, properties)
    set_slot(s[8], f, ok)
    return f


def valid_run(buf, Py_ssize_t pos, Py_ssize_t end, int64_t phys, int64_t stop, *,
              bint check_crc, int64_t ceiling):
    """evq.domain.record.valid_run, compiled: no object per record but its two texts, which
    are decoded only to be checked."""
    cdef Reader reader = Reader(buf)
    cdef const uint8_t* b = reader.b.data
    cdef Layout at
    cdef int64_t latest = -1, ts
    if end > reader.b.size:
        end = reader.b.size
    while phys < stop:
        try:
            scan(b, end, pos, &at)
        except RecordError:
            break
        if get64(b + pos + 28) != phys:
            break
        try:
            recalled(b + at.topic_at, at.tlen, 0)
            utf8(b + at.props_at, at.plen)
        except UnicodeDecodeError:
            break
        # The view is over memory the reader holds exported until this call returns.
        if check_crc and (crc32(PyMemoryView_FromMemory(
                <char*>b + at.body_at, at.blen, PyBUF_READ)) & 0x7FFFFFFF) != get32(b + pos + 8):
            break
        ts = get64(b + at.store_at - 8)
        if latest < ts <= ceiling:
            latest = ts
        pos += at.size
        phys += at.size
    return phys, latest


def decode(buf, Py_ssize_t pos=0, *, bint check_crc=True):
    """evq.domain.record.decode, compiled."""
    cdef Reader reader = Reader(buf)
    return message_at(reader.b.data, reader.b.size, pos, check_crc)


def iter_records(buf, *, bint check_crc=True):
    """evq.domain.record.iter_records, compiled: a generator too, so the records before a bad
    one are yielded before it raises.  The buffer is taken again at each step, as the pure
    twin reads it: a suspended generator must not pin an export of a mapped file."""
    cdef Reader reader
    cdef Py_ssize_t pos = 0, size
    while True:
        reader = Reader(buf)
        if pos >= reader.b.size:
            return
        m = message_at(reader.b.data, reader.b.size, pos, check_crc)
        size = get32(reader.b.data + pos)
        reader = None
        yield m
        pos += size


def decode_records(buf, *, bint check_crc=True):
    """``list(iter_records(buf))``, without a generator step per record."""
    cdef Reader reader = Reader(buf)
    cdef Py_ssize_t pos = 0
    cdef list out = []
    while pos < reader.b.size:
        out.append(message_at(reader.b.data, reader.b.size, pos, check_crc))
        pos += get32(reader.b.data + pos)
    return out


def split_batch(body):
    """evq.domain.record.split_batch, compiled."""
    return entries_of(body, None)


def sent_batch(body, sysflag):
    """evq.domain.sent.sent_batch, compiled: split_batch's walk, each entry as a send's."""
    plain = sysflag & ~COMPRESSED
    return entries_of(body, (plain, plain | COMPRESSED))


cdef list entries_of(body, tuple sysflags):
    """A batch body's entries: ``(flag, body, properties)``, or with ``sysflags`` (the
    request's, without and with COMPRESSED) ``(flag, body as stored, sysflag, properties)``
    as a single send carries them, bodies of COMPRESS_OVER bytes or more deflated."""
    cdef Reader reader = Reader(body)
    cdef const uint8_t* buf = reader.b.data
    cdef Py_ssize_t pos = 0, end = reader.b.size, size, blen, plen
    cdef list entries = []
    while pos < end:
        if pos + 22 > end:
            raise RecordError(f"truncated batch entry at {pos}")
        size = get32(buf + pos)
        blen = get32(buf + pos + 16)
        if blen < 0 or size < 22 + blen or pos + size > end:
            raise RecordError(f"bad batch entry sizes at {pos}")
        plen = get16(buf + pos + 20 + blen)
        if plen < 0 or 22 + blen + plen != size:
            raise RecordError(f"bad batch properties length at {pos}")
        try:
            props = utf8(buf + pos + 22 + blen, plen)
        except UnicodeDecodeError as exc:
            raise RecordError(f"undecodable batch properties at {pos}: {exc}") from None
        entry_body = PyBytes_FromStringAndSize(<const char*>buf + pos + 20, blen)
        if sysflags is None:
            entries.append((get32(buf + pos + 12), entry_body, props))
        elif blen >= COMPRESS_OVER:
            entries.append((get32(buf + pos + 12), compress(entry_body, 5), sysflags[1], props))
        else:
            entries.append((get32(buf + pos + 12), entry_body, sysflags[0], props))
        pos += size
    return entries


# --- encoding ---------------------------------------------------------------------------------


cdef int64_t integer(object v, int64_t lo, int64_t hi) except? -1:
    """``v`` as struct packs an integer field: the same range check, the same error type."""
    cdef int overflow = 0
    cdef long long x
    if not PyLong_CheckExact(v):
        try:
            v = PyNumber_Index(v)
        except TypeError:
            raise struct_error("required argument is not an integer") from None
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or x < lo or x > hi:
        raise struct_error(f"argument out of range: {v}")
    return x


cdef int host_field(uint8_t* out, object host) except -1:
    """struct's ``8s``: bytes or bytearray, cut or zero-padded to 8 bytes."""
    cdef const char* src
    cdef Py_ssize_t n
    if PyBytes_CheckExact(host) or isinstance(host, bytes):
        src, n = PyBytes_AS_STRING(host), len(host)
    elif PyByteArray_CheckExact(host) or isinstance(host, bytearray):
        src, n = PyByteArray_AS_STRING(host), len(host)
    else:
        raise struct_error("argument for 's' must be a bytes object")
    if n > 8:
        n = 8
    memcpy(out, src, n)
    memset(out + n, 0, 8 - n)
    return 0


def pack_v4(topic, props, body, queue_id, flag, queue_offset, physical_offset, sysflag,
            born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
            prepared_offset):
    """evq.domain.record.pack_v4, compiled: the record written straight into its bytes."""
    cdef Reader t = Reader(topic)
    cdef Reader pr = Reader(props)
    cdef Reader b = Reader(body)
    cdef int64_t size = HEADER_V4_SIZE + b.b.size + 1 + t.b.size + 2 + pr.b.size
    cdef int64_t crc = crc32(body) & 0x7FFFFFFF
    cdef uint8_t header[HEADER_V4_SIZE]
    if size > INT32_MAX:
        raise struct_error(f"argument out of range: {size}")
    put32(header, <uint32_t>size)
    put32(header + 4, <uint32_t>MAGIC_V1)
    put32(header + 8, <uint32_t>crc)
    put32(header + 12, <uint32_t>integer(queue_id, INT32_MIN, INT32_MAX))
    put32(header + 16, <uint32_t>integer(flag, INT32_MIN, INT32_MAX))
    put64(header + 20, <uint64_t>integer(queue_offset, INT64_MIN, INT64_MAX))
    put64(header + 28, <uint64_t>integer(physical_offset, INT64_MIN, INT64_MAX))
    put32(header + 36, <uint32_t>integer(sysflag, INT32_MIN, INT32_MAX))
    put64(header + 40, <uint64_t>integer(born_timestamp, INT64_MIN, INT64_MAX))
    host_field(header + 48, born_host)
    put64(header + 56, <uint64_t>integer(store_timestamp, INT64_MIN, INT64_MAX))
    host_field(header + 64, store_host)
    put32(header + 72, <uint32_t>integer(reconsume_times, INT32_MIN, INT32_MAX))
    put64(header + 76, <uint64_t>integer(prepared_offset, INT64_MIN, INT64_MAX))
    put32(header + 84, <uint32_t>b.b.size)
    if t.b.size > 127:
        raise IndexError("list index out of range")  # the pure twin's length-byte table
    if pr.b.size > 32767:
        raise struct_error("'h' format requires -32768 <= number <= 32767")
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    memcpy(o, header, HEADER_V4_SIZE)
    o += HEADER_V4_SIZE
    memcpy(o, b.b.data, b.b.size)
    o += b.b.size
    o[0] = <uint8_t>t.b.size
    memcpy(o + 1, t.b.data, t.b.size)
    o += 1 + t.b.size
    o[0] = <uint8_t>(pr.b.size >> 8)
    o[1] = <uint8_t>pr.b.size
    memcpy(o + 2, pr.b.data, pr.b.size)
    return out


def encode_batch(messages):
    """evq.domain.record.encode_batch, compiled: each entry's fields checked and measured,
    then the body allocated once and written in place."""
    cdef list entries = []
    cdef Py_ssize_t total = 0, size
    cdef Reader body
    for m in messages:
        props = (<str>encode_properties(m.properties)).encode()
        body = Reader(m.body)
        size = 20 + body.b.size + 2 + len(props)
        if size > INT32_MAX:
            raise struct_error(f"argument out of range: {size}")
        flag = integer(m.flag, INT32_MIN, INT32_MAX)
        if len(props) > 32767:
            raise struct_error("'h' format requires -32768 <= number <= 32767")
        entries.append((body, props, flag))
        total += size
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t plen
    for body, props, flag in entries:
        plen = len(<bytes>props)
        put32(o, <uint32_t>(20 + body.b.size + 2 + plen))
        put32(o + 4, 0)
        put32(o + 8, 0)
        put32(o + 12, <uint32_t><int64_t>flag)
        put32(o + 16, <uint32_t>body.b.size)
        memcpy(o + 20, body.b.data, body.b.size)
        o += 20 + body.b.size
        o[0] = <uint8_t>(plen >> 8)
        o[1] = <uint8_t>plen
        memcpy(o + 2, PyBytes_AS_STRING(props), plen)
        o += 2 + plen
    return out


# --- message ids ------------------------------------------------------------------------------


cdef const char* HEX_DIGITS = b"0123456789ABCDEF"


def offset_msg_ids(bytes store_host not None, offsets):
    """evq.domain.record.offset_msg_ids, compiled: the hex written straight into the str."""
    cdef Reader host = Reader(store_host)
    cdef list offs = list(offsets)
    cdef Py_ssize_t n = len(offs), width = 2 * (host.b.size + 8), total, i, k
    cdef list stored = [offset >= 0 for offset in offs]
    cdef uint8_t raw[8]
    cdef uint8_t* o
    cdef unsigned long long v
    total = max(n - 1, 0) + width * sum(stored)
    text = PyUnicode_New(total, 127)
    o = <uint8_t*>PyUnicode_DATA(text)
    for i in range(n):
        if i:
            o[0] = c","
            o += 1
        if not stored[i]:
            continue
        v = PyLong_AsUnsignedLongLong(offs[i])  # OverflowError past 8 bytes, as to_bytes
        put64(raw, v)
        for k in range(host.b.size):
            o[0], o[1] = HEX_DIGITS[host.b.data[k] >> 4], HEX_DIGITS[host.b.data[k] & 15]
            o += 2
        for k in range(8):
            o[0], o[1] = HEX_DIGITS[raw[k] >> 4], HEX_DIGITS[raw[k] & 15]
            o += 2
    return text


# --- the plain put path -----------------------------------------------------------------------
#
# evq.domain.sent.plain_records, compiled: a send's messages that need no routing, from their
# properties strings straight to PutRecords, one pass over each string.  The rules are that
# function's (its pure twin is built from plain_message, pack_v4 and put_record_of); the strings
# are read as UTF-8, where the separators are single ASCII bytes that no multi-byte character
# contains, so splitting the bytes splits the text.

# Bound by bind_sent(): the names the path looks for, and the refusals it raises.
cdef bytes WAIT_NAME = b"", TAGS_NAME = b"", KEYS_NAME = b"", UNIQ_KEY_NAME = b""
cdef str UNIQ_KEY_TEXT = ""
cdef type KeyedSend = None
cdef tuple routed_names = ()
cdef object body_too_large = None  # (size, limit) -> the exception to raise
cdef object properties_too_long = None  # () -> the exception to raise
cdef uint32_t crc_table[256]


def bind_sent(*, routed, wait, tags, keys, uniq_key, body_error, properties_error,
              keyed_send) -> None:
    """Hand the plain path the property names it acts on, the refusals it raises and the
    KeyedSend class it reads (called once by evq.domain.sent)."""
    global WAIT_NAME, TAGS_NAME, KEYS_NAME, UNIQ_KEY_NAME, UNIQ_KEY_TEXT, routed_names
    global body_too_large, properties_too_long, KeyedSend
    UNIQ_KEY_TEXT, KeyedSend = uniq_key, keyed_send
    routed_names = tuple(sorted(name.encode() for name in routed))
    WAIT_NAME, TAGS_NAME, KEYS_NAME = wait.encode(), tags.encode(), keys.encode()
    UNIQ_KEY_NAME = uniq_key.encode()
    body_too_large, properties_too_long = body_error, properties_error


cdef void fill_crc_table() noexcept:
    # zlib's CRC-32 (reflected 0xEDB88320): a table, as index keys are short and the call
    # into zlib costs more than hashing one.
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        crc_table[i] = c


fill_crc_table()


cdef inline uint32_t crc32_more(uint32_t crc, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """``zlib.crc32(p[:n], crc)``."""
    cdef Py_ssize_t i
    crc = ~crc
    for i in range(n):
        crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8)
    return ~crc


cdef int32_t java_hash_utf8(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Java's ``String.hashCode`` of the valid UTF-8 text ``p[:n]``: over UTF-16 code units,
    so a character past U+FFFF counts as its two surrogates (evq.domain.hashing.java_hash)."""
    cdef uint32_t h = 0, cp
    cdef Py_ssize_t i = 0
    cdef uint8_t c
    while i < n:
        c = p[i]
        if c < 0x80:
            cp = c
            i += 1
        elif c < 0xE0:
            cp = (<uint32_t>(c & 0x1F) << 6) | (p[i + 1] & 0x3F)
            i += 2
        elif c < 0xF0:
            cp = (<uint32_t>(c & 0x0F) << 12) | (<uint32_t>(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F)
            i += 3
        else:
            cp = ((<uint32_t>(c & 0x07) << 18) | (<uint32_t>(p[i + 1] & 0x3F) << 12)
                  | (<uint32_t>(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F)) - 0x10000
            h = 31 * h + (0xD800 + (cp >> 10))
            cp = 0xDC00 + (cp & 0x3FF)
            i += 4
        h = 31 * h + cp
    return <int32_t>h


cdef struct Span:
    const uint8_t* at
    Py_ssize_t size


cdef struct Parsed:
    # One sent properties string read for the plain path.  Offsets are in the string with its
    # last separator (added when the producer left it off, as Java does).
    const uint8_t* text
    Py_ssize_t size, stored_size
    bint add_separator, wait
    Py_ssize_t wait_at, wait_end  # the WAIT entry, separator included; wait_at -1: none
    Span tags, keys, uniq_key  # at NULL: the property is absent


cdef inline bint named(const uint8_t* p, Py_ssize_t n, bytes name) noexcept:
    return n == len(name) and memcmp(p, PyBytes_AS_STRING(name), n) == 0


cdef inline bint is_false(const uint8_t* p, Py_ssize_t n) noexcept:
    # ``value.lower() == "false"``: no character outside ASCII lowercases to one of its letters.
    return (n == 5 and (p[0] | 0x20) == c"f" and (p[1] | 0x20) == c"a"
            and (p[2] | 0x20) == c"l" and (p[3] | 0x20) == c"s" and (p[4] | 0x20) == c"e")


cdef bint read_plain(object text, Parsed* e, Py_ssize_t cluster_size) except -1:
    """Read ``text`` into ``e``; False when the message needs the Message path (the rules of
    evq.domain.sent.plain_message: every entry ``name\x01value`` with one name-value
    separator and a non-empty name, names unique, none of them a routing property, no lone
    surrogate)."""
    cdef Py_ssize_t n, p = 0, q, last, count = 0, i, name_size
    cdef const uint8_t* t
    cdef const uint8_t* sep
    cdef const uint8_t* end
    cdef Span names[FEW_NAMES]
    cdef set seen = None
    try:
        t = <const uint8_t*>PyUnicode_AsUTF8AndSize(text, &n)
    except UnicodeEncodeError:
        return False  # a lone surrogate (a JSON header may escape one)
    e.text, e.size, e.wait, e.wait_at = t, n, True, -1
    e.tags.at = e.keys.at = e.uniq_key.at = NULL
    e.add_separator = n > 0 and t[n - 1] != 2
    e.stored_size = cluster_size
    if n == 0:
        return True
    last = n if e.add_separator else n - 1  # where the last entry ends
    while True:
        end = <const uint8_t*>memchr(t + p, 2, last - p)
        q = last if end == NULL else end - t
        sep = <const uint8_t*>memchr(t + p, 1, q - p)
        if sep == NULL or sep == t + p or memchr(sep + 1, 1, t + q - sep - 1) != NULL:
            return False
        name_size = sep - t - p
        for i in range(len(routed_names)):
            if named(t + p, name_size, <bytes>routed_names[i]):
                return False
        if count < FEW_NAMES:
            for i in range(count):
                if names[i].size == name_size and memcmp(names[i].at, t + p, name_size) == 0:
                    return False
            names[count].at, names[count].size = t + p, name_size
        else:  # many names: a set, not pairs
            if seen is None:
                seen = set()
                for i in range(FEW_NAMES):
                    seen.add(PyBytes_FromStringAndSize(<const char*>names[i].at, names[i].size))
            name = PyBytes_FromStringAndSize(<const char*>t + p, name_size)
            if name in seen:
                return False
            seen.add(name)
        count += 1
        if named(t + p, name_size, WAIT_NAME):
            e.wait_at, e.wait_end = p, q + 1
            e.wait = not is_false(sep + 1, t + q - sep - 1)
        elif named(t + p, name_size, TAGS_NAME):
            e.tags.at, e.tags.size = sep + 1, t + q - sep - 1
        elif named(t + p, name_size, KEYS_NAME):
            e.keys.at, e.keys.size = sep + 1, t + q - sep - 1
        elif named(t + p, name_size, UNIQ_KEY_NAME):
            e.uniq_key.at, e.uniq_key.size = sep + 1, t + q - sep - 1
        if q == last:
            break
        p = q + 1
    e.stored_size += e.size + e.add_separator
    if e.wait_at >= 0:
        e.stored_size -= e.wait_end - e.wait_at
    return True


cdef uint8_t* put_stored_properties(uint8_t* o, const Parsed* e, const uint8_t* cluster,
                                    Py_ssize_t cluster_size) noexcept:
    """The string as stored: as sent, its last separator added, WAIT's entry taken out and
    CLUSTER's appended.  Returns the end of what it wrote."""
    if e.wait_at < 0:
        memcpy(o, e.text, e.size)
        o += e.size
    else:
        memcpy(o, e.text, e.wait_at)
        o += e.wait_at
        if e.wait_end < e.size:
            memcpy(o, e.text + e.wait_end, e.size - e.wait_end)
            o += e.size - e.wait_end
    if e.add_separator and (e.wait_at < 0 or e.wait_end <= e.size):
        o[0] = 2
        o += 1
    memcpy(o, cluster, cluster_size)
    return o + cluster_size


cdef tuple index_keys(const Parsed* e, bint rolled_back, uint32_t seed):
    """``(keys, key hashes)``: evq.domain.record.index_keys_of and put_record_of's hashes."""
    cdef list keys = []
    cdef list hashes = []
    cdef const uint8_t* p
    cdef const uint8_t* end
    cdef const uint8_t* space
    if rolled_back:
        return (), ()
    if e.uniq_key.at != NULL and e.uniq_key.size:
        keys.append(utf8(e.uniq_key.at, e.uniq_key.size))
        hashes.append(crc32_more(seed, e.uniq_key.at, e.uniq_key.size) & 0x7FFFFFFF)
    if e.keys.at != NULL:
        p, end = e.keys.at, e.keys.at + e.keys.size
        while p < end:
            space = <const uint8_t*>memchr(p, 32, end - p)
            if space == NULL:
                space = end
            if space > p:
                keys.append(utf8(p, space - p))
                hashes.append(crc32_more(seed, p, space - p) & 0x7FFFFFFF)
            p = space + 1
    if not keys:
        return (), ()
    return tuple(keys), tuple(hashes)


cdef struct Terms:
    # What every record of one send shares: its topic, the CLUSTER entry appended to its
    # properties, the index keys' hash seed, and the header fields that are the call's (the
    # queue, born time and host, store host, reconsume times), checked once, by the first
    # record, in struct's order among its own fields: the same error first.
    const uint8_t* topic_raw
    Py_ssize_t topic_size
    const uint8_t* cluster
    Py_ssize_t cluster_size
    uint32_t seed
    bint checked
    uint8_t header[HEADER_V4_SIZE]


cdef int read_terms(Terms* t, str topic, str cluster_entry) except -1:
    """``t`` for a send to ``topic`` (False: the cluster entry cannot be stored, no plain
    path)."""
    try:
        t.cluster = <const uint8_t*>PyUnicode_AsUTF8AndSize(cluster_entry, &t.cluster_size)
    except UnicodeEncodeError:
        return False
    t.topic_raw = <const uint8_t*>PyUnicode_AsUTF8AndSize(topic, &t.topic_size)
    t.seed = crc32_more(crc32_more(0, t.topic_raw, t.topic_size), <const uint8_t*>b"#", 1)
    t.checked = False
    memset(t.header, 0, HEADER_V4_SIZE)
    put32(t.header + 4, <uint32_t>MAGIC_V1)
    return True


cdef bytes record_data(Terms* t, const Parsed* e, object body, object flag, object sysflag,
                       object queue_id, object born_timestamp, object born_host,
                       object store_host, object reconsume_times, int32_t* sysflag_value):
    """The stored record of one plain message (evq.domain.record.pack_v4 of what
    evq.domain.sent.plain_message keeps), written straight into its bytes; its SYSFLAG as
    sent in ``sysflag_value``."""
    cdef Py_ssize_t plen = e.stored_size, size, body_size
    cdef const uint8_t* body_data
    cdef Reader reader = None
    cdef uint8_t* h = t.header
    cdef uint8_t* o
    cdef int32_t flag_value
    if plen > MAX_PROPERTIES_BYTES:
        raise properties_too_long()
    if PyBytes_CheckExact(body):
        body_data, body_size = <const uint8_t*>PyBytes_AS_STRING(body), len(<bytes>body)
    else:
        reader = Reader(body)
        body_data, body_size = reader.b.data, reader.b.size
    size = HEADER_V4_SIZE + body_size + 1 + t.topic_size + 2 + plen
    if size > INT32_MAX:
        raise struct_error(f"argument out of range: {size}")
    put32(h, <uint32_t>size)
    put32(h + 8, <uint32_t>(crc32(body) & 0x7FFFFFFF))
    # Each field checked as struct checks it, in its order: the same error first.
    if not t.checked:
        put32(h + 12, <uint32_t>integer(queue_id, INT32_MIN, INT32_MAX))
    flag_value = <int32_t>integer(flag, INT32_MIN, INT32_MAX)
    sysflag_value[0] = <int32_t>integer(sysflag, INT32_MIN, INT32_MAX)
    if not t.checked:
        put64(h + 40, <uint64_t>integer(born_timestamp, INT64_MIN, INT64_MAX))
        host_field(h + 48, born_host)
        host_field(h + 64, store_host)
        put32(h + 72, <uint32_t>integer(reconsume_times, INT32_MIN, INT32_MAX))
        if t.topic_size > 127:
            raise IndexError("list index out of range")  # the pure twin's length-byte table
        t.checked = True
    put32(h + 16, <uint32_t>flag_value)
    put32(h + 36, <uint32_t>(sysflag_value[0] & ~(BORNHOST_V6 | STOREHOST_V6)))
    put32(h + 84, <uint32_t>body_size)
    data = PyBytes_FromStringAndSize(NULL, size)
    o = <uint8_t*>PyBytes_AS_STRING(data)
    memcpy(o, h, HEADER_V4_SIZE)
    o += HEADER_V4_SIZE
    memcpy(o, body_data, body_size)
    o += body_size
    o[0] = <uint8_t>t.topic_size
    memcpy(o + 1, t.topic_raw, t.topic_size)
    o += 1 + t.topic_size
    o[0] = <uint8_t>(plen >> 8)
    o[1] = <uint8_t>plen
    put_stored_properties(o + 2, e, t.cluster, t.cluster_size)
    return data


cdef object new_put_record(object data, object topic, object queue_id, object sysflag,
                           object tags_code, object keys, object hashes):
    """``PutRecord(...)``, allocated by its type and its slots set directly (see
    PUT_RECORD_AT): one is built per message sent."""
    r = new_instance(PutRecord)
    set_new(r, PUT_RECORD_AT[0], data)
    set_new(r, PUT_RECORD_AT[1], topic)
    set_new(r, PUT_RECORD_AT[2], queue_id)
    set_new(r, PUT_RECORD_AT[3], sysflag)
    set_new(r, PUT_RECORD_AT[4], tags_code)
    set_new(r, PUT_RECORD_AT[5], keys)
    set_new(r, PUT_RECORD_AT[6], hashes)
    return r


cdef inline void offer_gil(Py_ssize_t i) noexcept:
    if i & YIELD_EVERY_MASK == YIELD_EVERY_MASK:
        # A large batch's records are made in a worker thread (evq.net.execution): let a
        # thread waiting for the GIL (the event loop) in every few thousand records, or it
        # waits out the whole batch (265 ms for 190,650 empty ones).
        with nogil:
            pass


def plain_records(sent, str topic, queue_id, born_timestamp, born_host, store_host,
                  reconsume_times, str cluster_entry, Py_ssize_t max_body):
    """evq.domain.sent.plain_records, compiled."""
    if type(sent) is KeyedSend:
        return keyed_records(sent, topic, queue_id, born_timestamp, born_host, store_host,
                             reconsume_times, cluster_entry, max_body)
    # Our own list: it keeps every entry (and the strings ``parsed`` points into) alive while
    # the CRC function releases the GIL on a large body, and another thread may then change
    # the caller's.
    cdef list entries = list(sent)
    cdef Py_ssize_t count = len(entries), i, size
    cdef Parsed* parsed
    cdef Parsed* e
    cdef tuple entry
    cdef Terms t
    cdef int32_t sysflag
    cdef bint wait = False
    cdef list records = []
    if not read_terms(&t, topic, cluster_entry):
        return None
    parsed = <Parsed*>PyMem_Malloc(count * sizeof(Parsed) + 1)
    if parsed == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            if not read_plain((<tuple?>entries[i])[3], &parsed[i], t.cluster_size):
                return None
            wait |= parsed[i].wait
        for i in range(count):
            size = len((<tuple>entries[i])[1])
            if size > max_body:
                raise body_too_large(size, max_body)
        for i in range(count):
            offer_gil(i)
            e = &parsed[i]
            entry = <tuple>entries[i]
            data = record_data(&t, e, entry[1], entry[0], entry[2], queue_id, born_timestamp,
                               born_host, store_host, reconsume_times, &sysflag)
            keys, hashes = index_keys(
                e, (sysflag & TRANSACTION_MASK) == TRANSACTION_ROLLBACK_TYPE, t.seed)
            records.append(new_put_record(
                data, topic, queue_id, entry[2],
                java_hash_utf8(e.tags.at, e.tags.size) if e.tags.at != NULL else 0,
                keys, hashes))
        return records, wait
    finally:
        PyMem_Free(parsed)


cdef object keyed_records(object sent, str topic, queue_id, born_timestamp, born_host,
                          store_host, reconsume_times, str cluster_entry, Py_ssize_t max_body):
    """plain_records of a KeyedSend (evq.domain.sent), read as it is: its properties string,
    with the first key, is read once, and each message's differs from it only in the key's
    last four hex digits (its counter), written into one copy of the string in turn; the
    index keys of the shared KEYS are split and hashed once."""
    cdef list bodies = [b.encode() if isinstance(b, str) else b for b in sent.bodies]
    cdef Py_ssize_t count = len(bodies), i, size, at
    cdef Parsed e
    cdef Terms t
    cdef uint8_t* text
    cdef unsigned long first
    cdef int32_t sysflag
    cdef list records = []
    run = sent.keys
    if count != run.count:
        raise ValueError(f"{count} bodies for {run.count} keys")
    if count == 0:  # as the pure path finds nothing to read, it only encodes the topic
        topic.encode()
        return [], False
    if not read_terms(&t, topic, cluster_entry):
        return None
    first = (run.first & 0xFFFF)
    head = f"{sent.text}{UNIQ_KEY_TEXT}\x01{run.head}{counter_hex(first)}\x02"
    if not read_plain(head, &e, t.cluster_size):
        return None
    # Our own copy of the string, which ``e`` then reads: each message's counter goes in it,
    # before the last separator.  The counter is in the last entry's value, and that entry is
    # UNIQ_KEY's, or (a shared string without its last separator) one whose name ends in
    # UNIQ_KEY, which the index does not read.
    own = PyBytes_FromStringAndSize(<const char*>e.text, e.size)
    text = <uint8_t*>PyBytes_AS_STRING(own)
    at = e.size - 5
    e.tags.at = text + (e.tags.at - e.text) if e.tags.at != NULL else NULL
    e.keys.at = text + (e.keys.at - e.text) if e.keys.at != NULL else NULL
    e.uniq_key.at = text + (e.uniq_key.at - e.text) if e.uniq_key.at != NULL else NULL
    e.text = text
    sysflags = [COMPRESSED if len(b) >= COMPRESS_OVER else 0 for b in bodies]
    bodies = [compress(b, 5) if f else b for b, f in zip(bodies, sysflags)]
    for i in range(count):
        size = len(bodies[i])
        if size > max_body:
            raise body_too_large(size, max_body)
    tags = java_hash_utf8(e.tags.at, e.tags.size) if e.tags.at != NULL else 0
    shared_keys, shared_hashes = index_keys(&e, False, t.seed)
    keys, hashes = list(shared_keys), list(shared_hashes)  # the UNIQ_KEY first, if any
    for i in range(count):
        offer_gil(i)
        put_counter(text + at, first + i)
        data = record_data(&t, &e, bodies[i], 0, sysflags[i], queue_id, born_timestamp,
                           born_host, store_host, reconsume_times, &sysflag)
        if e.uniq_key.at != NULL:
            keys[0] = utf8(e.uniq_key.at, e.uniq_key.size)
            hashes[0] = crc32_more(t.seed, e.uniq_key.at, e.uniq_key.size) & 0x7FFFFFFF
            shared_keys, shared_hashes = tuple(keys), tuple(hashes)
        records.append(new_put_record(data, topic, queue_id, sysflags[i], tags, shared_keys,
                                      shared_hashes))
    return records, e.wait


cdef void put_counter(uint8_t* p, unsigned long n) noexcept:
    """The four hex digits of a key's counter (evq.domain.ids._counter_hex: its low 16 bits)."""
    p[0] = HEX_DIGITS[(n >> 12) & 0xF]
    p[1] = HEX_DIGITS[(n >> 8) & 0xF]
    p[2] = HEX_DIGITS[(n >> 4) & 0xF]
    p[3] = HEX_DIGITS[n & 0xF]


cdef str counter_hex(unsigned long n):
    cdef char digits[4]
    put_counter(<uint8_t*>digits, n)
    return digits[:4].decode("ascii")
