# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of the remoting frame: the same functions as the pure-Python ones in
:mod:`evq.net.protocol`, which stay the reference and the fallback (see that module's end).

Every frame both ends of a connection exchange goes through these two: taking a frame out
of a connection's buffer and decoding its JSON header (about 38 k instructions in Python for
a send's answer, of which orjson's parse is 11 k), and encoding a command (17 k).  Only the
common case lives here: a whole, well-formed frame with a JSON header that every peer writes,
and a command whose header orjson writes as ASCII.  Anything else (a short or malformed frame,
a binary header, an odd JSON value, a lone surrogate, a body that is not ``bytes``) is handed
to the pure function on the same input, so it ends exactly as there, error for error;
tests/net/test_frame_kernels.py checks the two give the same over the whole input space.
A third kernel, ``parse_send_header``, reads the send header out of a decoded command's fields
for the send processor (its reference is evq.net.send_header.parse; see its section below).

The module imports nothing from evq: :func:`bind` hands it the classes and pure functions it
builds on, once, when evq.net.protocol loads it.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject
from evq.byte_order cimport get32, put32
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, uint8_t, uint32_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyLong_CheckExact(object)
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    bint PyUnicode_IS_ASCII(object)
    const uint8_t* PyUnicode_1BYTE_DATA(object)

cdef enum:
    HEADER_LENGTH_MASK = 0xFFFFFF

# Bound by bind(): evq's command class and the pure functions the kernels fall back on.
cdef type Command = None
cdef object object_new = object.__new__
cdef object pure_take_frame = None
cdef object pure_encode_frame = None
cdef object pure_parse_int = None
cdef object pure_parse_long = None
cdef object decode_header = None  # (serialize type, header, body) -> command: any header
cdef object decode_json_checked = None  # (header, body) -> command: a JSON header, checked
cdef object loads = None
cdef object dumps = None
cdef object decode_error = None
cdef object encode_error = None
cdef dict language_by_name = None
cdef dict language_names = None
cdef object language_other = None
cdef object default_language_name = None
cdef object json_type = None

COMMAND_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields",
                  "body", "serialize_type")


def bind(*, command, take_frame, encode_frame, parse_int, parse_long, decode_any_header,
         decode_json, orjson_loads, orjson_dumps, orjson_decode_error, orjson_encode_error,
         languages_by_name, names_of_languages, other_language, evq_language_name,
         json) -> None:
    """Hand the kernels the class they build and the pure functions and tables they share
    (called once by evq.net.protocol)."""
    global Command, pure_take_frame, pure_encode_frame, decode_header, decode_json_checked
    global loads, dumps, decode_error, encode_error, language_by_name, language_names
    global language_other, default_language_name, json_type, pure_parse_int, pure_parse_long
    # A field added to the command and not set below would leave decoded commands without
    # it: that stops the import (loudly, in every test) instead.
    fields = tuple(a.name for a in command.__attrs_attrs__)
    if fields != COMMAND_FIELDS:
        raise RuntimeError(f"{command.__name__} fields changed: {fields}")
    Command = command
    pure_take_frame, pure_encode_frame = take_frame, encode_frame
    pure_parse_int, pure_parse_long = parse_int, parse_long
    decode_header, decode_json_checked = decode_any_header, decode_json
    loads, dumps = orjson_loads, orjson_dumps
    decode_error, encode_error = orjson_decode_error, orjson_encode_error
    language_by_name, language_names = languages_by_name, names_of_languages
    language_other, default_language_name = other_language, evq_language_name
    json_type = json


# --- taking a frame ---------------------------------------------------------------------------


def take_frame(decoder):
    """The pure ``_take_frame``: the next whole frame's command out of ``decoder``'s buffer,
    or None until more bytes come."""
    cdef bytearray buf = decoder._buf
    cdef Py_ssize_t pos = decoder._pos
    cdef Py_ssize_t available = PyByteArray_GET_SIZE(buf) - pos
    cdef Py_ssize_t length, header_length, body_length
    cdef uint32_t word
    cdef const uint8_t* p
    if available < 4:
        return None
    p = <const uint8_t*>PyByteArray_AS_STRING(buf) + pos
    length = get32(p)
    if length < 4 or length + 4 > <Py_ssize_t>decoder.max_frame:
        return pure_take_frame(decoder)  # refused there, with the opaque it can salvage
    if available < 4 + length:
        return None
    word = <uint32_t>get32(p + 4)
    header_length = word & HEADER_LENGTH_MASK
    if header_length > length - 4:
        return pure_take_frame(decoder)
    body_length = length - 4 - header_length
    header = PyBytes_FromStringAndSize(<const char*>p + 8, header_length)
    body = (PyBytes_FromStringAndSize(<const char*>p + 8 + header_length, body_length)
            if body_length else b"")
    decoder._pos = pos + 4 + length
    if word >> 24:
        return decode_header(word >> 24, header, body)
    return decode_json(header, body)


cdef inline bint is_int32(object value):
    cdef int overflow = 0
    cdef long long n
    if not PyLong_CheckExact(value):
        return False
    n = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and INT32_MIN <= n <= INT32_MAX


