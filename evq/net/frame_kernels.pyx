# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled kernels of the remoting frame: the same functions as the pure-Python ones in
:mod:`evq.net.protocol`, which stay the reference and the fallback (see that module's end).

Every frame both ends of a connection exchange goes through these two: taking a frame out
of a connection's buffer and decoding its header (about 38 k instructions in Python for a
JSON answer to a send, of which orjson's parse is 11 k), and encoding a command (17 k).  Only
the common case lives here: a whole, well-formed frame with a JSON header that every peer
writes or a ROCKETMQ binary header (evq's producer sends its sends in it: read in C with no
parser between, it costs a broker a fraction of the JSON header's time), and a command whose
header orjson writes as ASCII or whose binary fields fit theirs.  Anything else (a short or
malformed frame, an odd JSON value, a length out of range, a lone surrogate, a body that is
not ``bytes``) is handed to the pure function on the same input, so it ends exactly as there,
error for error; tests/net/test_frame_kernels.py checks the two give the same over the whole
input space.  The binary writer is shared with the send lane (frame_kernels.pxd).
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
from evq.byte_order cimport get16, get32, put32
from evq.slots cimport get_field, new_instance, set_field, set_new, slot_offset
from libc.stdint cimport INT16_MAX, INT16_MIN, INT32_MAX, INT32_MIN, int32_t, uint8_t, uint32_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    bint PyLong_CheckExact(object)
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    bint PyLong_Check(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    bint PyUnicode_IS_ASCII(object)
    const uint8_t* PyUnicode_1BYTE_DATA(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL
    object PyUnicode_DecodeUTF8(const char*, Py_ssize_t, const char*)
    Py_ssize_t PyDict_GET_SIZE(object)
    object PyUnicode_New(Py_ssize_t, Py_UCS4)
    uint8_t* PyUnicode_1BYTE_DATA_W "PyUnicode_1BYTE_DATA"(object)
    dict _PyDict_NewPresized(Py_ssize_t)
    void* PyMem_Malloc(size_t)
    void PyMem_Free(void*)

cdef enum:
    HEADER_LENGTH_MASK = 0xFFFFFF
    BINARY_FIXED = 13  # CODE int16, LANGUAGE byte, VERSION int16, OPAQUE int32, FLAG int32
    STACK_TEXTS = 32  # keys and values of the header fields encoded without a heap array
    PRESIZED_MOST = 64  # header fields a decoded dict is sized for up front, at most

# Bound by bind(): evq's command class and the pure functions the kernels fall back on.
cdef type Command = None
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
cdef dict language_by_code = None
cdef object json_type = None
cdef object rocketmq_type = None

COMMAND_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields",
                  "body", "serialize_type")
# Where a command keeps each of COMMAND_FIELDS (its slots): a decoded command's nine fields
# set through their descriptors were about 2,000 of a send frame's 15,700 instructions.
cdef Py_ssize_t COMMAND_AT[9]
# The one-character ASCII strs (CPython's own cached ones): a ROCKETMQ header's keys are
# single letters for a send (SEND_MESSAGE_V2's) and its answer, taken here without a decode.
cdef tuple ASCII_CHARS = tuple(chr(i) for i in range(128))
# Where a frame decoder keeps the fields taking a frame reads and sets (its slots).
cdef type Decoder = None
cdef Py_ssize_t D_BUF, D_POS, D_MAX_FRAME, D_MAX_HEADER


def bind(*, command, decoder, take_frame, encode_frame, parse_int, parse_long, decode_any_header,
         decode_json, orjson_loads, orjson_dumps, orjson_decode_error, orjson_encode_error,
         languages_by_name, names_of_languages, other_language, evq_language_name,
         languages_by_code, json, rocketmq) -> None:
    """Hand the kernels the class they build and the pure functions and tables they share
    (called once by evq.net.protocol)."""
    global Command, pure_take_frame, pure_encode_frame, decode_header, decode_json_checked
    global loads, dumps, decode_error, encode_error, language_by_name, language_names
    global language_other, default_language_name, json_type, pure_parse_int, pure_parse_long
    global language_by_code, rocketmq_type, Decoder, D_BUF, D_POS, D_MAX_FRAME, D_MAX_HEADER
    # A field added to the command and not set below would leave decoded commands without
    # it: that stops the import (loudly, in every test) instead.
    fields = tuple(a.name for a in command.__attrs_attrs__)
    if fields != COMMAND_FIELDS or "__new__" in command.__dict__:
        raise RuntimeError(f"{command.__name__} fields changed: {fields}")
    for k, name in enumerate(COMMAND_FIELDS):
        COMMAND_AT[k] = slot_offset(command, name)
    Command = command
    D_BUF, D_POS, D_MAX_FRAME, D_MAX_HEADER = (
        slot_offset(decoder, name) for name in ("_buf", "_pos", "max_frame", "max_header"))
    Decoder = decoder
    pure_take_frame, pure_encode_frame = take_frame, encode_frame
    pure_parse_int, pure_parse_long = parse_int, parse_long
    decode_header, decode_json_checked = decode_any_header, decode_json
    loads, dumps = orjson_loads, orjson_dumps
    decode_error, encode_error = orjson_decode_error, orjson_encode_error
    language_by_name, language_names = languages_by_name, names_of_languages
    language_other, default_language_name = other_language, evq_language_name
    language_by_code = languages_by_code
    json_type, rocketmq_type = json, rocketmq


# --- taking a frame ---------------------------------------------------------------------------


def take_frame(decoder):
    """The pure ``_take_frame``: the next whole frame's command out of ``decoder``'s buffer,
    or None until more bytes come."""
    cdef bytearray buf = get_field(decoder, Decoder, D_BUF, "_buf")
    cdef Py_ssize_t pos = get_field(decoder, Decoder, D_POS, "_pos")
    cdef Py_ssize_t available = PyByteArray_GET_SIZE(buf) - pos
    cdef Py_ssize_t length, header_length, body_length
    cdef uint32_t word
    cdef const uint8_t* p
    if available < 4:
        return None
    p = <const uint8_t*>PyByteArray_AS_STRING(buf) + pos
    length = get32(p)
    max_frame = get_field(decoder, Decoder, D_MAX_FRAME, "max_frame")
    if length < 4 or length + 4 > <Py_ssize_t>max_frame:
        return pure_take_frame(decoder)  # refused there, with the opaque it can salvage
    if available < 8:
        return None
    word = <uint32_t>get32(p + 4)
    header_length = word & HEADER_LENGTH_MASK
    if header_length > <Py_ssize_t>get_field(decoder, Decoder, D_MAX_HEADER, "max_header"):
        return pure_take_frame(decoder)  # refused there
    if available < 4 + length:
        return None
    if header_length > length - 4:
        return pure_take_frame(decoder)
    body_length = length - 4 - header_length
    header = PyBytes_FromStringAndSize(<const char*>p + 8, header_length)
    body = (PyBytes_FromStringAndSize(<const char*>p + 8 + header_length, body_length)
            if body_length else b"")
    set_field(decoder, Decoder, D_POS, "_pos", pos + 4 + length)
    if word >> 24 == 1:
        return decode_binary(header, body)
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
    return new_command(code, language_other if found is NULL else <object>found, version, opaque,
                       flag, remark, {} if ext is None else ext,  # all strings, and ours
                       body, json_type)


cdef object new_command(object code, object language, object version, object opaque,
                        object flag, object remark, dict ext_fields, object body,
                        object serialize_type):
    """``Command.direct(...)``: a command with its slots set directly (see COMMAND_AT)."""
    cmd = new_instance(Command)
    set_new(cmd, COMMAND_AT[0], code)
    set_new(cmd, COMMAND_AT[1], language)
    set_new(cmd, COMMAND_AT[2], version)
    set_new(cmd, COMMAND_AT[3], opaque)
    set_new(cmd, COMMAND_AT[4], flag)
    set_new(cmd, COMMAND_AT[5], remark)
    set_new(cmd, COMMAND_AT[6], ext_fields)
    set_new(cmd, COMMAND_AT[7], body)
    set_new(cmd, COMMAND_AT[8], serialize_type)
    return cmd


cdef object utf8_text(const uint8_t* p, Py_ssize_t n):
    """The str of ``n`` UTF-8 bytes at ``p`` (a one-byte ASCII text is CPython's cached
    character), or None where they are not UTF-8.  ASCII (every header text evq writes, and
    the stock clients' names and numbers) is copied into a new str without the decoder."""
    cdef Py_ssize_t i
    if n == 1 and p[0] < 128:
        return ASCII_CHARS[p[0]]
    for i in range(n):
        if p[i] >= 128:
            try:
                return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
            except UnicodeDecodeError:
                return None
    text = PyUnicode_New(n, 127)
    memcpy(PyUnicode_1BYTE_DATA_W(text), p, n)
    return text


cdef Py_ssize_t count_fields(const uint8_t* p, Py_ssize_t at, Py_ssize_t n) noexcept:
    """How many header fields the entries from ``at`` to ``n`` seem to hold (at most
    PRESIZED_MOST), to size their dict once: a count, not a check (the decoder checks)."""
    cdef Py_ssize_t count = 0, key_length, value_length
    while count < PRESIZED_MOST and n - at >= 6:
        key_length = get16(p + at)
        if key_length < 0 or key_length > n - at - 6:
            break
        at += 2 + key_length
        value_length = get32(p + at)
        if value_length < 0 or value_length > n - at - 4:
            break
        at += 4 + value_length
        count += 1
    return count


cdef object decode_binary(bytes header, bytes body):
    """The pure ``_decode_binary`` (a ROCKETMQ header, as evq's producer sends): a
    well-formed header read in C, anything else (a length out of range, a text that is not
    UTF-8) handed to the pure decoder, which says what is wrong."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(header)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(header)
    cdef Py_ssize_t at, remark_length, ext_length, key_length, value_length
    if n < BINARY_FIXED + 8:
        return decode_header(1, header, body)
    remark_length = get32(p + BINARY_FIXED)
    at = BINARY_FIXED + 4
    if remark_length < 0 or remark_length > n - at - 4:
        return decode_header(1, header, body)
    remark = None
    if remark_length:
        remark = utf8_text(p + at, remark_length)
        if remark is None:
            return decode_header(1, header, body)
        at += remark_length
    ext_length = get32(p + at)
    at += 4
    if ext_length != n - at:
        return decode_header(1, header, body)
    cdef dict fields = _PyDict_NewPresized(count_fields(p, at, n))
    while at < n:
        if n - at < 2:
            return decode_header(1, header, body)
        key_length = get16(p + at)
        at += 2
        if key_length < 0 or key_length > n - at - 4:
            return decode_header(1, header, body)
        key = utf8_text(p + at, key_length)
        at += key_length
        value_length = get32(p + at)
        at += 4
        if key is None or value_length < 0 or value_length > n - at:
            return decode_header(1, header, body)
        value = utf8_text(p + at, value_length)
        if value is None:
            return decode_header(1, header, body)
        at += value_length
        fields[key] = value
    found = PyDict_GetItem(language_by_code, p[2])
    return new_command(get16(p), language_other if found is NULL else <object>found,
                       get16(p + 3), get32(p + 5), get32(p + 9), remark, fields, body,
                       rocketmq_type)


# --- encoding a command -----------------------------------------------------------------------


def encode_frame(cmd):
    """The pure ``_encode_frame``: the whole frame of ``cmd``."""
    if cmd.serialize_type is rocketmq_type:
        return encode_binary(cmd)
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


cdef inline bint int_in(object value, long long low, long long high, long long* out):
    """Whether ``value`` is an int (as struct packs it: a subclass too) within
    ``low..high``; its value in ``out``."""
    cdef int overflow = 0
    if not PyLong_Check(value):
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and low <= out[0] <= high


cdef inline bint utf8_of(object text, Text* out):
    """``text``'s UTF-8 bytes in ``out`` (kept by the str), where it is a str that has them:
    False for anything else, a lone surrogate included."""
    if not PyUnicode_CheckExact(text):
        return False
    try:
        out.data = PyUnicode_AsUTF8AndSize(text, &out.size)
    except UnicodeEncodeError:
        return False
    return True


cdef object encode_binary(object cmd):
    """The pure ``_encode_frame`` of a ROCKETMQ command: its fields of the usual types
    written in C, anything else (a number out of its field's range, a text that is not a
    str or has no UTF-8, a header past 24 bits) handed to the pure encoder, which raises
    what it raises."""
    cdef long long code = 0, language = 0, version = 0, opaque = 0, flag = 0
    cdef Text remark
    cdef Text stack[STACK_TEXTS]
    cdef Text* texts = stack
    cdef Py_ssize_t at = 0, count, k = 0
    cdef PyObject* key
    cdef PyObject* value
    fields = cmd.ext_fields
    remark_text = cmd.remark
    if not (int_in(cmd.code, INT16_MIN, INT16_MAX, &code)
            and int_in(cmd.language, 0, 255, &language)
            and int_in(cmd.version, INT16_MIN, INT16_MAX, &version)
            and int_in(cmd.opaque, INT32_MIN, INT32_MAX, &opaque)
            and int_in(cmd.flag, INT32_MIN, INT32_MAX, &flag)
            and PyDict_CheckExact(fields)):
        return pure_encode_frame(cmd)
    remark.data, remark.size = NULL, 0
    if remark_text is not None and not utf8_of(remark_text, &remark):
        return pure_encode_frame(cmd)
    count = PyDict_GET_SIZE(fields)
    if 2 * count > STACK_TEXTS:
        texts = <Text*>PyMem_Malloc(2 * count * sizeof(Text))
        if texts is NULL:
            raise MemoryError()
    try:
        while PyDict_Next(fields, &at, &key, &value):
            if not (utf8_of(<object>key, &texts[k]) and utf8_of(<object>value, &texts[k + 1])):
                return pure_encode_frame(cmd)
            k += 2
        frame = binary_frame(<int>code, <int>language, <int>version, <int32_t>opaque,
                             <int32_t>flag, remark, texts, count, cmd.body)
    finally:
        if texts is not stack:
            PyMem_Free(texts)
    return pure_encode_frame(cmd) if frame is None else frame


cdef object binary_frame(int code, int language, int version, int32_t opaque, int32_t flag,
                         Text remark, const Text* texts, Py_ssize_t count, object body):
    """The whole frame of a ROCKETMQ header of these fields (``texts``: ``count`` keys and
    values, alternating) and ``body``, laid out as evq.net.protocol's module docstring
    draws it; None where a length does not fit its field (a key past int16, a header past
    24 bits, a frame past int32) or ``body`` is no ``bytes``, for the caller's pure way."""
    cdef Py_ssize_t header_length = BINARY_FIXED + 4 + remark.size + 4, k, body_length
    cdef uint8_t* out
    if not PyBytes_CheckExact(body):
        return None
    for k in range(count):
        if texts[2 * k].size > INT16_MAX:
            return None
        header_length += 2 + texts[2 * k].size + 4 + texts[2 * k + 1].size
    body_length = PyBytes_GET_SIZE(body)
    if header_length > HEADER_LENGTH_MASK or 4 + header_length + body_length > INT32_MAX:
        return None
    frame = PyBytes_FromStringAndSize(NULL, 8 + header_length + body_length)
    out = <uint8_t*>PyBytes_AS_STRING(frame)
    put32(out, <uint32_t>(4 + header_length + body_length))
    put32(out + 4, <uint32_t>(1 << 24 | header_length))
    out += 8
    out[0], out[1], out[2] = <uint8_t>(code >> 8), <uint8_t>code, <uint8_t>language
    out[3], out[4] = <uint8_t>(version >> 8), <uint8_t>version
    put32(out + 5, <uint32_t>opaque)
    put32(out + 9, <uint32_t>flag)
    out = put_text(out + BINARY_FIXED, remark, 4)
    put32(out, <uint32_t>(header_length - (BINARY_FIXED + 4 + remark.size + 4)))
    out += 4
    for k in range(count):
        out = put_text(out, texts[2 * k], 2)
        out = put_text(out, texts[2 * k + 1], 4)
    memcpy(out, PyBytes_AS_STRING(body), body_length)
    return frame


cdef inline uint8_t* put_text(uint8_t* out, Text text, int width) noexcept:
    """``text`` after its length in ``width`` (2 or 4) big-endian bytes."""
    if width == 2:
        out[0], out[1] = <uint8_t>(text.size >> 8), <uint8_t>text.size
    else:
        put32(out, <uint32_t>text.size)
    if text.size:
        memcpy(out + width, text.data, text.size)
    return out + width + text.size


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
