"""RocketMQ's stored-message record: the one binary form a message has in evq.

The producer side encodes a message once into this layout; the log patches the fields the broker
owns (queue offset, physical offset, store time, store host) in place and serves pulls with the
same bytes.  All integers are big-endian.  IPv4 hosts (the v1 layout every client reads)::

    offset  size  field
    ------  ----  ---------------------------------------------------------------
         0     4  TOTALSIZE            whole record, this field included
         4     4  MAGICCODE            0xDAA320A7 (v1); 0xCBD43194 marks BLANK padding
         8     4  BODYCRC              crc32(stored body) & 0x7FFFFFFF
        12     4  QUEUEID
        16     4  FLAG                 the producer's user flag
        20     8  QUEUEOFFSET          dense offset in the (topic, queue)   <- patched
        28     8  PHYSICALOFFSET       byte position in the log             <- patched
        36     4  SYSFLAG              see evq.domain.sysflag
        40     8  BORNTIMESTAMP        producer ms
        48     8  BORNHOST             4 address bytes + 4-byte port (20 with BORNHOST_V6)
        56     8  STORETIMESTAMP       broker ms                             <- patched
        64     8  STOREHOSTADDRESS     4 + 4 (20 with STOREHOST_V6)          <- patched
        72     4  RECONSUMETIMES
        76     8  PREPARED TRANSACTION OFFSET
        84   4+B  BODY                 int32 length, then the (maybe zlib) body
    88+B   1+T  TOPIC                signed-byte length (max 127), UTF-8
  89+B+T   2+P  PROPERTIES           signed int16 length (max 32767), UTF-8 (see message.py)

A BLANK record is only its first 8 bytes: TOTALSIZE = the rest of the segment, BLANK magic.

Batch bodies sent by producers (``batch=true``) use a shorter inner form, one per message::

    0  4  TOTALSIZE = 20 + B + 2 + P
    4  4  MAGICCODE (0 from clients)
    8  4  BODYCRC (0; the broker computes it)
   12  4  FLAG
   16 4+B BODY length + body
   .. 2+P PROPERTIES length (int16) + properties
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from types import ModuleType

import attrs

from evq.domain import sysflag as sf
from evq.domain.checksum import crc32
from evq.domain.hashing import index_key_hash, tags_code
from evq.domain.message import (
    NO_HOST,
    PURE_PYTHON_VARIABLE,
    Host,
    Message,
    Prop,
    PropertyError,
    decode_properties,
    encode_properties,
    host_bytes,
    is_ipv6,
    split_keys,
)

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB (5.x, two-byte topic length); decoded, never written
BLANK_MAGIC = -875286124  # 0xCBD43194

MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767
BLANK_SIZE = 8
MIN_RECORD_SIZE = 91

QUEUE_OFFSET_AT = 20
PHYSICAL_OFFSET_AT = 28
SYSFLAG_AT = 36
BORN_HOST_AT = 48

# Whole fixed part up to and including the body length, IPv4 born and store hosts.
HEADER_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
HEADER_V4_SIZE = HEADER_V4.size  # 88
PREFIX = struct.Struct(">iiiiiqqiq")  # up to BORNHOST, any host width
SIZE_MAGIC = struct.Struct(">ii")
OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET
STORE_V4 = struct.Struct(">q8s")  # STORETIMESTAMP, STOREHOSTADDRESS (IPv4)
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
INT16 = struct.Struct(">h")
BLANK = struct.Struct(">ii")
BATCH_HEAD = struct.Struct(">iiiii")
_TOPIC_LEN = [bytes((n,)) for n in range(MAX_TOPIC_BYTES + 1)]  # the TOPIC length byte


class RecordError(ValueError):
    """Bytes that are not a well-formed record (bad length, magic, CRC or field)."""


def body_crc(body: bytes | memoryview) -> int:
    return crc32(body) & 0x7FFFFFFF


def store_timestamp_at(sysflag: int) -> int:
    """Where STORETIMESTAMP sits: after an 8- or 20-byte born host."""
    return 68 if sysflag & sf.BORNHOST_V6 else 56


def _host_len(sysflag: int, bit: int) -> int:
    return 20 if sysflag & bit else 8


@lru_cache(maxsize=4096)
def _ip_text(packed: bytes) -> str:
    # Cached: every record carries two hosts, and a log holds few distinct ones (its brokers
    # and producers); the ipaddress round trip was a third of decoding a pulled record.
    return str(ipaddress.ip_address(packed))


def _host_from(raw: bytes | memoryview) -> Host:
    """The host in ``raw``: its 4 or 16 address bytes, then a 4-byte port."""
    return _host_at(raw, 0, len(raw) > 8)


def _host_at(buf: bytes | bytearray | memoryview, at: int, v6: int) -> Host:
    """The host stored at ``at``: 4 (``v6`` false) or 16 address bytes, then a 4-byte port."""
    ip_end = at + (16 if v6 else 4)
    return (_ip_text(bytes(buf[at:ip_end])), int.from_bytes(buf[ip_end : ip_end + 4], "big"))


@lru_cache(maxsize=1024)
def _host_field(host: Host) -> tuple[bytes, bool]:
    """A host's stored bytes, and whether they are the 20-byte IPv6 form."""
    return host_bytes(host), is_ipv6(host)


