"""The compiled ``new_message`` (evq/domain/message_kernels.pyx) against its pure reference.

For any arguments, of the types a caller should pass and of others, the two must make equal
messages, field by field (``body_crc`` included), or raise the same error.  The module also
checks that the compiled function is the one in use wherever a C compiler exists, that the
variable selects pure Python, and that the kernel refuses a class it could not make as the
class's own ``__init__`` would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain import message
from evq.domain.message import (
    COMPILED_NEW_MESSAGE,
    COMPRESS_OVER,
    PURE_NEW_MESSAGE,
    PURE_PYTHON_VARIABLE,
    Message,
)
from tests.processes import REPO_ROOT, python_env
from tests.strategies import bodies, key_lists, keys, properties, tags, topics

PURE_RUN = os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0")

pytestmark = pytest.mark.skipif(COMPILED_NEW_MESSAGE is None,
                                reason="the compiled kernels are not built")

_NOT_GIVEN = object()


def outcome(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """What a call gives: every field of its message, or what it raised (type and text)."""
    try:
        msg = fn(*args, **kwargs)
    except Exception as exc:  # the comparison is the point: any error must match
        return "raised", (type(exc), str(exc))
    return "value", (type(msg), attrs.asdict(msg, recurse=False), msg.body_crc)


def test_the_compiled_function_is_built_and_used_where_a_compiler_is() -> None:
    assert message.new_message is (PURE_NEW_MESSAGE if PURE_RUN else COMPILED_NEW_MESSAGE)


def test_the_variable_selects_the_pure_function() -> None:
    program = ("from evq.domain import message as m; "
               "assert m.new_message is m.PURE_NEW_MESSAGE and m.COMPILED_NEW_MESSAGE is None")
    env = {**python_env(), PURE_PYTHON_VARIABLE: "1"}
    subprocess.run([sys.executable, "-c", program], check=True, cwd=REPO_ROOT, env=env)


_anything = st.none() | st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=2)


@given(
    topic=topics | _anything,
    body=bodies | st.binary(min_size=COMPRESS_OVER - 2, max_size=COMPRESS_OVER + 2)
    | st.builds(bytearray, bodies) | _anything,
    tags=st.none() | st.just("") | tags | _anything,
    keys=st.none() | keys | key_lists | st.just([]) | _anything,
    props=st.none() | properties | st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)),
                                            max_size=3) | _anything,
    flag=st.just(_NOT_GIVEN) | st.integers() | _anything,
    compress_over=st.just(_NOT_GIVEN) | st.none() | st.integers(-2, 5000) | st.floats()
    | _anything,
)
def test_the_same_message_or_the_same_error(topic: Any, body: Any, tags: Any, keys: Any,
                                            props: Any, flag: Any, compress_over: Any) -> None:
    kwargs = {"tags": tags, "keys": keys, "properties": props}
    if flag is not _NOT_GIVEN:
        kwargs["flag"] = flag
    if compress_over is not _NOT_GIVEN:
        kwargs["compress_over"] = compress_over
    compiled = outcome(COMPILED_NEW_MESSAGE, (topic, body), kwargs)
    assert compiled == outcome(PURE_NEW_MESSAGE, (topic, body), kwargs)


def test_the_defaults_are_the_pure_functions() -> None:
    for body in (b"small", bytes(COMPRESS_OVER)):
        assert (outcome(COMPILED_NEW_MESSAGE, ("T", body), {})
                == outcome(PURE_NEW_MESSAGE, ("T", body), {}))
    assert COMPILED_NEW_MESSAGE("T", bytes(COMPRESS_OVER)).sysflag  # compressed by default


def test_a_message_is_a_new_object_with_its_own_properties() -> None:
    props = {"a": "1"}
    first, second = COMPILED_NEW_MESSAGE("T", b"", properties=props), COMPILED_NEW_MESSAGE("T", b"")
    assert first.properties == props and first.properties is not props
    assert second.properties == {} and second.properties is not COMPILED_NEW_MESSAGE(
        "T", b"").properties


def test_a_class_the_kernel_cannot_make_stops_the_import() -> None:
    from evq.domain import message_kernels

    @attrs.define(slots=True)
    class Validated:
        topic: str
        body: bytes = b""
        flag: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
        properties: dict[str, str] = attrs.field(factory=dict)
        queue_id: int = 0
        sysflag: int = 0

    @attrs.define(slots=True)
    class Reordered:
        body: bytes
        topic: str = ""

    @attrs.define(slots=True)
    class Factoried:
        topic: str
        body: bytes = b""
        flag: int = 0
        properties: dict[str, str] = attrs.field(factory=dict)
        queue_id: int = 0
        sysflag: int = 0
        extra: list[int] = attrs.field(factory=list)

    for cls in (Validated, Reordered, Factoried):
        with pytest.raises(RuntimeError):
            message_kernels.bind(message=cls, tags="TAGS", keys="KEYS", separator=" ",
                                 compressed=1, compress_over=COMPRESS_OVER)
    # and the module is left bound to Message, as evq.domain.message bound it
    assert type(COMPILED_NEW_MESSAGE("T", b"")) is Message
