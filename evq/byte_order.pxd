# Big-endian reads and writes of RocketMQ's integer fields, shared by the compiled kernels
# (evq/domain/record_kernels.pyx, evq/net/frame_kernels.pyx,
# evq/backends/mmapfile/store_kernels.pyx), which cimport them: inline, so each call compiles
# to a few byte moves.

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t


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