def encode(m: Message, properties: str | None = None) -> bytes:
    """The full stored record of ``m`` (BODYCRC computed here, once); ``properties`` is
    ``encode_properties(m.properties)`` when the caller has it already.

    Any field that does not fit the layout raises :class:`RecordError`.
    """
    try:
        return _encode(m, encode_properties(m.properties) if properties is None else properties)
    except (struct.error, OverflowError, UnicodeEncodeError, ValueError) as exc:
        if isinstance(exc, RecordError | PropertyError):
            raise
        raise RecordError(f"message cannot be encoded: {exc}") from None


def _encode(m: Message, properties: str) -> bytes:
    topic = m.topic.encode()
    props = properties.encode()
    if not 0 < len(topic) <= MAX_TOPIC_BYTES:
        raise RecordError(f"topic must be 1..{MAX_TOPIC_BYTES} bytes, got {len(topic)}")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise RecordError(f"properties are {len(props)} bytes, limit {MAX_PROPERTIES_BYTES}")
    born, born_v6 = _host_field(m.born_host)
    store, store_v6 = _host_field(m.store_host)
    flags = m.sysflag & ~(sf.BORNHOST_V6 | sf.STOREHOST_V6)
    body = m.body
    if not (born_v6 or store_v6):
        return pack_v4(topic, props, body, m.queue_id, m.flag, m.queue_offset,
                       m.commit_log_offset, flags, m.born_timestamp, born, m.store_timestamp,
                       store, m.reconsume_times, m.prepared_transaction_offset)
    crc = body_crc(body)
    if born_v6:
        flags |= sf.BORNHOST_V6
    if store_v6:
        flags |= sf.STOREHOST_V6
    size = 84 + len(born) + len(store) - 16 + 4 + len(body) + 1 + len(topic) + 2 + len(props)
    out = bytearray(size)
    PREFIX.pack_into(
        out, 0, size, MAGIC_V1, crc, m.queue_id, m.flag, m.queue_offset,
        m.commit_log_offset, flags, m.born_timestamp,
    )
    pos = BORN_HOST_AT
    out[pos : pos + len(born)] = born
    pos += len(born)
    INT64.pack_into(out, pos, m.store_timestamp)
    pos += 8
    out[pos : pos + len(store)] = store
    pos += len(store)
    struct.pack_into(">iqi", out, pos, m.reconsume_times, m.prepared_transaction_offset, len(body))
    pos += 16
    out[pos : pos + len(body)] = body
    out[pos + len(body) :] = _TOPIC_LEN[len(topic)] + topic + INT16.pack(len(props)) + props
    return bytes(out)