cdef inline bint all_strings(dict fields):
    cdef Py_ssize_t at = 0
    cdef PyObject* key
    cdef PyObject* value
    while PyDict_Next(fields, &at, &key, &value):
        if not PyUnicode_CheckExact(<object>value):
            return False
    return True


cdef inline object field(dict obj, str name, object default):
    cdef PyObject* found = PyDict_GetItem(obj, name)
    return default if found is NULL else <object>found


cdef object decode_json(bytes header, bytes body):
    """The pure ``_decode_json``: the short way's type tests in C, the checked way for the
    rest."""
    try:
        obj = loads(header)
    except decode_error:
        return decode_json_checked(header, body)
    if type(obj) is not dict:
        return decode_json_checked(header, body)
    cdef dict d = <dict>obj
    code = field(d, "code", None)
    opaque = field(d, "opaque", None)
    flag = field(d, "flag", 0)
    version = field(d, "version", 0)
    language = field(d, "language", default_language_name)
    remark = field(d, "remark", None)
    ext = field(d, "extFields", None)
    if not (is_int32(code) and is_int32(opaque) and is_int32(flag) and is_int32(version)
            and PyUnicode_CheckExact(language)
            and (remark is None or PyUnicode_CheckExact(remark))
            and (ext is None or (PyDict_CheckExact(ext) and all_strings(<dict>ext)))):
        return decode_json_checked(header, body)
    found = PyDict_GetItem(language_by_name, language)
    cmd = object_new(Command)
    cmd.code = code
    cmd.language = language_other if found is NULL else <object>found
    cmd.version = version
    cmd.opaque = opaque
    cmd.flag = flag
    cmd.remark = remark
    cmd.ext_fields = {} if ext is None else ext  # all strings, and ours
    cmd.body = body
    cmd.serialize_type = json_type
    return cmd


# --- encoding a command -----------------------------------------------------------------------


def encode_frame(cmd):
    """The pure ``_encode_frame``: the whole frame of ``cmd``."""
    if cmd.serialize_type is not json_type:
        return pure_encode_frame(cmd)
    # The header object as the pure ``_encode_json`` builds it, in fastjson's order and with
    # the same conversions (so a field of the wrong type fails the same way).
    obj = {"code": int(cmd.code)}
    ext = cmd.ext_fields
    if ext:
        obj["extFields"] = ext
    obj["flag"] = int(cmd.flag)
    obj["language"] = language_names[cmd.language]
    obj["opaque"] = int(cmd.opaque)
    remark = cmd.remark
    if remark is not None:
        obj["remark"] = remark
    obj["serializeTypeCurrentRPC"] = "JSON"
    obj["version"] = int(cmd.version)
    try:
        header = dumps(obj)
    except encode_error:
        return pure_encode_frame(cmd)  # a lone surrogate: the escaping way
    body = cmd.body
    if not PyBytes_CheckExact(body) or not PyBytes_CheckExact(header):
        return pure_encode_frame(cmd)
    cdef Py_ssize_t header_length = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t body_length = PyBytes_GET_SIZE(body)
    cdef const uint8_t* h = <const uint8_t*>PyBytes_AS_STRING(header)
    cdef Py_ssize_t i
    if header_length > HEADER_LENGTH_MASK or 4 + header_length + body_length > INT32_MAX:
        return pure_encode_frame(cmd)
    for i in range(header_length):
        if h[i] >= 0x80:  # not ASCII: the escaping way
            return pure_encode_frame(cmd)
    frame = PyBytes_FromStringAndSize(NULL, 8 + header_length + body_length)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(frame)
    put32(out, <uint32_t>(4 + header_length + body_length))
    put32(out + 4, <uint32_t>header_length)
    memcpy(out + 8, h, header_length)
    memcpy(out + 8 + header_length, PyBytes_AS_STRING(body), body_length)
    return frame


# --- the send header --------------------------------------------------------------------------
#
# evq.net.send_header.parse, for the header nearly every send carries: a dict of strings whose
# numbers are short runs of ASCII digits (a producer writes them with Java's or Python's
# toString) and whose batch flag, if any, is spelled as Java spells it.  Anything else (a sign,
# a long number, an odd spelling, a missing required field, a value that is no str) goes to
# the pure parse on the same input, which reads it or refuses it there.

cdef object SendHeader = None
cdef object pure_parse_send_header = None
cdef object auto_create_topic = None
cdef object send_v2_code = None
cdef object send_batch_code = None
cdef object max_reconsume_since = None
# The long names, then the V2 one-letter names, of the fields read, in SendHeader's order.
cdef tuple LONG_NAMES = ("topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                         "bornTimestamp", "flag", "properties", "reconsumeTimes",
                         "maxReconsumeTimes", "batch")
cdef tuple SHORT_NAMES = tuple("bcdefghijlm")
SEND_HEADER_FIELDS = ("topic", "queue_id", "sys_flag", "born_timestamp", "default_topic",
                      "default_topic_queue_nums", "flag", "properties", "reconsume_times",
                      "max_reconsume_times", "batch")


