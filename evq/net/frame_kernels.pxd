# What other compiled modules cimport of the frame kernels (evq/net/frame_kernels.pyx): the
# send header's usual case, read into C values, and the ROCKETMQ header's writer (the send
# lane, evq/net/broker/send_lane.pyx).

from cpython.object cimport PyObject
from libc.stdint cimport int32_t


cdef struct SendFields:
    PyObject* topic  # borrowed from the fields read, as the two below (NULL: absent)
    PyObject* default_topic
    PyObject* properties
    long long queue_id
    long long sys_flag
    long long born
    long long queue_nums
    long long flag
    long long reconsume
    long long max_reconsume
    bint has_max_reconsume  # read (request version 121 on), else None in SendHeader
    bint batch


cdef bint read_send_fields(object code, object version, dict fields, SendFields* out)


cdef struct Text:
    const char* data  # UTF-8 bytes, borrowed (NULL with size 0: none)
    Py_ssize_t size


cdef object binary_frame(int code, int language, int version, int32_t opaque, int32_t flag,
                         Text remark, const Text* texts, Py_ssize_t count, object body)
