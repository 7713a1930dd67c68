"""What a send request carries, on its way to the log: the plain path and the Message path.

A send (one message, or each entry of a batch) arrives as a flag, a body, a sysflag and a
properties string.  Almost every one needs no routing: the broker drops ``WAIT``, appends
``CLUSTER`` and stores it under the topic it was sent to.  For those the put path works on
the string itself (:func:`plain_records`): no :class:`~evq.domain.message.Message`, no
property map decoded in Python and encoded again, and where the compiled kernels are built
(evq/domain/record_kernels.pyx) one call from the request's entries to the records the log
appends.  Everything else (a retry topic that may overflow to the DLQ, a transaction half, a
delay level, a deliver-at time, a properties string the Message path would normalise) takes
:func:`sent_messages`, the general path.  The two store the same bytes for every message the
plain path takes (tests/domain/test_sent.py proves it over the whole property space); so the
plain path must refuse (return None) whenever it is not sure.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from typing import Final

import attrs

from evq.domain import sysflag as sf
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.hashing import tags_code
from evq.domain.ids import UniqKeyRun
from evq.domain.message import (
    COMPRESS_OVER,
    MAX_PROPERTIES_BYTES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    Host,
    Message,
    Prop,
    decode_properties,
    waits_for_store,
)
from evq.domain.record import KERNELS, PURE, PutRecord, index_keys_of, put_record_of

SentEntry = tuple[int, bytes, int, str]
"""``(flag, body as stored, sysflag, properties string)`` of one message of a send request."""

ROUTED: Final = frozenset({Prop.TRAN_MSG, Prop.DELAY, Prop.START_DELIVER_TIME, Prop.CLUSTER})
"""Properties whose presence sends a message the general way: the first three may route it
(or make a batch illegal), and a CLUSTER the producer set is overwritten in place."""

_split = str.split
_NOT_HOST_BITS = ~(sf.BORNHOST_V6 | sf.STOREHOST_V6)  # encoding derives them from the hosts


def body_too_large(size: int, limit: int) -> BrokerError:
    """The refusal of a message body over maxMessageSize."""
    return BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                       f"message body size {size} exceeds the maximum {limit}")


def properties_too_long() -> BrokerError:
    """The refusal of a properties string, as stored, over the record's limit."""
    return BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                       f"message properties exceed {MAX_PROPERTIES_BYTES} bytes")


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
    names: dict[str, str] = {}
    if text:
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


def sent_batch(body: bytes | memoryview, sysflag: int) -> list[SentEntry]:
    """A batch body's entries as single sends carry them: each stored record has its own
    compression flag, as a single send would, so bodies of :data:`COMPRESS_OVER` bytes or
    more are deflated here.  Malformed input raises :class:`~evq.domain.record.RecordError`."""
    return sent_entries(PURE.split_batch(body), sysflag & ~sf.COMPRESSED)


def sent_entries(messages: Iterable[tuple[int, bytes, str]], sysflag: int = 0
                 ) -> list[SentEntry]:
    """``(flag, body, properties string)`` of messages sent with ``sysflag`` as a producer
    sends them: bodies of :data:`COMPRESS_OVER` bytes or more deflated, and so flagged."""
    return [(flag, zlib.compress(b, 5), sysflag | sf.COMPRESSED, props)
            if len(b) >= COMPRESS_OVER else (flag, b, sysflag, props)
            for flag, b, props in messages]


