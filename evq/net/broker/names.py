"""The group names a request carries in its header, checked before any processor runs.

RocketMQ's rule for group names (``^[%|a-zA-Z0-9_-]+$``, at most 255 characters) is checked
here once for every request code, so no processor can store, index or snapshot a name the
rule refuses: a 5 MiB group name in UPDATE_CONSUMER_OFFSET used to make every later offsets
snapshot too big to store.  Groups named inside bodies (heartbeats, queue locks) are checked
where those bodies are parsed.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final

from evq.domain.groups import validate_group
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


def names_checked(code: int, handler: Handler) -> Handler:
    """``handler`` (of request ``code``) behind the group-name check; a refused name is
    answered SYSTEM_ERROR (as :func:`~evq.domain.groups.validate_group` says) and never
    reaches the processor.  An empty field counts as absent, as the processors read it.

    The check is a plain function returning what the handler returns: it raises before the
    handler starts, and the connection answers the refusal; a request pays no coroutine of
    its own for it.  The names it passed are remembered (up to :data:`KNOWN_GROUPS`): a
    producer names the same group on every send, and the rule's pattern was a twentieth of
    a send's time on the broker's loop."""
    fields = group_fields(code)
    known: set[str] = set()

    def checked(conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply] | Reply:
        ext = cmd.ext_fields
        for name in fields:
            value = ext.get(name)
            if value and value not in known:
                validate_group(value)
                if len(known) < KNOWN_GROUPS:
                    known.add(value)
        return handler(conn, cmd)

    return checked
