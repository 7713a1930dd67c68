"""REGISTER_BROKER and UNREGISTER_BROKER on the wire, sans-IO: both the broker's side and the
name server's side of them (§2.3.13).

The request header names the broker (:class:`BrokerIdentity` makes it:
:class:`~evq.net.headers.namesrv.RegisterBrokerRequest`); the body carries its topic
table (:class:`RegisterBrokerBody`), as JSON by default::

    {"filterServerList":[],
     "topicConfigSerializeWrapper":{"dataVersion":{"counter":3,"timestamp":1700000000000},
                                    "topicConfigTable":{"T":{"perm":6,"readQueueNums":4,...}}}}

or, when the header says ``compressed=true``, as one zlib stream (best compression) of::

    size    field
    ------  -------------------------------------------------------------------------------
         4  DV_LEN          int32, bytes of the DataVersion JSON
    DV_LEN  DATA_VERSION    {"counter":n,"timestamp":ms}
         4  TOPIC_COUNT     int32
            TOPIC_COUNT times:
         4    LEN           int32
       LEN    TOPIC         "name readQueueNums writeQueueNums perm filterType", UTF-8
         4  FS_LEN          int32
    FS_LEN  FILTER_SERVERS  JSON array of "ip:port"

all integers big-endian.  The compressed topic line has no ``order`` or ``topicSysFlag``; they
arrive as their defaults.  Brokers older than V3_0_11 send the bare ``topicConfigSerializeWrapper``
object as the body.  ``bodyCrc32`` in the header is the CRC-32 of the body as sent, masked to
31 bits; 0 means "not checked".

The answer tells a slave its master (:class:`RegisterResult`): header ``masterAddr`` and
``haServerAddr``, and as body the name server's ``ORDER_TOPIC_CONFIG`` KV table,
``{"table":{"topic":"brokerA:4;brokerB:4"}}``, when it has one.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs

from evq.domain.checksum import crc32
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.compression import InflateError, inflate
from evq.domain.config_json import from_json, to_json
from evq.domain.topics import TopicConfig, TopicFilterType
from evq.net import fastjson
from evq.net.codes import Version
from evq.net.headers.namesrv import (
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    UnRegisterBrokerRequest,
)
from evq.net.protocol import RemotingCommand

INT32 = struct.Struct(">i")
_J = TypeVar("_J", dict, list)  # type: ignore[type-arg]  # a JSON object or array

CRC32_MASK: Final = 0x7FFFFFFF
TOPIC_LINE_SEPARATOR: Final = " "
MAX_INFLATED: Final = 64 * 1024 * 1024
"""Largest compressed body accepted once inflated: a zlib bomb in a 16 MiB frame is refused
instead of filling the name server's memory (a broker with 100,000 topics needs about 5 MiB)."""
WRAPPED_BODY_SINCE: Final = Version.V3_0_11


class RegisterBodyError(BrokerError):
    """A REGISTER_BROKER body that does not decode; answered as SYSTEM_ERROR, as Java does."""

    def __init__(self, reason: str) -> None:
        super().__init__(ResponseCode.SYSTEM_ERROR,
                         f"Failed to decode RegisterBrokerBody: {reason}")


def body_digest(body: bytes, *, compressed: bool, version: int) -> bytes:
    """What tells REGISTER_BROKER bodies apart as a name server reads them: equal digests are
    the same bytes read the same way (compressed or not, wrapped or bare), so the same topic
    table.  A broker sends its table again with every 30 s heartbeat; a name server compares
    the digest with the last body's for the address, and answers an unchanged one without
    decoding it (a million topics take seconds to decode and milliseconds to hash).  BLAKE2b
    of 128 bits: a changed table never passes for the last one by chance, and one crafted to
    could only keep its own broker's stale table.  ``hashlib`` lets other threads run while
    it hashes a large body."""
    return bytes((compressed, version >= WRAPPED_BODY_SINCE)) + hashlib.blake2b(
        body, digest_size=16).digest()


def body_crc32(body: bytes) -> int:
    """``bodyCrc32`` as Java's ``UtilAll.crc32`` computes it (non-negative int)."""
    return crc32(body) & CRC32_MASK


