# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of a producer's single send: the same functions as the pure-Python ones in
:mod:`evq.client.producer` (``_send_request`` and ``_send_result``), which stay the reference
and the fallback (see that module's end).

A sync send's round trip is the client's CPU plus the broker's, and on the client most of it
was Python stepping through small functions (issue 18): the header's fields as strings, the
properties string and its separator checks, the command, its JSON header through a dict and
orjson, then the answer's header object and the result.  Here the request's command and its
whole SEND_MESSAGE_V2 frame are made in one call, the header's JSON written straight into the
frame, and the answer's three fields read into the result in another.

Only the common case lives here: a single message whose fields are of the types a producer
makes (``str`` topic, group and properties, ``bytes`` body) to a topic that is not a retry
topic, with properties the properties string can carry.  Anything else (a retry topic's
``maxReconsumeTimes``, a property holding a separator, a value of another type, a header past
24 bits) is handed to the pure function on the same input, so it ends exactly as there, error
for error; tests/client/test_send_kernels.py checks the two give the same frame, command and
result over every legal character and size.

The module imports nothing from evq: :func:`bind` hands it the classes, constants and pure
functions it builds on, once, when evq.client.producer loads it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject
from evq.byte_order cimport put32
from libc.stdint cimport INT32_MAX, uint8_t, uint32_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    bint PyLong_CheckExact(object)
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    bint PyUnicode_IS_ASCII(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index)
    int PyObject_GenericSetAttr(object, object, object) except -1

cdef enum:
    HEADER_LENGTH_MASK = 0xFFFFFF
    FIELDS = 11  # a..k: the V2 header's one-letter fields a single send carries

cdef const char* HEX = b"0123456789abcdef"  # json's \u escapes are lower case
cdef const char* SHORT_ESCAPES = b"btn?fr"  # \b \t \n \f \r, by the character less 8

# Bound by bind(): evq's classes and constants, and the pure functions fallen back on.
cdef type Command = None
cdef type Result = None
cdef object object_new = object.__new__
cdef object Queue = None
cdef object pure_request = None
cdef object pure_result = None
cdef object parse_int = None
cdef object parse_long = None
cdef object send_code = None
cdef object language = None
cdef object version = None
cdef object json_type = None
cdef object sysflag_mask = None
cdef str auto_create_topic = None
cdef str retry_prefix = None
cdef bytes header_head = None  # {"code":310,"extFields":{
cdef bytes header_tail = None  # },"flag":0,"language":"JAVA","opaque":
cdef bytes header_end = None  # ,"serializeTypeCurrentRPC":"JSON","version":N}

COMMAND_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields",
                  "body", "serialize_type")
RESULT_FIELDS = ("status", "msg_id", "offset_msg_id", "queue", "queue_offset")


def bind(*, command, result, queue, pure_send_request, pure_send_result, parse_int_field,
         parse_long_field, code, evq_language, language_name, evq_version, json,
         sysflag_bits, auto_create, retry) -> None:
    """Hand the kernels the classes they build, the protocol's constants and their pure twins
    (called once by evq.client.producer).  A class whose fields changed stops the import."""
    global Command, Result, Queue, pure_request, pure_result, parse_int, parse_long
    global send_code, language, version, json_type, sysflag_mask, auto_create_topic
    global retry_prefix, header_head, header_tail, header_end
    for cls, expected in ((command, COMMAND_FIELDS), (result, RESULT_FIELDS)):
        fields = tuple(a.name for a in cls.__attrs_attrs__)
        if fields != expected:
            raise RuntimeError(f"{cls.__name__} fields changed: {fields}")
    Command, Result, Queue = command, result, queue
    pure_request, pure_result = pure_send_request, pure_send_result
    parse_int, parse_long = parse_int_field, parse_long_field
    send_code, language, version, json_type = code, evq_language, evq_version, json
    sysflag_mask, auto_create_topic, retry_prefix = sysflag_bits, auto_create, retry
    # The header's fixed parts, in fastjson's key order as the pure encoder writes them.
    header_head = f'{{"code":{int(code)},"extFields":{{'.encode("ascii")
    header_tail = f'}},"flag":0,"language":"{language_name}","opaque":'.encode("ascii")
    header_end = (f',"serializeTypeCurrentRPC":"JSON","version":{int(evq_version)}}}'
                  .encode("ascii"))