@attrs.frozen(slots=True)
class KeyedSend:
    """The messages of a send that share one properties string but for the UNIQ_KEY each
    carries last: an embedded producer's batch (:meth:`evq.embedded.Broker.send_batch`), whose
    properties are the call's and whose keys are made together.  It stands for its
    :meth:`entries` wherever a send's entries go (it has their length and iterates as them);
    the compiled plain path reads it as it is, one properties string and one key run, and
    builds no entry, no string and no property map per message."""

    bodies: Sequence[bytes | str]
    """As the caller gave them: text is stored as UTF-8, as a producer encodes it."""
    text: str
    """The shared properties string (every entry ends in its separator), UNIQ_KEY not among
    them."""
    keys: UniqKeyRun

    def __attrs_post_init__(self) -> None:
        if len(self.bodies) != self.keys.count:
            raise ValueError(f"{len(self.bodies)} bodies for {self.keys.count} keys")

    def __len__(self) -> int:
        return len(self.bodies)

    def __iter__(self) -> Iterator[SentEntry]:
        return iter(self.entries())

    def entries(self) -> list[SentEntry]:
        """The send's entries, as :func:`sent_entries` makes a producer's."""
        head = f"{self.text}{Prop.UNIQ_KEY}{NAME_VALUE_SEPARATOR}"
        return sent_entries(zip(
            repeat(0), [b.encode() if isinstance(b, str) else b for b in self.bodies],
            [f"{head}{key}{PROPERTY_SEPARATOR}" for key in self.keys.as_list()]))


PlainRecords = tuple[list[PutRecord], bool]
"""The records of a send the plain path took, and whether its producer waits for the store
(:func:`~evq.domain.message.waits_for_store` of any of its messages as sent)."""


def plain_records(entries: Sequence[SentEntry] | KeyedSend, topic: str, queue_id: int,
                  born_timestamp: int, born_host: bytes, store_host: bytes,
                  reconsume_times: int, cluster_entry: str, max_body: int
                  ) -> PlainRecords | None:
    """A send's records for the log when every message needs no routing (see
    :func:`plain_message`), else None; the caller has resolved the queue and checked the
    topic, and hands the IPv4 hosts as stored.  Bodies over ``max_body`` are refused, then
    properties too long as stored, as :meth:`~evq.domain.broker.Broker.put` refuses them.
    The tags code is the tag hash: a topic whose code is a due time takes no sends."""
    plain = []
    for entry in entries:
        m = plain_message(entry, cluster_entry)
        if m is None:
            return None
        plain.append(m)
    for m in plain:
        if len(m.body) > max_body:
            raise body_too_large(len(m.body), max_body)
    topic_raw = topic.encode()
    records = []
    for m in plain:
        props = m.properties
        if len(props) > MAX_PROPERTIES_BYTES:
            raise properties_too_long()
        sysflag, names = m.sysflag, m.names
        data = PURE.pack_v4(topic_raw, props, m.body, queue_id, m.flag, 0, 0,
                            sysflag & _NOT_HOST_BITS, born_timestamp, born_host, 0, store_host,
                            reconsume_times, 0)
        records.append(put_record_of(data, topic, queue_id, sysflag,
                                     tags_code(names.get(Prop.TAGS)),
                                     index_keys_of(names, sysflag)))
    return records, any([m.wait for m in plain])


@attrs.frozen(slots=True)
class SentPath:
    """One implementation of the send path's kernels: the pure functions above (the
    reference) or their compiled twins."""

    sent_batch: Callable[[bytes | memoryview, int], list[SentEntry]]
    plain_records: Callable[..., PlainRecords | None]


PURE_SENT = SentPath(sent_batch, plain_records)
if KERNELS is not None:
    KERNELS.bind_sent(routed=ROUTED, wait=Prop.WAIT, tags=Prop.TAGS, keys=Prop.KEYS,
                      uniq_key=Prop.UNIQ_KEY, body_error=body_too_large,
                      properties_error=properties_too_long, keyed_send=KeyedSend)
COMPILED_SENT = None if KERNELS is None else SentPath(KERNELS.sent_batch, KERNELS.plain_records)
"""The compiled send path, or None where the kernels are not built or not wanted."""
SENT = COMPILED_SENT or PURE_SENT
"""The send path this process runs; the module's names above are its functions."""
sent_batch, plain_records = SENT.sent_batch, SENT.plain_records
