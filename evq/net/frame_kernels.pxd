# What other compiled modules cimport of the frame kernels (evq/net/frame_kernels.pyx): the
# send header's usual case, read into C values (the send lane, evq/net/broker/send_lane.pyx).

from cpython.object cimport PyObject


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