# --- the request ------------------------------------------------------------------------------
#
# The header's JSON is what the pure encoder writes: orjson's text when every string in it is
# ASCII (it escapes '"', '\\' and the controls, and leaves DEL as it is), else the json
# module's ASCII-only text (which escapes DEL and everything past it as \uXXXX, with surrogate
# pairs past the BMP and lone surrogates as they are).

cdef inline Py_ssize_t escaped_length(str text, bint escape_high) noexcept:
    """Bytes ``text`` takes as a JSON string's contents."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), i, total = 0
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef uint32_t c
    for i in range(n):
        c = <uint32_t>PyUnicode_READ(kind, data, i)
        if 0x20 <= c < 0x7F:
            total += 2 if c == 34 or c == 92 else 1
        elif c == 8 or c == 9 or c == 10 or c == 12 or c == 13:
            total += 2
        elif c < 0x20:
            total += 6
        elif not escape_high:
            total += 1  # DEL, in orjson's ASCII text
        else:
            total += 6 if c <= 0xFFFF else 12
    return total


cdef inline uint8_t* put_unit(uint8_t* out, uint32_t unit) noexcept:
    out[0], out[1] = 92, 117  # \u
    out[2], out[3] = HEX[(unit >> 12) & 15], HEX[(unit >> 8) & 15]
    out[4], out[5] = HEX[(unit >> 4) & 15], HEX[unit & 15]
    return out + 6


cdef inline uint8_t* put_escaped(uint8_t* out, str text, bint escape_high) noexcept:
    """``text`` as a JSON string's contents at ``out``; returns the end."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), i
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef uint32_t c
    for i in range(n):
        c = <uint32_t>PyUnicode_READ(kind, data, i)
        if 0x20 <= c < 0x7F:
            if c == 34 or c == 92:
                out[0] = 92
                out += 1
            out[0] = c
            out += 1
        elif c == 8 or c == 9 or c == 10 or c == 12 or c == 13:
            out[0] = 92
            out[1] = SHORT_ESCAPES[c - 8]
            out += 2
        elif c < 0x20:
            out = put_unit(out, c)
        elif not escape_high:
            out[0] = c
            out += 1
        elif c <= 0xFFFF:
            out = put_unit(out, c)
        else:
            c -= 0x10000
            out = put_unit(out, 0xD800 | (c >> 10))
            out = put_unit(out, 0xDC00 | (c & 0x3FF))
    return out


