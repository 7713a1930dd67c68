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
from evq.net.transport import Connection, Handler

GROUP_FIELDS: Final = ("consumerGroup", "producerGroup", "group")
# Sends may come with SendMessageRequestHeaderV2's one-letter names, where "a" is producerGroup.
SEND_GROUP_FIELDS: Final = ("producerGroup", "a")
SEND_CODES: Final = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                               RequestCode.SEND_BATCH_MESSAGE})


def group_fields(cmd: RemotingCommand) -> tuple[str, ...]:
    return SEND_GROUP_FIELDS if cmd.code in SEND_CODES else GROUP_FIELDS


def names_checked(handler: Handler) -> Handler:
    """``handler`` behind the group-name check; a refused name is answered SYSTEM_ERROR (as
    :func:`~evq.domain.groups.validate_group` says) and never reaches the processor.  An empty
    field counts as absent, as the processors read it.

    The check is a plain function returning the handler's coroutine: it raises before the
    handler starts, inside the dispatcher's ``await`` (which answers the refusal), and a
    request pays no coroutine of its own for it."""

    def checked(conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        fields = cmd.ext_fields
        for name in group_fields(cmd):
            value = fields.get(name)
            if value:
                validate_group(value)
        return handler(conn, cmd)

    return checked
