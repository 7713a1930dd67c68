"""What a send request carries, on its way to the log: the plain path and the Message path.

A send (one message, or each entry of a batch) arrives as a flag, a body, a sysflag and a
properties string.  Almost every one needs no routing: the broker drops ``WAIT``, appends
``CLUSTER`` and stores it under the topic it was sent to.  For those the put path works on
the string itself (:func:`plain_message`): no :class:`~evq.domain.message.Message`, no
property map decoded in Python and encoded again.  Everything else (a retry topic that may
overflow to the DLQ, a transaction half, a delay level, a deliver-at time, a properties
string the Message path would normalise) takes :func:`sent_messages`, the general path.
The two store the same bytes for every message the plain path takes (tests/domain/
test_sent.py proves it over the whole property space); so the plain path must refuse
(return None) whenever it is not sure.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Final

import attrs

from evq.domain.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    Host,
    Message,
    Prop,
    decode_properties,
    waits_for_store,
)

SentEntry = tuple[int, bytes, int, str]
"""``(flag, body as stored, sysflag, properties string)`` of one message of a send request."""

ROUTED: Final = frozenset({Prop.TRAN_MSG, Prop.DELAY, Prop.START_DELIVER_TIME, Prop.CLUSTER})
"""Properties whose presence sends a message the general way: the first three may route it
(or make a batch illegal), and a CLUSTER the producer set is overwritten in place."""

_split = str.split


@attrs.define(slots=True)
class PlainMessage:
    """A sent message that needs no routing (see :func:`plain_message`).  Not frozen, for
    the reason :class:`~evq.domain.record.PutRecord` is not: one is built per message."""

    flag: int
    body: bytes
    sysflag: int
    properties: bytes
    """The string as stored (WAIT removed, CLUSTER appended), in UTF-8."""
    names: dict[str, str]
    """The properties as the producer sent them: read for the tags code and index keys."""
    wait: bool
    """:func:`~evq.domain.message.waits_for_store` of the properties sent."""


def cluster_property(cluster: str) -> str | None:
    """The ``CLUSTER`` entry a broker of ``cluster`` appends; None when the name holds a
    separator (the Message path refuses such a string: no plain path then)."""
    if NAME_VALUE_SEPARATOR in cluster or PROPERTY_SEPARATOR in cluster:
        return None
    return f"{Prop.CLUSTER}{NAME_VALUE_SEPARATOR}{cluster}{PROPERTY_SEPARATOR}"


def plain_message(entry: SentEntry, cluster_entry: str) -> PlainMessage | None:
    """``entry`` stored without routing, or None when it needs the Message path.

    Taken only when the string is exactly what encoding its own decoded map gives (each
    entry ``name\\x01value\\x02`` with a non-empty, unique name; Java's missing last
    separator excepted): then dropping WAIT and appending CLUSTER to the string equals the
    Message path's pop, assignment and encoding, byte for byte.
    """
    flag, body, sysflag, text = entry
    if not text:
        return PlainMessage(flag, body, sysflag, cluster_entry.encode(), {}, True)
    if text[-1] != PROPERTY_SEPARATOR:
        text += PROPERTY_SEPARATOR  # as Java sends it
    pieces = text[:-1].split(PROPERTY_SEPARATOR)
    try:
        # Built in C: a piece without exactly one name-value separator fails to unpack.
        names = dict(map(_split, pieces, repeat(NAME_VALUE_SEPARATOR)))
    except ValueError:
        return None
    if len(names) != len(pieces) or "" in names or not ROUTED.isdisjoint(names):
        return None  # a repeated or empty name, or a property that routes
    wait = names.get(Prop.WAIT)
    if wait is not None:
        # Names are unique and separators delimit entries, so this entry occurs once.
        entry_text = f"{Prop.WAIT}{NAME_VALUE_SEPARATOR}{wait}{PROPERTY_SEPARATOR}"
        if text.startswith(entry_text):
            text = text[len(entry_text):]
        else:
            text = text.replace(PROPERTY_SEPARATOR + entry_text, PROPERTY_SEPARATOR, 1)
    try:
        stored = (text + cluster_entry).encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate (JSON headers may escape one): the general path refuses
    return PlainMessage(flag, body, sysflag, stored, names, waits_for_store(names))


def sent_messages(
    topic: str, entries: Iterable[SentEntry], *, queue_id: int, born_timestamp: int,
    born_host: Host, reconsume_times: int,
) -> list[Message]:
    """The general path's :class:`Message` per entry, for :meth:`evq.domain.broker.Broker.put`."""
    return [Message(topic=topic, body=body, flag=flag, properties=decode_properties(text),
                    queue_id=queue_id, sysflag=sysflag, born_timestamp=born_timestamp,
                    born_host=born_host, reconsume_times=reconsume_times)
            for flag, body, sysflag, text in entries]