cdef inline bint carries(str text) noexcept:
    """Whether ``text`` holds neither of the properties string's separators."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), i
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef uint32_t c
    for i in range(n):
        c = <uint32_t>PyUnicode_READ(kind, data, i)
        if c == 1 or c == 2:
            return False
    return True


cdef object properties_text(object props):
    """``encode_properties(props)`` for a dict of strings it can carry; None for anything
    else (the pure function decides, refusal for refusal)."""
    cdef Py_ssize_t at = 0
    cdef PyObject* key
    cdef PyObject* value
    if not PyDict_CheckExact(props):
        return None
    parts = []
    while PyDict_Next(props, &at, &key, &value):
        if (not PyUnicode_CheckExact(<object>key) or not PyUnicode_CheckExact(<object>value)
                or PyUnicode_GET_LENGTH(<object>key) == 0
                or not carries(<str>key) or not carries(<str>value)):
            return None
        parts += [<object>key, "\x01", <object>value, "\x02"]
    return "".join(parts)


def send_request(group, queue, msg, opaque):
    """The pure ``_send_request``: the SEND_MESSAGE_V2 command of ``msg`` (stamped already)
    to ``queue`` from a producer of ``group``, with ``opaque``, and its whole frame."""
    topic = queue.topic
    body = msg.body
    props = properties_text(msg.properties)
    if (props is None or not PyUnicode_CheckExact(group) or not PyUnicode_CheckExact(topic)
            or not PyBytes_CheckExact(body) or not PyLong_CheckExact(opaque)
            or (<str>topic).startswith(retry_prefix)):
        return pure_request(group, queue, msg, opaque)
    cdef tuple values = (group, topic, auto_create_topic, "4", str(queue.queue_id),
                         str(msg.sysflag & sysflag_mask), str(msg.born_timestamp),
                         str(msg.flag), props, str(msg.reconsume_times), "false")
    cdef bint escape_high = False
    cdef Py_ssize_t k, header_length
    for k in range(FIELDS):
        value = values[k]
        if not PyUnicode_CheckExact(value):  # an int subclass's own str(): whatever it is
            return pure_request(group, queue, msg, opaque)
        if not PyUnicode_IS_ASCII(value):
            escape_high = True  # the json module's text, as the pure encoder falls back to
    cdef bytes opaque_text = str(opaque).encode("ascii")
    header_length = (PyBytes_GET_SIZE(header_head) + PyBytes_GET_SIZE(header_tail)
                     + PyBytes_GET_SIZE(opaque_text) + PyBytes_GET_SIZE(header_end))
    for k in range(FIELDS):  # "x":"...", each but the last followed by a comma
        header_length += 7 + escaped_length(<str>values[k], escape_high)
    header_length -= 1
    cdef Py_ssize_t body_length = PyBytes_GET_SIZE(body)
    if header_length > HEADER_LENGTH_MASK or 4 + header_length + body_length > INT32_MAX:
        return pure_request(group, queue, msg, opaque)  # refused there
    frame = PyBytes_FromStringAndSize(NULL, 8 + header_length + body_length)
    cdef uint8_t* start = <uint8_t*>PyBytes_AS_STRING(frame)
    cdef uint8_t* out = start + 8
    put32(start, <uint32_t>(4 + header_length + body_length))
    put32(start + 4, <uint32_t>header_length)
    out = put_bytes(out, header_head)
    for k in range(FIELDS):
        if k:
            out[0] = 44  # ,
            out += 1
        out[0], out[1], out[2], out[3], out[4] = 34, 97 + k, 34, 58, 34  # "a":"
        out = put_escaped(out + 5, <str>values[k], escape_high)
        out[0] = 34
        out += 1
    out = put_bytes(out, header_tail)
    out = put_bytes(out, opaque_text)
    out = put_bytes(out, header_end)
    memcpy(out, PyBytes_AS_STRING(body), body_length)
    cmd = object_new(Command)
    cmd.code = send_code
    cmd.language = language
    cmd.version = version
    cmd.opaque = opaque
    cmd.flag = 0
    cmd.remark = None
    cmd.ext_fields = {"a": values[0], "b": values[1], "c": values[2], "d": values[3],
                      "e": values[4], "f": values[5], "g": values[6], "h": values[7],
                      "i": values[8], "j": values[9], "k": values[10]}
    cmd.body = body
    cmd.serialize_type = json_type
    return cmd, frame


cdef inline uint8_t* put_bytes(uint8_t* out, bytes data) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    memcpy(out, PyBytes_AS_STRING(data), n)
    return out + n


# --- the answer -------------------------------------------------------------------------------


cdef inline object got(dict fields, str name):
    cdef PyObject* found = PyDict_GetItem(fields, name)
    return None if found is NULL else <object>found


def send_result(status, msg_id, queue, fields):
    """The pure ``_send_result``: the result of a send to ``queue`` answered ``status`` with
    the header ``fields`` (the answer's ``ext_fields``), the fields read as SendResponse
    reads them (the same parsers, so the same refusals in the same order)."""
    if not PyDict_CheckExact(fields):
        return pure_result(status, msg_id, queue, fields)
    offset_msg_id = got(<dict>fields, "msgId")
    queue_id = got(<dict>fields, "queueId")
    queue_offset = got(<dict>fields, "queueOffset")
    if queue_id is not None:
        queue_id = parse_int("queueId", queue_id)
        if queue_id != queue.queue_id:
            queue = Queue(queue.topic, queue.broker_name, queue_id)
    result = object_new(Result)
    # A frozen class's slots, stored as its own __init__ stores them.
    PyObject_GenericSetAttr(result, "status", status)
    PyObject_GenericSetAttr(result, "msg_id", msg_id)
    PyObject_GenericSetAttr(result, "offset_msg_id",
                            "" if offset_msg_id is None else offset_msg_id)
    PyObject_GenericSetAttr(result, "queue", queue)
    PyObject_GenericSetAttr(result, "queue_offset",
                            -1 if queue_offset is None else parse_long("queueOffset",
                                                                       queue_offset))
    return result
