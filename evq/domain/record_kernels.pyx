# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of the stored-record codec: the same functions as the pure-Python ones in
:mod:`evq.domain.record`, which stay the reference and the fallback (see that module's end).

Only the per-record loops live here, typed and reading the buffer directly: compiling whole
modules as they are made the broker slower (bigger code, colder caches), so everything else
stays Python.  Each kernel must give what its pure twin gives, byte for byte and error type for
error type; tests/domain/test_record_kernels.py checks that over the whole input space.

The module imports nothing from evq: :func:`bind` hands it the classes and helpers it builds
on, once, when evq.domain.record loads it (so there is no import cycle to get wrong).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_CheckExact
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport (
    INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, int16_t, int32_t, int64_t, uint8_t, uint32_t,
    uint64_t,
)
from libc.stdio cimport snprintf
from libc.string cimport memchr, memcmp, memcpy, memset

import zlib

cdef extern from "Python.h":
    ctypedef int (*descrsetfunc)(PyObject*, PyObject*, PyObject*) except -1
    ctypedef struct TypeSlots "PyTypeObject":
        descrsetfunc tp_descr_set
    TypeSlots* type_of "Py_TYPE"(object)
    object PyNumber_Index(object)
    enum: PyBUF_READ
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyLong_CheckExact(object)

# Layout constants: the same numbers as evq.domain.record's (its module docstring draws them).
cdef enum:
    MAGIC_V1 = -626843481
    MAGIC_V2 = -626843477
    MIN_RECORD_SIZE = 91
    HEADER_V4_SIZE = 88
    BORN_HOST_AT = 48
    BORNHOST_V6 = 0x1 << 4
    STOREHOST_V6 = 0x1 << 5
    HOST_CACHE_LIMIT = 4096

# Bound by bind(): evq's classes and the pure helpers the kernels share.
cdef object RecordError = None
cdef object struct_error = None
cdef type Message = None
cdef type Fields = None
cdef list message_slots = []  # each class's slot descriptors, in the order set below
cdef list fields_slots = []
cdef object ip_text = None  # bytes -> str, the pure module's cached ipaddress round trip
cdef object encode_properties = None

cdef object crc32 = zlib.crc32
cdef object object_new = object.__new__
cdef dict v4_hosts = {}  # the 8 stored bytes as an int -> (ip, port)
cdef enum:
    TEXT_SLOTS = 17  # the topic, then the names of a record's first 16 properties
cdef list recent_texts = [(b"", "")] * TEXT_SLOTS  # (stored bytes, str), each replaced whole


def bind(*, record_error, message, fields, host_text, properties_text,
         struct_error_type) -> None:
    """Hand the kernels the classes they build and raise, and the pure helpers they share
    (called once by evq.domain.record)."""
    global RecordError, struct_error, Message, Fields, ip_text, encode_properties
    RecordError, struct_error = record_error, struct_error_type
    Message, Fields = message, fields
    ip_text, encode_properties = host_text, properties_text
    message_slots[:] = _slots(message, (
        "topic", "body", "flag", "properties", "queue_id", "sysflag", "born_timestamp",
        "born_host", "store_timestamp", "store_host", "reconsume_times",
        "prepared_transaction_offset", "queue_offset", "commit_log_offset", "body_crc"))
    fields_slots[:] = _slots(fields, (
        "size", "queue_id", "queue_offset", "physical_offset", "sysflag", "store_timestamp",
        "topic", "properties", "crc_ok"))


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


# --- big-endian reads and writes ------------------------------------------------------------


cdef inline int32_t get32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8)
                     | p[3])


cdef inline int16_t get16(const uint8_t* p) noexcept nogil:
    return <int16_t>((p[0] << 8) | p[1])


cdef inline int64_t get64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>get32(p) << 32) | <uint32_t>get32(p + 4))


cdef inline void put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = v >> 16
    p[2] = v >> 8
    p[3] = v


cdef inline void put64(uint8_t* p, uint64_t v) noexcept nogil:
    put32(p, <uint32_t>(v >> 32))
    put32(p + 4, <uint32_t>v)


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
        entries.append((get32(buf + pos + 12),
                        PyBytes_FromStringAndSize(<const char*>buf + pos + 20, blen), props))
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
