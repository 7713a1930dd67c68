"""The group names a request carries in its header, checked before any processor runs.

RocketMQ's rule for group names (``^[%|a-zA-Z0-9_-]+$``, at most 255 characters) is checked
here once for every request code, so no processor can store, index or snapshot a name the
rule refuses: a 5 MiB group name in UPDATE_CONSUMER_OFFSET used to make every later offsets
snapshot too big to store.  Groups named inside bodies (heartbeats, queue locks) are checked
where those bodies are parsed.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final, cast

from evq.domain.groups import validate_group
from evq.net import protocol
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler, Reply

GROUP_FIELDS: Final = ("consumerGroup", "producerGroup", "group")
# Sends may come with SendMessageRequestHeaderV2's one-letter names, where "a" is producerGroup.
SEND_GROUP_FIELDS: Final = ("producerGroup", "a")
KNOWN_GROUPS: Final = 4096
"""Group names each request code's check remembers as passed: bounded whatever names
clients send (a name past the bound is checked every time)."""
SEND_CODES: Final = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                               RequestCode.SEND_BATCH_MESSAGE})


def group_fields(code: int) -> tuple[str, ...]:
    """The header fields that name a group in a request of ``code``."""
    return SEND_GROUP_FIELDS if code in SEND_CODES else GROUP_FIELDS


class NamesChecked:
    """``handler`` behind the group-name check of the header ``fields``: a refused name is
    answered SYSTEM_ERROR (as :func:`~evq.domain.groups.validate_group` says) and never
    reaches the processor.  An empty field counts as absent, as the processors read it.

    The check is a plain callable returning what the handler returns: it raises before the
    handler starts, and the connection answers the refusal; a request pays no coroutine of
    its own for it.  The names it passed are remembered in :attr:`known` (up to
    :data:`KNOWN_GROUPS`): a producer names the same group on every send, and the rule's
    pattern was a twentieth of a send's time on the broker's loop.

    This is the reference; :class:`evq.net.broker.names_kernels.NamesChecked` is its compiled
    twin (no Python frame a request, one of the few a send paid), which
    :func:`names_checked` chooses where it is built (tests/net/test_group_names.py holds the
    two to the same answers)."""

    __slots__ = ("fields", "handler", "known")

    def __init__(self, fields: tuple[str, ...], handler: Handler) -> None:
        self.fields = fields
        self.handler = handler
        self.known: set[str] = set()

    def __call__(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply] | Reply:
        ext = cmd.ext_fields
        for name in self.fields:
            value = ext.get(name)
            if value and value not in self.known:
                validate_group(value)
                if len(self.known) < KNOWN_GROUPS:
                    self.known.add(value)
        return self.handler(conn, cmd)


def _compiled() -> type[NamesChecked] | None:
    """The compiled check, bound to the rule; None where it was not built, or the frame
    kernels are not built or not wanted (their switch, :data:`evq.net.protocol.COMPILED`)."""
    if protocol.COMPILED is None:
        return None
    try:
        from evq.net.broker import names_kernels
    except ImportError:
        return None
    names_kernels.bind(validate=validate_group, known_groups=KNOWN_GROUPS)
    return cast(type[NamesChecked], names_kernels.NamesChecked)


COMPILED: Final = _compiled()
"""The compiled check, or None where it is not built or not wanted."""
CHECK: Final = COMPILED or NamesChecked
"""The check this process runs."""


def names_checked(code: int, handler: Handler) -> NamesChecked:
    """``handler`` (of request ``code``) behind the group-name check (:class:`NamesChecked`)."""
    return CHECK(group_fields(code), handler)
