# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The connection's read path, compiled: the same methods as the pure-Python
:class:`evq.net.transport.ReadPath`, which stays the reference and the fallback (see
``_compiled_read_path`` there).

Every request a broker takes and every answer a client reads goes through this: the bytes read
copied to the frame decoder's buffer, each whole frame taken (the frame kernels' ``take_frame``),
the connection's limits checked before the first frame and after each, and an eager handler run
and its answer written, all in C.  In Python that was about 330 bytecodes of the 820 the broker
ran for a 1 KiB send (issue 18); here it is none.  What is rare stays the connection's own
Python methods, called from here exactly where the reference calls them: a refusal
(``_refuse``), a response to a pending request (``_resolve``), a lazy dispatcher's task
(``_spawn`` of ``_handle``), the task for an eager handler that suspends, an answer that cannot
be encoded, and pausing or resuming reading (``_update_reading``).
tests/net/test_read_path.py holds the two to the same writes, calls and limits.

The class is a base of :class:`evq.net.transport.Connection`, which sets every field below in
its ``__init__``: they are C fields here and instance attributes in the reference, and the
connection's Python code reads and writes them the same way in both.  The module imports
nothing from evq: :func:`bind` hands it the functions it calls, once, when evq.net.transport
loads it.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_Check
from evq.slots cimport get_field, set_field, slot_offset
from libc.string cimport memcpy

cdef extern from "Python.h":
    Py_ssize_t PySet_GET_SIZE(object)
    ctypedef struct Py_buffer:
        void* buf
        Py_ssize_t len
    Py_buffer* PyMemoryView_GET_BUFFER(object)
    int PyObject_GetBuffer(object, Py_buffer*, int) except -1
    void PyBuffer_Release(Py_buffer*)
    enum: PyBUF_SIMPLE

# Bound by bind(): the transport's and the protocol's functions and constants.
cdef object take_frame = None
cdef object ProtocolError = None
cdef tuple answers = None
cdef object unsupported = None
cdef object failed = None
cdef object resumed = None
cdef long response_flag = 0
cdef long oneway_flag = 0
# Where a frame decoder keeps its buffer, position and failure (its slots), read and set here
# by their offsets: through their descriptors, a dozen lookups a request.
cdef type Decoder = None
cdef Py_ssize_t D_BUF = 0, D_POS = 0, D_FAILED = 0
KEEP_DRAINED_BYTES = 4 * 1024
"""The largest drained decoder buffer kept for the next read (see ``next_command``): a request
of a message of a KiB or two reuses its memory, a larger one's is given back.  What is kept
sits outside the server's read budget, so it is small: at most ``max_connections`` times this
(40 MiB at the default 10,000 connections)."""
cdef Py_ssize_t KEEP_DRAINED = KEEP_DRAINED_BYTES


def bind(*, take_frame, protocol_error, answers, unsupported, failed, resumed, response_flag,
         oneway_flag, decoder) -> None:
    """Hand the read path the frame kernel, the protocol's error and flags and the dispatcher's
    answers it shares with the reference (called once by evq.net.transport)."""
    global Decoder, D_BUF, D_POS, D_FAILED
    _bind(take_frame, protocol_error, answers, unsupported, failed, resumed, response_flag,
          oneway_flag)
    D_BUF, D_POS, D_FAILED = (slot_offset(decoder, name) for name in ("_buf", "_pos", "_failed"))
    Decoder = decoder


cdef _bind(take, error, kinds, unsupported_answer, failed_answer, resume, long response,
           long oneway):
    global take_frame, ProtocolError, answers, unsupported, failed, resumed
    global response_flag, oneway_flag
    take_frame, ProtocolError, answers = take, error, kinds
    unsupported, failed, resumed = unsupported_answer, failed_answer, resume
    response_flag, oneway_flag = response, oneway


cdef inline Py_ssize_t decoder_pos(object decoder) except -1:
    return get_field(decoder, Decoder, D_POS, "_pos")


cdef int append_bytes(object decoder, const char* data, Py_ssize_t n) except -1:
    """Add ``n`` bytes at ``data`` to the decoder's buffer; a drained one (its position at its
    end, left so by next_command) is written over from its start, in the memory it has."""
    cdef bytearray buf = get_field(decoder, Decoder, D_BUF, "_buf")
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    if size and decoder_pos(decoder) == size:
        PyByteArray_Resize(buf, n)  # no realloc while n stays within the memory it holds
        set_field(decoder, Decoder, D_POS, "_pos", 0)
        size = 0
    else:
        PyByteArray_Resize(buf, size + n)
    memcpy(PyByteArray_AS_STRING(buf) + size, data, n)
    return 0


