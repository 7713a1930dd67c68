# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The send lane: a single send (SEND_MESSAGE_V2, as evq's client sends it, or SEND_MESSAGE, as
the stock C++ client does) from frame to answer without the send processor's Python objects,
where that is all it needs.

A single send under ASYNC_FLUSH with no slave to wait for is most of what a producer asks, and
in Python most of its cost on the event loop is not the store but the steps between: the
header object, the checks, the put's summary, the answer's object and its encoding (about
800 of the 1,500 bytecodes a send ran; issue 18).  The lane takes such a send in C: it reads
the header with the frame kernels' send-header reader, asks the broker once per topic (and
again whenever its metadata changes) how many queues a plain send may name, makes the record
with the same ``plain_records`` kernel, appends it through the log as the processor does, and
answers with the processor's own answer bytes, cut once from a template the processor's
encoder wrote, the four values spliced in; a send with a ROCKETMQ binary header (as evq's
producer sends) is answered in kind, by the frame kernels' binary writer, from the fields of
the processor's own binary answer.  (That is where the log sums up its appends, as the mmap
store does; another backend's results are answered by the processor's code after the lane's
append.)

Everything else (a batch, a header of another serialization, an unusual field, a queue the producer left
to the broker, a topic that is new, read-only, a retry topic or needs routing, a put that
waits for the flusher or a slave, one behind a large put, an IPv6 peer, any refusal) goes the
processor's way, which stays the reference: the lane decides nothing of its own, and its
answers are the processor's byte for byte (tests/net/test_send_lane.py).  Errors the shared
steps raise (a body or properties too long) propagate as from the processor.

Runs on the event loop, as the send handler does.  Imports nothing from evq: its Python
collaborators are handed to :class:`SendLane` (evq.net.broker.send).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from evq.byte_order cimport put32
from evq.net.frame_kernels cimport SendFields, Text, binary_frame, read_send_fields
from evq.slots cimport get_field, set_field, slot_offset
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy

cdef extern from "Python.h":
    bint PyDict_CheckExact(object)

cdef enum:
    MAX_CACHED = 4096  # topics (existing ones) and peers remembered, at most
    MAX_VALUE = 64  # bytes of one spliced value (a msgId 32, 56 for an IPv6 host; a long 20)
    MAX_FIELDS = 16  # header fields of the binary answer (it has five)

cdef enum:  # the answer's values, as the template numbers them (evq.net.broker.send._MARKS)
    MSG_ID = 0
    QUEUE_ID = 1
    QUEUE_OFFSET = 2
    OPAQUE = 3


cdef const char* HEX = b"0123456789ABCDEF"

cdef enum:  # the fields the lane reads by their slots (see SendLane.at)
    CMD_CODE, CMD_VERSION, CMD_OPAQUE, CMD_EXT_FIELDS, CMD_BODY, CMD_SERIALIZE_TYPE
    CTX_DURABLE, CTX_REPLICATED, CTX_PUTS, CTX_STATS, PUTS_BUSY, STATS_MESSAGES, STATS_BYTES
    FIELD_COUNT

# Each field's name (for the class check's fallback, getattr) and where it is read from.
FIELD_NAMES = ("code", "version", "opaque", "ext_fields", "body", "serialize_type", "durable",
               "replicated", "puts", "stats", "busy", "messages_put", "bytes_put")


cdef Py_ssize_t decimal(long long value, uint8_t* out) noexcept:
    """``value`` in decimal at ``out``; returns the bytes written (at most 20)."""
    cdef uint8_t digits[20]
    cdef Py_ssize_t n = 0, i
    cdef unsigned long long v
    cdef bint negative = value < 0
    v = <unsigned long long>(-(value + 1)) + 1 if negative else <unsigned long long>value
    while True:
        digits[n] = 48 + v % 10
        n += 1
        v //= 10
        if v == 0:
            break
    i = 0
    if negative:
        out[0] = 45
        i = 1
    while n:
        n -= 1
        out[i] = digits[n]
        i += 1
    return i


