# cython: language_level=3
"""The group-name check in front of every request's handler, compiled: the twin of
:class:`evq.net.broker.names.NamesChecked`, which stays the reference and the fallback (see
``_compiled`` there).

Every request goes through the check, so in Python it was a frame a request, one of the few a
single send still paid once the send lane and the store's append were compiled.  Here the
header fields are looked up and the names already passed recognised in C; a name not seen
before is checked by the rule's own Python (``validate``), as the reference checks it.
tests/net/test_group_names.py holds the two to the same answers and the same names remembered.

The module imports nothing from evq: :func:`bind` hands it the rule and the bound, once, when
evq.net.broker.names loads it.
"""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

cdef extern from "Python.h":
    bint PyDict_CheckExact(object)

cdef object validate = None
cdef Py_ssize_t known_groups = 0


def bind(*, validate, known_groups) -> None:
    """Hand the check the rule (``validate_group``) and how many passed names to remember
    (called once by evq.net.broker.names)."""
    _bind(validate, known_groups)


cdef _bind(rule, Py_ssize_t bound):
    global validate, known_groups
    validate, known_groups = rule, bound


cdef class NamesChecked:
    """The reference's ``__call__`` over C fields (see the module's docstring)."""

    cdef readonly tuple fields
    cdef readonly object handler
    cdef readonly set known

    def __init__(self, tuple fields, handler):
        if validate is None:
            raise RuntimeError("names_kernels.bind was not called")
        self.fields, self.handler, self.known = fields, handler, set()

    def __call__(self, conn, cmd):
        cdef PyObject* found
        ext = cmd.ext_fields
        exact = PyDict_CheckExact(ext)
        for name in self.fields:
            if exact:
                found = PyDict_GetItem(ext, name)
                value = None if found is NULL else <object>found
            else:
                value = ext.get(name)
            if value and value not in self.known:
                validate(value)
                if len(self.known) < known_groups:
                    self.known.add(value)
        return self.handler(conn, cmd)