cdef class ReadPath:
    """The reference's methods over C fields (see the module's docstring)."""

    cdef public object _decoder, _dispatcher, _clock, _transport, _read_view, last_active
    cdef public set _tasks
    cdef public Py_ssize_t _held, _partial, _max_in_flight, _max_request_bytes
    cdef public bint _stopped, _reading, _writing_paused, _pause_on_write, _budget_paused

    # -- asyncio.BufferedProtocol, and the methods the connection calls ------------------------

    def get_buffer(self, sizehint):
        return self._read_view

    def buffer_updated(self, Py_ssize_t nbytes):
        self.last_active = self._clock.monotonic()
        self.feed_read(nbytes)
        self.pump()

    def data_received(self, data):
        cdef Py_buffer view
        self.last_active = self._clock.monotonic()
        decoder = self._decoder
        if get_field(decoder, Decoder, D_FAILED, "_failed") is None:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            try:
                append_bytes(decoder, <const char*>view.buf, view.len)
            finally:
                PyBuffer_Release(&view)
        self.pump()

    def _may_take(self):
        return self.may_take()

    def _pump(self):
        self.pump()

    def _start(self, cmd, Py_ssize_t size):
        self.start(cmd, size)

    def _answer(self, cmd, response):
        self.answer(cmd, response)

    # -- the reference's methods, in C ---------------------------------------------------------

    cdef int feed_read(self, Py_ssize_t nbytes) except -1:
        """The decoder's ``feed`` of the first ``nbytes`` of the read buffer, copied straight
        from it."""
        cdef Py_buffer* view = PyMemoryView_GET_BUFFER(self._read_view)
        decoder = self._decoder
        if not 0 <= nbytes <= view.len:  # never from a transport; sliced as the reference does
            decoder.feed(self._read_view[:nbytes])
            return 0
        if get_field(decoder, Decoder, D_FAILED, "_failed") is not None:
            return 0
        append_bytes(decoder, <const char*>view.buf, nbytes)
        return 0

    cdef inline bint may_take(self):
        return (not self._stopped
                and not (self._writing_paused and self._pause_on_write)
                and PySet_GET_SIZE(self._tasks) < self._max_in_flight
                and self._held < self._max_request_bytes)

    cdef int pump(self) except -1:
        cdef bint take = self.may_take()
        cdef Py_ssize_t before
        cdef bytearray buf
        decoder = self._decoder
        try:
            while take:
                buf = get_field(decoder, Decoder, D_BUF, "_buf")
                before = PyByteArray_GET_SIZE(buf) - decoder_pos(decoder)
                if not before:
                    break
                cmd = self.next_command(decoder, buf)
                if cmd is None:
                    break
                if cmd.flag & response_flag:
                    self._resolve(cmd)
                else:
                    self.start(cmd, before - (PyByteArray_GET_SIZE(buf)
                                              - decoder_pos(decoder)))
                take = self.may_take()
        except ProtocolError as exc:
            self._refuse(exc)
            take = self.may_take()
        buf = get_field(decoder, Decoder, D_BUF, "_buf")
        if PyByteArray_GET_SIZE(buf) - decoder_pos(decoder) != self._partial:
            self._account()  # a frame begun or ended: the budget's business
        if (take and not self._budget_paused) != self._reading:
            self._update_reading()
        return 0

    cdef object next_command(self, decoder, bytearray buf):
        """The decoder's ``next_command``."""
        cdef Py_ssize_t pos
        failure = get_field(decoder, Decoder, D_FAILED, "_failed")
        if failure is not None:
            raise failure
        try:
            cmd = take_frame(decoder)
        except ProtocolError as exc:
            set_field(decoder, Decoder, D_FAILED, "_failed", exc)
            raise
        pos = decoder_pos(decoder)
        if cmd is None:
            if pos:
                del buf[:pos]
                set_field(decoder, Decoder, D_POS, "_pos", 0)
        elif pos == PyByteArray_GET_SIZE(buf) and pos > KEEP_DRAINED:
            PyByteArray_Resize(buf, 0)  # bytearray.clear
            set_field(decoder, Decoder, D_POS, "_pos", 0)
        # A smaller drained buffer stays as it is, its position at its end: the next read
        # writes over it (append_bytes) where clearing it gave its memory back to the
        # allocator and the next read asked for it again, a realloc each way every request.
        return cmd

    cdef int start(self, cmd, Py_ssize_t size) except -1:
        dispatcher = self._dispatcher
        if not dispatcher.eager:
            self._spawn(self._handle(cmd), cmd, size)
            return 0
        handler = dispatcher.handler(cmd.code)
        try:
            outcome = unsupported(cmd) if handler is None else handler(self, cmd)
        except Exception as exc:
            outcome = failed(self, cmd, exc)
        if outcome is None or isinstance(outcome, answers):
            return self.answer(cmd, outcome)
        handling = self._finish(cmd, outcome)
        try:
            suspended_on = handling.send(None)
        except StopIteration:
            return 0  # answered already: no task, nothing held
        except Exception as exc:
            self._failed(exc)
            return 0
        self._spawn(resumed(handling, suspended_on), cmd, size)
        return 0

    cdef int answer(self, cmd, response) except -1:
        transport = self._transport
        if (response is None or cmd.flag & oneway_flag or transport is None
                or transport.is_closing()):
            return 0
        try:
            frame = response if PyBytes_Check(response) else response.encode()
        except ProtocolError as exc:
            frame = self._unencodable(cmd, exc)
        transport.write(frame)
        self.last_active = self._clock.monotonic()
        return 0