@attrs.frozen(slots=True, kw_only=True)
class BrokerIdentity:
    """Who registers: what the headers of REGISTER_BROKER and UNREGISTER_BROKER say of the
    broker that sends them."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    """``ip:listenPort``, the address clients are given."""
    ha_server_addr: str = ""
    """``ip:haPort``, where slaves of this broker replicate from."""

    def register_fields(self, *, body_crc32: int = 0, compressed: bool = False
                        ) -> dict[str, str]:
        """The REGISTER_BROKER header of a body as :meth:`RegisterBrokerBody.encode` made it
        (``compressed``), with its :func:`body_crc32` (0: not checked)."""
        return RegisterBrokerRequest.write(
            cluster_name=self.cluster, broker_name=self.broker_name, broker_id=self.broker_id,
            broker_addr=self.broker_addr, ha_server_addr=self.ha_server_addr,
            body_crc32=body_crc32, compressed=compressed)

    def unregister_fields(self) -> dict[str, str]:
        """The UNREGISTER_BROKER header."""
        return UnRegisterBrokerRequest.write(
            cluster_name=self.cluster, broker_name=self.broker_name, broker_id=self.broker_id,
            broker_addr=self.broker_addr)


@attrs.frozen(slots=True)
class DataVersion:
    """Changes whenever the broker's topic table does.  A name server, Java's and evq's,
    compares it with the one it last applied for the broker's address and applies the table
    only when it differs (:meth:`evq.net.routes.RouteTable.refresh`): most registrations are
    heartbeats of an unchanged table.  A JSON body without one reads as None, which matches
    nothing: Java reads a new one (stamped now) and so applies every such table, where evq
    still tells the same body sent again by its digest (:func:`body_digest`)."""

    timestamp: int = 0
    counter: int = 0


@attrs.frozen(slots=True, kw_only=True)
class RegisterBrokerBody:
    topics: tuple[TopicConfig, ...] = ()
    data_version: DataVersion | None = DataVersion()
    """None: the body carried none (a JSON body may leave it out; the compressed form always
    carries one, and writes None as the default)."""
    filter_servers: tuple[str, ...] = ()

    def encode(self, compressed: bool = False) -> bytes:
        if compressed:
            return self._encode_compressed()
        wrapper: dict[str, object] = {
            "topicConfigTable": {t.topic_name: to_json(t) for t in self.topics}}
        if self.data_version is not None:
            wrapper = {"dataVersion": to_json(self.data_version), **wrapper}
        return fastjson.dumps({"filterServerList": list(self.filter_servers),
                               "topicConfigSerializeWrapper": wrapper}).encode()

    def _encode_compressed(self) -> bytes:
        version = DataVersion() if self.data_version is None else self.data_version
        parts = [_sized(fastjson.dumps(to_json(version)).encode()),
                 INT32.pack(len(self.topics))]
        for t in self.topics:
            line = TOPIC_LINE_SEPARATOR.join(
                (t.topic_name, str(t.read_queue_nums), str(t.write_queue_nums), str(t.perm),
                 t.topic_filter_type.value))
            parts.append(_sized(line.encode()))
        parts.append(_sized(fastjson.dumps(list(self.filter_servers)).encode()))
        return zlib.compress(b"".join(parts), zlib.Z_BEST_COMPRESSION)

    @classmethod
    def decode(cls, body: bytes, *, compressed: bool = False,
               version: int = WRAPPED_BODY_SINCE) -> RegisterBrokerBody:
        """The body of a REGISTER_BROKER request from a broker of ``version``; an empty body is
        a broker without topics.  Raises :class:`RegisterBodyError`."""
        if not body:
            return cls(data_version=None)
        if compressed:
            return cls._decode_compressed(body)
        doc = _json_object(body, "body")
        if version < WRAPPED_BODY_SINCE:
            topics, dv = _wrapper(doc)
            return cls(topics=topics, data_version=dv)
        servers = _member(doc, "filterServerList", list)
        if not all(isinstance(s, str) for s in servers):
            raise RegisterBodyError("filterServerList is not a list of addresses")
        topics, dv = _wrapper(_member(doc, "topicConfigSerializeWrapper", dict))
        return cls(topics=topics, data_version=dv, filter_servers=tuple(servers))

    @classmethod
    def _decode_compressed(cls, body: bytes) -> RegisterBrokerBody:
        try:
            data = inflate(body, MAX_INFLATED)
        except InflateError as exc:
            raise RegisterBodyError(str(exc)) from None
        reader = _Reader(data)
        dv = _data_version(_json_object(reader.sized("DataVersion"), "DataVersion"))
        count = reader.int32("topic count")
        if not 0 <= count <= len(data) // INT32.size:
            raise RegisterBodyError(f"topic count {count} does not fit the body")
        topics = tuple(_topic_line(reader.sized("topic config")) for _ in range(count))
        servers = _parse_json(reader.sized("filter server list"), "filter server list")
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise RegisterBodyError("filter server list is not a list of addresses")
        return cls(topics=topics, data_version=dv, filter_servers=tuple(servers))


def _sized(data: bytes) -> bytes:
    return INT32.pack(len(data)) + data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def int32(self, what: str) -> int:
        if self._pos + INT32.size > len(self._data):
            raise RegisterBodyError(f"compressed body ends before the {what}")
        (value,) = INT32.unpack_from(self._data, self._pos)
        self._pos += INT32.size
        return value

    def sized(self, what: str) -> bytes:
        length = self.int32(f"length of the {what}")
        if not 0 <= length <= len(self._data) - self._pos:
            raise RegisterBodyError(f"length {length} of the {what} runs past the body")
        chunk = self._data[self._pos:self._pos + length]
        self._pos += length
        return chunk


def _parse_json(data: bytes, what: str) -> Any:
    try:
        return fastjson.loads(data.decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RegisterBodyError(f"{what} is not JSON: {exc}") from None


def _json_object(data: bytes, what: str) -> dict[str, object]:
    doc = _parse_json(data, what)
    if not isinstance(doc, dict):
        raise RegisterBodyError(f"{what} is a JSON {type(doc).__name__}, not an object")
    return doc


def _data_version(doc: Mapping[str, object]) -> DataVersion:
    try:
        return from_json(DataVersion, doc)
    except ValueError as exc:
        raise RegisterBodyError(f"dataVersion: {exc}") from None


def _member(doc: Mapping[str, object], key: str, kind: type[_J]) -> _J:
    """``doc[key]`` as a JSON ``kind``; absent or null is an empty one, as Java reads it."""
    value = doc.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise RegisterBodyError(f"{key} is not a JSON {'object' if kind is dict else 'array'}")
    return value


def _wrapper(doc: Mapping[str, object]
             ) -> tuple[tuple[TopicConfig, ...], DataVersion | None]:
    """A ``TopicConfigSerializeWrapper``: the topic table and its version (None: none)."""
    table = _member(doc, "topicConfigTable", dict)
    dv = None if doc.get("dataVersion") is None else _data_version(
        _member(doc, "dataVersion", dict))
    return tuple(_topic_json(name, conf) for name, conf in table.items()), dv


def _topic_json(name: str, conf: object) -> TopicConfig:
    if not isinstance(conf, dict):
        raise RegisterBodyError(f"topic config of {name!r:.140} is not an object")
    try:
        # The table's key names the topic when the config itself does not.
        return from_json(TopicConfig, {"topicName": name, **conf})
    except (BrokerError, ValueError) as exc:
        raise RegisterBodyError(f"topic config of {name!r:.140}: {_reason(exc)}") from None


def _topic_line(data: bytes) -> TopicConfig:
    try:
        name, read, write, perm, filter_type = data.decode().split(TOPIC_LINE_SEPARATOR)
        return TopicConfig(topic_name=name, read_queue_nums=int(read),
                           write_queue_nums=int(write), perm=int(perm),
                           topic_filter_type=TopicFilterType(filter_type))
    except (BrokerError, ValueError) as exc:
        raise RegisterBodyError(f"topic config {data!r:.160}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    return exc.remark if isinstance(exc, BrokerError) else str(exc)


@attrs.frozen(slots=True, kw_only=True)
class RegisterResult:
    """What a name server tells a registering broker."""

    master_addr: str | None = None
    """The master's address, for a slave whose master is registered there; else None."""
    master_ha_addr: str | None = None
    """Where that master takes replication connections."""
    order_topic_config: Mapping[str, str] | None = None
    """The ``ORDER_TOPIC_CONFIG`` KV table (topic -> ``"brokerA:4;brokerB:4"``), if any."""

    def fields(self) -> dict[str, str]:
        return RegisterBrokerResponse.write(master_addr=self.master_addr,
                                            ha_server_addr=self.master_ha_addr)

    def body(self) -> bytes:
        return b"" if self.order_topic_config is None else kv_table(self.order_topic_config)

    @classmethod
    def from_response(cls, cmd: RemotingCommand) -> RegisterResult:
        h = RegisterBrokerResponse.read(cmd.ext_fields)
        return cls(master_addr=h.master_addr, master_ha_addr=h.ha_server_addr,
                   order_topic_config=_kv_table_from(cmd.body) if cmd.body else None)


def kv_table(table: Mapping[str, str]) -> bytes:
    """RocketMQ's ``KVTable`` body."""
    return fastjson.dumps({"table": dict(table)}).encode()


def _kv_table_from(body: bytes) -> dict[str, str]:
    doc = _parse_json(body, "answer body")
    table = doc.get("table") if isinstance(doc, dict) else None
    if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise RegisterBodyError(f"answer body is not a KV table: {body!r:.120}")
    return table