cdef class SendLane:
    """The send handler for SEND_MESSAGE and SEND_MESSAGE_V2: the lane where it applies, else
    ``general``."""

    cdef object general, ctx, core, log, answer_put, plain_records, parse_host
    cdef object host_bytes, is_ipv6, appended_records
    cdef bytes store_host
    cdef object cluster_entry
    cdef long long max_body
    cdef object version
    cdef dict queues  # topic -> queues a plain send may name, at ``version``; taken ones only
    cdef dict hosts  # peer address -> its host bytes as stored, None for IPv6
    cdef tuple pieces  # the answer header's literal bytes around the values
    cdef tuple order  # which value follows each piece but the last
    cdef tuple binary_fixed  # the binary answer's code, language, version and flag
    cdef tuple binary_fields  # its fields: (key, literal value or which value goes there)
    cdef object v1_code, v2_code, json_type, rocketmq_type
    # Where the command's, the context's, its put queue's and its stats' classes keep the
    # fields a send reads (and the two counters it adds to): through their descriptors, a
    # dozen a send (issue 18).  An object of another class is read through getattr.
    cdef type command, context, turns, counters
    cdef Py_ssize_t at[FIELD_COUNT]
    cdef readonly unsigned long long taken
    """Sends the lane answered (C counters: what a metrics surface reads for free)."""
    cdef readonly unsigned long long handed_over
    """Sends it handed to the processor, before or after their append."""

    @property
    def cached_topics(self) -> int:
        """Topics the lane remembers (the bound's witness in tests)."""
        return len(self.queues)

    def __init__(self, *, general, ctx, answer_put, plain_records, parse_host, host_bytes,
                 is_ipv6, appended_records, terms, template, binary_template, v1_code,
                 v2_code, json_type, rocketmq_type, command):
        self.general, self.ctx, self.core = general, ctx, ctx.core
        self.command, self.context = command, type(ctx)
        self.turns, self.counters = type(ctx.puts), type(ctx.stats)
        for k, name in enumerate(FIELD_NAMES):
            cls = (self.command if k < CTX_DURABLE else self.context if k < PUTS_BUSY
                   else self.turns if k == PUTS_BUSY else self.counters)
            self.at[k] = slot_offset(cls, name)
        self.log, self.answer_put = self.core.log, answer_put
        self.plain_records, self.parse_host = plain_records, parse_host
        self.host_bytes, self.is_ipv6, self.appended_records = host_bytes, is_ipv6, appended_records
        self.store_host, self.cluster_entry, self.max_body = terms
        self.version = None
        self.queues, self.hosts = {}, {}
        self.pieces, self.order = checked_template(template)
        self.binary_fixed, self.binary_fields = checked_binary_template(binary_template)
        self.v1_code, self.v2_code = v1_code, v2_code
        self.json_type, self.rocketmq_type = json_type, rocketmq_type

    cdef inline object cmd_field(self, object cmd, int k):
        return get_field(cmd, self.command, self.at[k], FIELD_NAMES[k])

    cdef inline object ctx_field(self, int k):
        return get_field(self.ctx, self.context, self.at[k], FIELD_NAMES[k])

    cdef inline int count(self, object stats, int k, object added) except -1:
        value = get_field(stats, self.counters, self.at[k], FIELD_NAMES[k]) + added
        return set_field(stats, self.counters, self.at[k], FIELD_NAMES[k], value)

    def __call__(self, conn, cmd):
        cdef SendFields f
        cdef PyObject* found
        ctx, fields = self.ctx, self.cmd_field(cmd, CMD_EXT_FIELDS)
        code = self.cmd_field(cmd, CMD_CODE)
        serialize_type = self.cmd_field(cmd, CMD_SERIALIZE_TYPE)
        binary = serialize_type is self.rocketmq_type
        if ((code != self.v2_code and code != self.v1_code)
                or (not binary and serialize_type != self.json_type)
                or not PyDict_CheckExact(fields)
                or not read_send_fields(code, self.cmd_field(cmd, CMD_VERSION), <dict>fields, &f)
                or f.batch or f.queue_id < 0 or self.ctx_field(CTX_DURABLE) is not None
                or self.ctx_field(CTX_REPLICATED) is not None
                or get_field(self.ctx_field(CTX_PUTS), self.turns, self.at[PUTS_BUSY], "busy")):
            self.handed_over += 1
            return self.general(conn, cmd)
        topic = <object>f.topic
        version = self.core.metadata_version
        if version != self.version:
            self.queues.clear()
            self.version = version
        found = PyDict_GetItem(self.queues, topic)
        if found is NULL:
            queues = self.core.plain_send_queues(topic)
            # Only a topic the lane takes is kept: its name is one the broker holds (at most
            # 127 characters), where a client's unknown names could be anything up to a frame.
            if queues and len(self.queues) < MAX_CACHED:
                self.queues[topic] = queues
        else:
            queues = <object>found
        if f.queue_id >= queues:
            self.handed_over += 1
            return self.general(conn, cmd)
        peer = conn.peer
        found = PyDict_GetItem(self.hosts, peer)
        if found is NULL:
            host = self.parse_host(peer)
            born_host = None if self.is_ipv6(host) else self.host_bytes(host)
            if len(self.hosts) < MAX_CACHED:
                self.hosts[peer] = born_host
        else:
            born_host = <object>found
        if born_host is None:
            self.handed_over += 1
            return self.general(conn, cmd)
        properties = "" if f.properties is NULL else <object>f.properties
        plain = self.plain_records(
            [(f.flag, self.cmd_field(cmd, CMD_BODY), f.sys_flag, properties or "")], topic,
            f.queue_id, f.born, born_host, self.store_host, f.reconsume, self.cluster_entry,
            self.max_body)
        if plain is None:  # a message that needs routing
            self.handed_over += 1
            return self.general(conn, cmd)
        appended = self.log.append(plain[0])
        if isinstance(appended, self.appended_records):
            place = appended.single()
            if place is not None:  # stored
                (physical, size, queue_offset), host = place
                stats = self.ctx_field(CTX_STATS)
                self.count(stats, STATS_MESSAGES, 1)
                self.count(stats, STATS_BYTES, size)
                self.taken += 1
                opaque = self.cmd_field(cmd, CMD_OPAQUE)
                if binary:
                    return splice_binary(self.binary_fixed, self.binary_fields, host,
                                         physical, f.queue_id, queue_offset, opaque)
                return splice(self.pieces, self.order, host, physical, f.queue_id,
                              queue_offset, opaque)
        self.handed_over += 1
        return self.answer_put(cmd, topic, f.queue_id, appended)