def pack_v4(topic: bytes, props: bytes, body: bytes, queue_id: int, flag: int,
            queue_offset: int, physical_offset: int, sysflag: int, born_timestamp: int,
            born_host: bytes, store_timestamp: int, store_host: bytes, reconsume_times: int,
            prepared_offset: int) -> bytes:
    """The record of IPv4 hosts (8-byte host fields), BODYCRC computed here: the common case,
    and the whole of the send path's encoding.  Lengths are the caller's to check (topic
    1..127 bytes, properties at most 32767); ``sysflag`` carries no host-width bits."""
    # One pack and one join: the whole fixed part is a single struct (see above), and the
    # join allocates the record once.
    return b"".join((
        HEADER_V4.pack(
            HEADER_V4_SIZE + len(body) + 1 + len(topic) + 2 + len(props), MAGIC_V1,
            body_crc(body), queue_id, flag, queue_offset, physical_offset, sysflag,
            born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
            prepared_offset, len(body)),
        body, _TOPIC_LEN[len(topic)], topic, INT16.pack(len(props)), props))


@attrs.frozen(slots=True)
class Fields:
    """What the log needs to know about a record without decoding its body."""

    size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    store_timestamp: int
    topic: str
    properties: str
    crc_ok: bool


def read_fields(buf: bytes | bytearray | memoryview, pos: int, *, check_crc: bool) -> Fields:
    """Parse the header, topic and properties of the record at ``pos``; bodies are skipped.

    Raises :class:`RecordError` for anything that is not a complete, valid record.  A BLANK
    record is the caller's business (see :func:`peek`).
    """
    (size, _magic, crc, qid, _flag, qoff, phys, flags, _born_ts, _born_at, store_ts, _store_at,
     _reconsume, _prepared, body_at, blen, topic, props) = _scan(buf, pos)
    ok = not check_crc or body_crc(memoryview(buf)[body_at : body_at + blen]) == crc
    return Fields(size, qid, qoff, phys, flags, store_ts, topic, props, ok)


def valid_run(buf: bytes | bytearray | memoryview, pos: int, end: int, phys: int, stop: int, *,
              check_crc: bool, ceiling: int) -> tuple[int, int]:
    """How far whole, valid records run in ``buf[pos:end]``, the first at log offset ``phys``:
    the log offset of the first one that is not (or of the first at or past ``stop``), and the
    latest store time among them not after ``ceiling`` (-1 if none).

    Valid is what recovery calls valid: :func:`read_fields` parses it (a BLANK record ends the
    run), its body CRC matches (``check_crc``) and its PHYSICALOFFSET is its place in the log
    (a torn write never got its offsets patched).  Recovery skims a log's tail with this and
    looks at the record it stops on itself."""
    latest = -1
    view = memoryview(buf)[:end]
    while phys < stop:
        try:
            f = PURE.read_fields(view, pos, check_crc=check_crc)
        except RecordError:
            break
        if not f.crc_ok or f.physical_offset != phys:
            break
        if latest < f.store_timestamp <= ceiling:
            latest = f.store_timestamp
        pos += f.size
        phys += f.size
    return phys, latest


_AFTER_HOSTS = struct.Struct(">iqi")  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH


def _scan(buf: bytes | bytearray | memoryview, pos: int) -> tuple[
        int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, str, str]:
    """Every field of the record at ``pos``, its layout checked, in one pass: (size, magic,
    crc, queue id, flag, queue offset, physical offset, sysflag, born timestamp, born host's
    position, store timestamp, store host's position, reconsume times, prepared offset, body
    position, body length, topic, properties).  Hosts and body stay in ``buf``."""
    end = len(buf)
    if pos < 0 or pos + MIN_RECORD_SIZE > end:
        raise RecordError("truncated record header")
    size, magic, crc, qid, flag, qoff, phys, flags, born_ts = PREFIX.unpack_from(buf, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError(f"bad magic {magic & 0xFFFFFFFF:#x}")
    if size < MIN_RECORD_SIZE or pos + size > end:
        raise RecordError(f"bad total size {size}")
    rec_end = pos + size
    tlen_len = 1 if magic == MAGIC_V1 else 2
    born_at = pos + BORN_HOST_AT
    p = born_at + _host_len(flags, sf.BORNHOST_V6)
    store_at = p + 8
    after_hosts = store_at + _host_len(flags, sf.STOREHOST_V6)
    if after_hosts + 16 + tlen_len + 2 > rec_end:
        raise RecordError(f"total size {size} too small for the record header")
    (store_ts,) = INT64.unpack_from(buf, p)
    reconsume, prepared, blen = _AFTER_HOSTS.unpack_from(buf, after_hosts)
    body_at = p = after_hosts + 16
    if blen < 0 or p + blen + tlen_len + 2 > rec_end:
        raise RecordError(f"bad body length {blen}")
    p += blen
    if magic == MAGIC_V1:
        tlen = buf[p]
        p += 1
    else:
        (tlen,) = INT16.unpack_from(buf, p)
        p += 2
    if tlen <= 0 or p + tlen + 2 > rec_end:
        raise RecordError(f"bad topic length {tlen}")
    topic_raw = bytes(buf[p : p + tlen])
    p += tlen
    (plen,) = INT16.unpack_from(buf, p)
    p += 2
    if plen < 0 or p + plen != rec_end:
        raise RecordError("record fields do not add up to its total size")
    try:
        topic = topic_raw.decode()
        props = bytes(buf[p : p + plen]).decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"undecodable topic or properties: {exc}") from None
    return (size, magic, crc, qid, flag, qoff, phys, flags, born_ts, born_at, store_ts, store_at,
            reconsume, prepared, body_at, blen, topic, props)


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True) -> Message:
    """The full message stored at ``pos`` (the body stays as stored; see Message.payload).

    Raises :class:`RecordError` for anything that is not a complete, valid record.
    """
    (_size, _magic, crc, qid, flag, qoff, phys, flags, born_ts, born_at, store_ts, store_at,
     reconsume, prepared, body_at, blen, topic, props) = _scan(buf, pos)
    body = bytes(buf[body_at : body_at + blen])
    if check_crc and body_crc(body) != crc:
        raise RecordError(f"body CRC mismatch at {pos}")
    return Message(
        topic=topic, body=body, flag=flag, properties=decode_properties(props), queue_id=qid,
        sysflag=flags & ~(sf.BORNHOST_V6 | sf.STOREHOST_V6), born_timestamp=born_ts,
        born_host=_host_at(buf, born_at, flags & sf.BORNHOST_V6),
        store_timestamp=store_ts,
        store_host=_host_at(buf, store_at, flags & sf.STOREHOST_V6),
        reconsume_times=reconsume, prepared_transaction_offset=prepared, queue_offset=qoff,
        commit_log_offset=phys, body_crc=crc,
    )


