# The slots of evq's attrs classes, read and set by their offsets in the object: shared by the
# compiled kernels that build or read one object per record (evq/domain/record_kernels.pyx,
# evq/backends/mmapfile/store_kernels.pyx), which cimport them.  Going through a slot's
# descriptor (or the class's generated __init__) costs more than the rest of building one.

from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF

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


cdef inline object slot_at(object obj, Py_ssize_t at, str name):
    """The value in the slot at ``at`` of ``obj`` (whose class the caller checked), or, where
    it was never set, what ``getattr(obj, name)`` does (raises AttributeError)."""
    cdef PyObject* value = (<PyObject**>(<char*>(<PyObject*>obj) + at))[0]
    if value is NULL:
        return getattr(obj, name)
    return <object>value


cdef inline int replace_slot(object obj, Py_ssize_t at, object value) except -1:
    """Set the slot at ``at`` of ``obj`` (whose class the caller checked), releasing what it
    held."""
    cdef PyObject** slot = <PyObject**>(<char*>(<PyObject*>obj) + at)
    cdef PyObject* old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject*>value
    Py_XDECREF(old)
    return 0


cdef inline object get_field(object obj, type cls, Py_ssize_t at, str name):
    """``getattr(obj, name)``, read from its slot where ``obj`` is exactly a ``cls`` (a
    subclass might make the name a property)."""
    if <PyObject*>Py_TYPE(obj) is not <PyObject*>cls:
        return getattr(obj, name)
    return slot_at(obj, at, name)


cdef inline int set_field(object obj, type cls, Py_ssize_t at, str name,
                          object value) except -1:
    """``setattr(obj, name, value)``, written to its slot where ``obj`` is exactly a
    ``cls``."""
    if <PyObject*>Py_TYPE(obj) is not <PyObject*>cls:
        setattr(obj, name, value)
        return 0
    return replace_slot(obj, at, value)