def answer_frame(template, host, physical_offset, queue_id, queue_offset, opaque):
    """The answer frame ``template`` (evq.net.broker.send.answer_template) makes of these
    values (the msgId of ``host`` bytes and the physical offset), as the lane writes it."""
    pieces, order = checked_template(template)
    return splice(pieces, order, host, physical_offset, queue_id, queue_offset, opaque)


def binary_answer_frame(template, host, physical_offset, queue_id, queue_offset, opaque):
    """The binary answer frame ``template`` (evq.net.broker.send.binary_answer_template)
    makes of these values, as the lane writes it."""
    fixed, fields = checked_binary_template(template)
    return splice_binary(fixed, fields, host, physical_offset, queue_id, queue_offset, opaque)


cdef tuple checked_template(object template):
    """``template`` as the lane splices it: four values, each ordered once, and a piece of
    bytes around each; else a ValueError."""
    pieces, order = template
    if (type(pieces) is not tuple or type(order) is not tuple
            or sorted(order) != [MSG_ID, QUEUE_ID, QUEUE_OFFSET, OPAQUE]
            or len(pieces) != len(order) + 1 or any(type(p) is not bytes for p in pieces)):
        raise ValueError(f"not an answer template: {template!r:.200}")
    return pieces, order


cdef tuple checked_binary_template(object template):
    """``template`` as the lane writes it: the four fixed numbers in their fields' ranges, at
    most MAX_FIELDS fields of bytes keys, each value literal bytes or msgId, queueId or
    queueOffset, each of the three once; else a ValueError."""
    fixed, fields = template
    if (type(fixed) is not tuple or len(fixed) != 4 or type(fields) is not tuple
            or any(type(n) is not int for n in fixed)
            or not (-2**15 <= fixed[0] < 2**15 and 0 <= fixed[1] < 256
                    and -2**15 <= fixed[2] < 2**15 and -2**31 <= fixed[3] < 2**31)
            or len(fields) > MAX_FIELDS
            or any(type(f) is not tuple or len(f) != 2 or type(f[0]) is not bytes
                   or type(f[1]) not in (bytes, int) for f in fields)
            or sorted(f[1] for f in fields if type(f[1]) is int)
            != [MSG_ID, QUEUE_ID, QUEUE_OFFSET]):
        raise ValueError(f"not a binary answer template: {template!r:.200}")
    return fixed, fields