def bind_send_header(*, send_header, pure_parse, short_names, auto_create, v2_code, batch_code,
                     reconsume_since) -> None:
    """Hand the send-header kernel its class, its pure twin and the protocol's numbers (called
    once by evq.net.send_header).  A header class or naming that changed stops the import."""
    global SendHeader, pure_parse_send_header, auto_create_topic
    global send_v2_code, send_batch_code, max_reconsume_since
    fields = tuple(a.name for a in send_header.__attrs_attrs__)
    if fields != SEND_HEADER_FIELDS:
        raise RuntimeError(f"{send_header.__name__} fields changed: {fields}")
    if tuple(short_names[name] for name in LONG_NAMES) != SHORT_NAMES:
        raise RuntimeError("the V2 send header's short names changed")
    SendHeader, pure_parse_send_header = send_header, pure_parse
    auto_create_topic = auto_create
    send_v2_code, send_batch_code, max_reconsume_since = v2_code, batch_code, reconsume_since


cdef inline bint digits(object text, Py_ssize_t most, long long* value):
    """Whether ``text`` is a str of one to ``most`` ASCII digits; its value in ``value``."""
    cdef Py_ssize_t n, i
    cdef const uint8_t* p
    cdef long long v = 0
    if not PyUnicode_CheckExact(text) or not PyUnicode_IS_ASCII(text):
        return False
    n = PyUnicode_GET_LENGTH(text)
    if n < 1 or n > most:
        return False
    p = PyUnicode_1BYTE_DATA(text)
    for i in range(n):
        if not 48 <= p[i] <= 57:
            return False
        v = v * 10 + (p[i] - 48)
    value[0] = v
    return True


def parse_int_field(name, text):
    """The pure ``parse_int_field``: a header field's text as a Java int."""
    cdef long long value
    if digits(text, 9, &value):  # nine digits are within a Java int
        return value
    return pure_parse_int(name, text)


def parse_long_field(name, text):
    """The pure ``parse_long_field``: a header field's text as a Java long."""
    cdef long long value
    if digits(text, 18, &value):  # eighteen within a long
        return value
    return pure_parse_long(name, text)


cdef inline object got(dict fields, tuple names, Py_ssize_t k):
    cdef PyObject* found = PyDict_GetItem(fields, names[k])
    return None if found is NULL else <object>found


cdef bint read_send_fields(object code, object version, dict fields, SendFields* out):
    """The usual send header of ``fields`` (a send's ``ext_fields``) into ``out``: True, or
    False for anything else (then the pure ``parse`` decides, error for error).  The strings
    in ``out`` are borrowed from ``fields``."""
    cdef tuple names = SHORT_NAMES if code == send_v2_code or "b" in fields else LONG_NAMES
    cdef PyObject* found
    topic = got(fields, names, 0)
    queue_nums_text = got(fields, names, 2)
    flag_text = got(fields, names, 6)
    reconsume_text = got(fields, names, 8)
    max_reconsume_text = got(fields, names, 9)
    batch_text = got(fields, names, 10)
    out.queue_nums, out.flag, out.reconsume = 4, 0, 0
    # Nine digits are within a Java int, eighteen within a long.
    if (topic is None
            or not digits(got(fields, names, 3), 9, &out.queue_id)
            or not digits(got(fields, names, 4), 9, &out.sys_flag)
            or not digits(got(fields, names, 5), 18, &out.born)
            or (queue_nums_text is not None and not digits(queue_nums_text, 9, &out.queue_nums))
            or (flag_text is not None and not digits(flag_text, 9, &out.flag))
            or (reconsume_text is not None and not digits(reconsume_text, 9, &out.reconsume))):
        return False
    out.has_max_reconsume = max_reconsume_text is not None and version >= max_reconsume_since
    if out.has_max_reconsume and not digits(max_reconsume_text, 9, &out.max_reconsume):
        return False
    if code == send_batch_code:
        out.batch = True
    elif batch_text is None or batch_text == "false" or batch_text == "0":
        out.batch = False
    elif batch_text == "true" or batch_text == "1":
        out.batch = True
    else:
        return False
    out.topic = <PyObject*>topic
    found = PyDict_GetItem(fields, names[1])
    out.default_topic = NULL if found is NULL else found
    found = PyDict_GetItem(fields, names[7])
    out.properties = NULL if found is NULL else found
    return True


def parse_send_header(code, version, fields):
    """The pure ``parse``: ``fields`` (a send's ``ext_fields``) as a SendHeader."""
    cdef SendFields f
    if (not PyDict_CheckExact(fields) or SendHeader is None
            or not read_send_fields(code, version, <dict>fields, &f)):
        return pure_parse_send_header(code, version, fields)
    properties = "" if f.properties is NULL else <object>f.properties
    return SendHeader(<object>f.topic, f.queue_id, f.sys_flag, f.born,
                      auto_create_topic if f.default_topic is NULL else <object>f.default_topic,
                      f.queue_nums, f.flag, properties or "", f.reconsume,
                      f.max_reconsume if f.has_max_reconsume else None, f.batch)
