# cython: language_level=3
"""The compiled twin of :func:`evq.domain.message.new_message`, which stays the reference and
the fallback (see the end of that module).

A producer makes a message for every send, and most of what that cost was the generated
``Message.__init__`` setting fifteen fields one interpreted step at a time, ten of them the
broker's, to their defaults (issue 18).  Here the message is made with ``object.__new__`` and
its fields are set from C: the producer's from the arguments, the broker's to the class's own
defaults, which :func:`bind` reads from its attrs fields (and refuses a class it could not make
so: a field added before ``sysflag``, a default made by a factory, a validator, converter or
hook the generated ``__init__`` would run).  The rest is the pure function's own code,
compiled: tests/domain/test_message_kernels.py holds the two to the same message and the same
errors.

The module imports nothing from evq: :func:`bind` hands it the class and the constants, once,
when evq.domain.message loads it.
"""

import zlib

import attrs

cdef type Message = None
cdef object object_new = object.__new__
cdef tuple broker_names = ()  # the fields after the producer's, and their defaults
cdef tuple broker_defaults = ()
cdef str tags_name = None
cdef str keys_name = None
cdef str key_separator = None
cdef object compressed_bit = None
cdef object compress_over_default = None
cdef object DEFAULT = object()  # compress_over not given: the bound default

PRODUCER_FIELDS = ("topic", "body", "flag", "properties", "queue_id", "sysflag")
"""The fields new_message sets, in the order they come first in Message."""


def bind(*, message, tags, keys, separator, compressed, compress_over) -> None:
    """Hand the kernel the class it makes and the names and numbers new_message uses (called
    once by evq.domain.message).  A class the kernel cannot make as its ``__init__`` would
    stops the import."""
    global Message, broker_names, broker_defaults, tags_name, keys_name, key_separator
    global compressed_bit, compress_over_default
    fields = attrs.fields(message)
    names = tuple(a.name for a in fields)
    if names[:len(PRODUCER_FIELDS)] != PRODUCER_FIELDS:
        raise RuntimeError(f"{message.__name__} fields changed: {names}")
    for a in fields:
        if (a.validator is not None or a.converter is not None or not a.init
                or a.on_setattr not in (None, attrs.setters.NO_OP)):
            raise RuntimeError(f"{message.__name__}.{a.name} is not a plain field")
    owned = fields[len(PRODUCER_FIELDS):]
    if any(a.default is attrs.NOTHING or isinstance(a.default, attrs.Factory) for a in owned):
        raise RuntimeError(f"{message.__name__} has a field without a plain default")
    if any(hasattr(message, hook) for hook in ("__attrs_pre_init__", "__attrs_post_init__",
                                              "__attrs_init_subclass__")):
        raise RuntimeError(f"{message.__name__} has an init hook")
    Message = message
    broker_names = tuple(a.name for a in owned)
    broker_defaults = tuple(a.default for a in owned)
    tags_name, keys_name, key_separator = tags, keys, separator
    compressed_bit, compress_over_default = compressed, compress_over


def new_message(topic, body, *, tags=None, keys=None, properties=None, flag=0,
                compress_over=DEFAULT):
    """A producer-side message: tags/keys folded into properties, large bodies compressed."""
    if compress_over is DEFAULT:
        compress_over = compress_over_default
    props = dict(properties) if properties else {}
    if tags:
        props[tags_name] = tags
    if keys:
        props[keys_name] = keys if isinstance(keys, str) else key_separator.join(keys)
    sysflag = 0
    if compress_over is not None and len(body) >= compress_over:
        body = zlib.compress(body, 5)
        sysflag |= compressed_bit
    msg = object_new(Message)
    msg.topic = topic
    msg.body = body
    msg.flag = flag
    msg.properties = props
    msg.queue_id = 0
    msg.sysflag = sysflag
    cdef Py_ssize_t i
    for i in range(len(broker_names)):
        setattr(msg, <str>broker_names[i], broker_defaults[i])
    return msg