cdef void answer_values(bytes host, long long physical_offset, long long queue_id,
                        long long queue_offset, long long opaque,
                        uint8_t values[4][MAX_VALUE], Py_ssize_t lengths[4]) except *:
    """The answer's four values as text: the msgId is RocketMQ's offsetMsgId, ``host`` and
    the 8-byte physical offset in uppercase hex; the others in decimal."""
    cdef Py_ssize_t i, host_size
    cdef const uint8_t* h
    if host is None or 2 * (PyBytes_GET_SIZE(host) + 8) > MAX_VALUE:
        raise ValueError(f"a store host the answer cannot hold: {host!r:.80}")
    host_size, h = PyBytes_GET_SIZE(host), <const uint8_t*>PyBytes_AS_STRING(host)
    for i in range(host_size):
        values[MSG_ID][2 * i] = HEX[h[i] >> 4]
        values[MSG_ID][2 * i + 1] = HEX[h[i] & 15]
    for i in range(8):
        values[MSG_ID][2 * (host_size + i)] = HEX[(physical_offset >> (60 - 8 * i)) & 15]
        values[MSG_ID][2 * (host_size + i) + 1] = HEX[(physical_offset >> (56 - 8 * i)) & 15]
    lengths[MSG_ID] = 2 * (host_size + 8)
    lengths[QUEUE_ID] = decimal(queue_id, values[QUEUE_ID])
    lengths[QUEUE_OFFSET] = decimal(queue_offset, values[QUEUE_OFFSET])
    lengths[OPAQUE] = decimal(opaque, values[OPAQUE])


cdef object splice_binary(tuple fixed, tuple fields, bytes host, long long physical_offset,
                          long long queue_id, long long queue_offset, long long opaque):
    """The processor's binary answer frame with these values (see
    evq.net.broker.send.binary_answer_template), the opaque in its int32 field."""
    cdef uint8_t values[4][MAX_VALUE]
    cdef Py_ssize_t lengths[4]
    cdef Text texts[2 * MAX_FIELDS]
    cdef Text remark
    cdef Py_ssize_t k, which
    answer_values(host, physical_offset, queue_id, queue_offset, opaque, values, lengths)
    for k in range(len(fields)):
        key, value = <tuple>fields[k]
        texts[2 * k].data, texts[2 * k].size = PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)
        if type(value) is int:
            which = value
            texts[2 * k + 1].data = <const char*>values[which]
            texts[2 * k + 1].size = lengths[which]
        else:
            texts[2 * k + 1].data = PyBytes_AS_STRING(value)
            texts[2 * k + 1].size = PyBytes_GET_SIZE(value)
    remark.data, remark.size = NULL, 0
    return binary_frame(fixed[0], fixed[1], fixed[2], <int32_t>opaque, fixed[3], remark, texts,
                        len(fields), b"")


cdef bytes splice(tuple pieces, tuple order, bytes host, long long physical_offset,
                  long long queue_id, long long queue_offset, long long opaque):
    """The processor's answer frame with these values (see evq.net.broker.send)."""
    cdef uint8_t values[4][MAX_VALUE]
    cdef Py_ssize_t lengths[4]
    cdef Py_ssize_t n, header = 0, i, at
    cdef bytes piece, frame
    cdef uint8_t* out
    answer_values(host, physical_offset, queue_id, queue_offset, opaque, values, lengths)
    n = len(order)
    for i in range(n + 1):
        header += PyBytes_GET_SIZE(<bytes>pieces[i])
    for i in range(n):
        header += lengths[<int>order[i]]
    frame = PyBytes_FromStringAndSize(NULL, 8 + header)
    out = <uint8_t*>PyBytes_AS_STRING(frame)
    put32(out, <unsigned int>(4 + header))
    put32(out + 4, <unsigned int>header)  # a JSON header: serialize type 0 in the top byte
    at = 8
    for i in range(n + 1):
        piece = <bytes>pieces[i]
        memcpy(out + at, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece))
        at += PyBytes_GET_SIZE(piece)
        if i < n:
            memcpy(out + at, values[<int>order[i]], lengths[<int>order[i]])
            at += lengths[<int>order[i]]
    return frame
