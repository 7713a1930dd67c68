# The slots of evq's attrs classes, read and set by their offsets in the object: shared by the
# compiled kernels that build or read one object per record (evq/domain/record_kernels.pyx,
# evq/backends/mmapfile/store_kernels.pyx), which cimport them.  Going through a slot's
# descriptor (or the class's generated __init__) costs more than the rest of building one.

from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF

cdef extern from "Python.h":
    ctypedef object (*allocfunc)(void*, Py_ssize_t)
    ctypedef struct AllocSlot "PyTypeObject":
        allocfunc tp_alloc
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    PyTypeObject PyMemberDescr_Type
    PyTypeObject* Py_TYPE(object)


cdef inline Py_ssize_t slot_offset(object cls, str name) except -1:
    """Where the objects of ``cls`` keep field ``name``; refuses a field that is no slot (the
    class changed: the kernels would write past its objects)."""
    descriptor = cls.__dict__.get(name)
    if Py_TYPE(descriptor) is not &PyMemberDescr_Type:
        raise RuntimeError(f"{cls.__name__}.{name} is no longer a slot")
    return (<PyMemberDescrObject*>descriptor).d_member.offset


cdef inline Py_ssize_t inherited_slot_offset(type cls, str name) except -1:
    """:func:`slot_offset` of the class in ``cls``'s MRO that declares ``name`` (a subclass
    keeps its bases' slots where they are)."""
    for base in cls.__mro__:
        if name in base.__dict__:
            return slot_offset(base, name)
    raise RuntimeError(f"{cls.__name__}.{name} is no slot")


cdef inline object new_instance(type cls):
    """``object.__new__(cls)`` for a slots class without a ``__new__`` of its own: an
    instance with every slot empty, allocated by the type itself (no call through Python)."""
    return (<AllocSlot*>cls).tp_alloc(<void*>cls, 0)


cdef inline void set_new(object obj, Py_ssize_t at, object value) noexcept:
    """Set a slot of an object just made (the slot is empty, nothing to release)."""
    Py_INCREF(value)
    (<PyObject**>(<char*>(<PyObject*>obj) + at))[0] = <PyObject*>value
