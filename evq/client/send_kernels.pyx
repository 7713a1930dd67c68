# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of a producer's single send: the same functions as the pure-Python ones in
:mod:`evq.client.producer` (``_send_request`` and ``_send_result``), which stay the reference
and the fallback (see that module's end).

A sync send's round trip is the client's CPU plus the broker's, and on the client most of it
was Python stepping through small functions (issue 18): the header's fields as strings, the
properties string and its separator checks, the command, its header through a dict and an
encoder, then the answer's header object and the result.  Here the request's command and its
whole SEND_MESSAGE_V2 frame are made in one call, the header written straight into the frame
in RocketMQ's binary (ROCKETMQ) serialization, and the answer's three fields read into the
result in another.

Only the common case lives here: a single message whose fields are of the types a producer
makes (``str`` topic, group and properties, ``bytes`` body) to a topic that is not a retry
topic, with properties the properties string can carry.  Anything else (a retry topic's
``maxReconsumeTimes``, a property holding a separator, a value of another type, a text no
UTF-8 carries, a header past 24 bits) is handed to the pure function on the same input, so it ends exactly as there, error
for error; tests/client/test_send_kernels.py checks the two give the same frame, command and
result over every legal character and size.

The module imports nothing from evq: :func:`bind` hands it the classes, constants and pure
functions it builds on, once, when evq.client.producer loads it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject
from evq.net.frame_kernels cimport Text, binary_frame
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, uint32_t

cdef extern from "Python.h":
    bint PyLong_CheckExact(object)
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index)
    int PyObject_GenericSetAttr(object, object, object) except -1

cdef enum:
    FIELDS = 11  # a..k: the V2 header's one-letter fields a single send carries

cdef const char* NAMES = b"abcdefghijk"  # their keys, one byte each

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
cdef object rocketmq_type = None
cdef int code_value, language_value, version_value  # the header's fixed numbers
cdef object sysflag_mask = None
cdef str auto_create_topic = None
cdef str retry_prefix = None

COMMAND_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields",
                  "body", "serialize_type")
RESULT_FIELDS = ("status", "msg_id", "offset_msg_id", "queue", "queue_offset")


def bind(*, command, result, queue, pure_send_request, pure_send_result, parse_int_field,
         parse_long_field, code, evq_language, evq_version, rocketmq, sysflag_bits,
         auto_create, retry) -> None:
    """Hand the kernels the classes they build, the protocol's constants and their pure twins
    (called once by evq.client.producer).  A class whose fields changed stops the import."""
    global Command, Result, Queue, pure_request, pure_result, parse_int, parse_long
    global send_code, language, version, rocketmq_type, sysflag_mask, auto_create_topic
    global retry_prefix, code_value, language_value, version_value
    for cls, expected in ((command, COMMAND_FIELDS), (result, RESULT_FIELDS)):
        fields = tuple(a.name for a in cls.__attrs_attrs__)
        if fields != expected:
            raise RuntimeError(f"{cls.__name__} fields changed: {fields}")
    Command, Result, Queue = command, result, queue
    pure_request, pure_result = pure_send_request, pure_send_result
    parse_int, parse_long = parse_int_field, parse_long_field
    send_code, language, version, rocketmq_type = code, evq_language, evq_version, rocketmq
    code_value, language_value, version_value = code, evq_language, evq_version
    sysflag_mask, auto_create_topic, retry_prefix = sysflag_bits, auto_create, retry


# --- the request ------------------------------------------------------------------------------


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
    cdef int overflow = 0
    cdef long long opaque_value = 0
    topic = queue.topic
    body = msg.body
    props = properties_text(msg.properties)
    if PyLong_CheckExact(opaque):
        opaque_value = PyLong_AsLongLongAndOverflow(opaque, &overflow)
    if (props is None or not PyUnicode_CheckExact(group) or not PyUnicode_CheckExact(topic)
            or not PyBytes_CheckExact(body) or not PyLong_CheckExact(opaque) or overflow
            or not INT32_MIN <= opaque_value <= INT32_MAX
            or (<str>topic).startswith(retry_prefix)):
        return pure_request(group, queue, msg, opaque)
    cdef tuple values = (group, topic, auto_create_topic, "4", str(queue.queue_id),
                         str(msg.sysflag & sysflag_mask), str(msg.born_timestamp),
                         str(msg.flag), props, str(msg.reconsume_times), "false")
    cdef Text texts[2 * FIELDS]
    cdef Text remark
    cdef Py_ssize_t k
    for k in range(FIELDS):
        value = values[k]
        if not PyUnicode_CheckExact(value):  # an int subclass's own str(): whatever it is
            return pure_request(group, queue, msg, opaque)
        texts[2 * k].data, texts[2 * k].size = NAMES + k, 1
        try:
            texts[2 * k + 1].data = PyUnicode_AsUTF8AndSize(value, &texts[2 * k + 1].size)
        except UnicodeEncodeError:  # a lone surrogate: the pure way writes JSON, which can
            return pure_request(group, queue, msg, opaque)
    remark.data, remark.size = NULL, 0
    frame = binary_frame(code_value, language_value, version_value, <int32_t>opaque_value, 0,
                         remark, texts, FIELDS, body)
    if frame is None:
        return pure_request(group, queue, msg, opaque)  # refused there: a header past 24 bits
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
    cmd.serialize_type = rocketmq_type
    return cmd, frame


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