def iter_records(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> Iterator[Message]:
    """Decode back-to-back records, as a pull response body or query answer carries them."""
    pos = 0
    while pos < len(buf):
        m = PURE.decode(buf, pos, check_crc=check_crc)
        yield m
        (size,) = INT32.unpack_from(buf, pos)
        pos += size


def decode_records(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> list[Message]:
    """``list(iter_records(buf))``: what a pull answer becomes (the compiled twin skips the
    generator)."""
    return list(PURE.iter_records(buf, check_crc=check_crc))


def encode_blank(size: int) -> bytes:
    return BLANK.pack(size, BLANK_MAGIC)


def peek(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """``(total size, magic)`` at ``pos``; ``(0, 0)`` when fewer than 8 bytes remain."""
    if pos + 8 > len(buf):
        return 0, 0
    return SIZE_MAGIC.unpack_from(buf, pos)


# --- message ids -------------------------------------------------------------------------


def offset_msg_id(store_host: Host | bytes, physical_offset: int) -> str:
    """RocketMQ's offsetMsgId: store host bytes + 8-byte physical offset, uppercase hex."""
    raw = store_host if isinstance(store_host, bytes) else host_bytes(store_host)
    return (raw + physical_offset.to_bytes(8, "big")).hex().upper()


def offset_msg_ids(store_host: bytes, offsets: Iterable[int]) -> str:
    """The offset msgIds of records at ``offsets`` on ``store_host``, comma-joined as
    RocketMQ answers a batch; a negative offset (a record the log refused) has an empty id."""
    return ",".join([offset_msg_id(store_host, o) if o >= 0 else "" for o in offsets])


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """Inverse of :func:`offset_msg_id`; 32 hex chars are IPv4, 56 IPv6."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"an offset msgId has 32 or 56 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    return _host_from(raw[:-8]), int.from_bytes(raw[-8:], "big")


# --- what the log appends ----------------------------------------------------------------


@attrs.define(slots=True)
class PutRecord:
    """One encoded record ready for :meth:`evq.domain.log.MessageLog.append`.

    The broker knows the routing facts when it encodes, so it hands them over instead of making
    the log parse its own bytes on the hot path; recovery and replication re-derive the same
    facts from the bytes with :func:`read_fields`.  Not frozen, though nothing changes it: one
    is built per message sent, and a frozen class's ``__init__`` sets each field through
    ``object.__setattr__``, which cost as much as encoding the record.
    """

    data: bytes | bytearray
    topic: str
    queue_id: int
    sysflag: int
    tags_code: int
    keys: tuple[str, ...]
    # Hashed when the record is built (see encoded_record), so the index does no hashing
    # under the put lock.
    key_hashes: tuple[int, ...]


TagsCodeFn = Callable[[str, Mapping[str, str], int], int]
"""``(topic, properties, store_timestamp) -> tags code`` for the ConsumeQueue entry."""


def default_tags_code(topic: str, properties: Mapping[str, str], store_timestamp: int) -> int:
    return tags_code(properties.get(Prop.TAGS))


def put_record(m: Message, *, tags_code_fn: TagsCodeFn = default_tags_code) -> PutRecord:
    """Encode ``m`` once, with the facts the log indexes it by."""
    return encoded_record(m, encode_properties(m.properties),
                          tags_code_fn(m.topic, m.properties, m.store_timestamp))


def encoded_record(m: Message, properties: str, tags_code: int) -> PutRecord:
    """:func:`put_record` given ``m``'s properties string and its tags code: the broker's put
    path has the one already (it checks its size) and works the other out for a batch at a
    time."""
    return put_record_of(encode(m, properties), m.topic, m.queue_id, m.sysflag, tags_code,
                         index_keys_of(m.properties, m.sysflag))


def put_record_of(data: bytes, topic: str, queue_id: int, sysflag: int, tags_code: int,
                  keys: tuple[str, ...]) -> PutRecord:
    """The :class:`PutRecord` of an encoded record, its index keys hashed here."""
    # Positional: the class's __init__ is generated, and keywords cost it more than the
    # encoding of a small record.
    return PutRecord(data, topic, queue_id, sysflag, tags_code, keys,
                     tuple([index_key_hash(topic, k) for k in keys]) if keys else ())


def index_keys_of(properties: Mapping[str, str], sysflag: int) -> tuple[str, ...]:
    """The keys the index holds for a record, derived from its properties (recovery path)."""
    if sysflag & sf.TRANSACTION_MASK == sf.TRANSACTION_ROLLBACK_TYPE:
        return ()
    uniq = properties.get(Prop.UNIQ_KEY)
    words = split_keys(properties.get(Prop.KEYS))
    return (uniq, *words) if uniq else tuple(words)


# --- batches -----------------------------------------------------------------------------


@attrs.frozen(slots=True)
class BatchEntry:
    flag: int
    body: bytes
    properties: dict[str, str]


def encode_batch(messages: Iterable[Message]) -> bytes:
    """The ``batch=true`` request body a producer sends."""
    out = bytearray()
    for m in messages:
        props = encode_properties(m.properties).encode()
        size = 20 + len(m.body) + 2 + len(props)
        out += BATCH_HEAD.pack(size, 0, 0, m.flag, len(m.body))
        out += m.body
        out += INT16.pack(len(props))
        out += props
    return bytes(out)


def split_batch(body: bytes | memoryview) -> list[tuple[int, bytes, str]]:
    """A batch body's entries as ``(flag, body, properties string)``, the string as sent
    (the broker's put path reads it without decoding it); malformed input raises
    :class:`RecordError`."""
    entries: list[tuple[int, bytes, str]] = []
    pos, end = 0, len(body)
    while pos < end:
        if pos + 22 > end:
            raise RecordError(f"truncated batch entry at {pos}")
        size, _magic, _crc, flag, blen = BATCH_HEAD.unpack_from(body, pos)
        if blen < 0 or size < 22 + blen or pos + size > end:
            raise RecordError(f"bad batch entry sizes at {pos}")
        b = bytes(body[pos + 20 : pos + 20 + blen])
        (plen,) = INT16.unpack_from(body, pos + 20 + blen)
        if plen < 0 or 22 + blen + plen != size:
            raise RecordError(f"bad batch properties length at {pos}")
        p = pos + 22 + blen
        try:
            props = bytes(body[p : p + plen]).decode()
        except UnicodeDecodeError as exc:
            raise RecordError(f"undecodable batch properties at {pos}: {exc}") from None
        entries.append((flag, b, props))
        pos += size
    return entries


# --- compiled kernels ----------------------------------------------------------------------


@attrs.frozen(slots=True)
class Codec:
    """One implementation of the codec's hot functions: the pure-Python ones above (the
    reference) or their compiled twins in evq/domain/record_kernels.pyx."""

    decode: Callable[..., Message]
    iter_records: Callable[..., Iterator[Message]]
    decode_records: Callable[..., list[Message]]
    split_batch: Callable[[bytes | memoryview], list[tuple[int, bytes, str]]]
    pack_v4: Callable[..., bytes]
    read_fields: Callable[..., Fields]
    encode_batch: Callable[[Iterable[Message]], bytes]
    offset_msg_ids: Callable[[bytes, Iterable[int]], str]
    valid_run: Callable[..., tuple[int, int]]


PURE = Codec(decode, iter_records, decode_records, split_batch, pack_v4, read_fields,
             encode_batch, offset_msg_ids, valid_run)


def _compiled_kernels() -> ModuleType | None:
    """The compiled kernels, bound to this module's classes; None where they were not built
    (no C compiler at install time) or :data:`PURE_PYTHON_VARIABLE` asks for pure Python."""
    if os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0"):
        return None
    try:
        from evq.domain import record_kernels
    except ImportError:
        return None
    record_kernels.bind(record_error=RecordError, message=Message, fields=Fields,
                        put_record=PutRecord, host_text=_ip_text,
                        properties_text=encode_properties, struct_error_type=struct.error)
    return record_kernels


KERNELS = _compiled_kernels()
"""The compiled kernels' module, or None: :mod:`evq.domain.sent` takes its plain put path
from there."""
COMPILED = None if KERNELS is None else Codec(
    KERNELS.decode, KERNELS.iter_records, KERNELS.decode_records, KERNELS.split_batch,
    KERNELS.pack_v4, KERNELS.read_fields, KERNELS.encode_batch, KERNELS.offset_msg_ids,
    KERNELS.valid_run)
"""The compiled codec, or None where it is not built or not wanted."""
CODEC = COMPILED or PURE
"""The codec this process runs; the module's names below are its functions."""
(decode, iter_records, decode_records, split_batch, pack_v4, read_fields, encode_batch,
 offset_msg_ids, valid_run) = (
    CODEC.decode, CODEC.iter_records, CODEC.decode_records, CODEC.split_batch, CODEC.pack_v4,
    CODEC.read_fields, CODEC.encode_batch, CODEC.offset_msg_ids, CODEC.valid_run)


def decode_batch(body: bytes | memoryview) -> list[BatchEntry]:
    """Split a batch body, properties decoded; malformed input raises :class:`RecordError`."""
    return [BatchEntry(flag, b, decode_properties(props)) for flag, b, props in split_batch(body)]


__all__ = [
    "BLANK_MAGIC",
    "MAGIC_V1",
    "NO_HOST",
    "BatchEntry",
    "Fields",
    "PutRecord",
    "RecordError",
    "body_crc",
    "decode",
    "decode_batch",
    "decode_records",
    "encode",
    "encode_batch",
    "encoded_record",
    "iter_records",
    "offset_msg_id",
    "offset_msg_ids",
    "parse_offset_msg_id",
    "put_record",
    "put_record_of",
    "read_fields",
    "split_batch",
    "valid_run",
]
