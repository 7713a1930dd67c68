"""The HA wire: what a slave and its master say on the replication connection.

Plain TCP, no remoting framing, big-endian throughout.  A session has three phases.

**Admission** (evq's): the master speaks first.  A master with an ACL asks the slave to prove an
admin account (:mod:`evq.ha.auth`) before it answers anything about its log::

    master -> slave  GREETING (21 bytes), the first bytes of every session
     0      4  MAGIC        b"EVQG"
     4      1  AUTH         0: go on with HELLO; 1: send PROOF first
     5     16  NONCE        fresh random bytes of this connection (zeros when AUTH is 0)

    slave -> master  PROOF (6 + N + 20 bytes), only when AUTH is 1, followed by its HELLO
     0      4  MAGIC        b"EVQP"
     4      2  KEY_LEN      N, 1 .. MAX_ACCESS_KEY
     6      N  ACCESS_KEY   UTF-8
     6+N   20  MAC          HMAC-SHA1(secretKey, PROOF_LABEL + NONCE + ACCESS_KEY)

    A master that does not admit the slave (a wrong PROOF, or a HELLO where the PROOF should
    be) answers with ANSWER kind b"D" (denied) and closes the connection.

**Handshake** (evq's addition to RocketMQ's protocol): the slave proves its log agrees with
the master's before any byte is streamed, so a slave that kept bytes the master lost, or a
forked tail, is cut back instead of serving a log no master ever had::

    slave -> master  HELLO (28 bytes)
     0      4  MAGIC        b"EVQH"
     4      8  SLAVE_MAX    the slave's log end
    12      8  PROBE_END    end of the window the CRC covers (<= SLAVE_MAX)
    20      4  PROBE_LEN    window length: the CRC covers [PROBE_END - PROBE_LEN, PROBE_END)
    24      4  PROBE_CRC    zlib.crc32 of the slave's bytes in that window

    master -> slave  ANSWER (9 bytes)
     0      1  KIND         b"S" stream from OFFSET, b"T" truncate to OFFSET,
                            b"P" probe at OFFSET (send another HELLO), b"R" refused,
                            b"B" begin the (empty) log at OFFSET (send another HELLO),
                            b"D" denied: the slave's PROOF was missing or wrong
     1      8  OFFSET

**Streaming** (RocketMQ's HA protocol as it is)::

    slave -> master  REPORT (8 bytes)
     0      8  MAX_OFFSET   the slave's log end: on connect, after each write, every 5 s

    master -> slave  TRANSFER (12 + N bytes)
     0      8  OFFSET       log position of DATA
     8      4  SIZE         N; 0 is a heartbeat
    12      N  DATA         raw log bytes (BLANK padding included)

The decoders below are sans-IO: feed bytes in, take whole frames out.
"""

from __future__ import annotations

import enum
import struct

import attrs

GREETING_MAGIC = b"EVQG"
PROOF_MAGIC = b"EVQP"
HELLO_MAGIC = b"EVQH"
GREETING = struct.Struct(">4s?16s")
PROOF_HEAD = struct.Struct(">4sH")
MAC_SIZE = 20
NONCE_SIZE = 16
MAX_ACCESS_KEY = 255
HELLO = struct.Struct(">4sqqiI")
ANSWER = struct.Struct(">cq")
REPORT = struct.Struct(">q")
TRANSFER_HEAD = struct.Struct(">qi")

MAX_TRANSFER = 1024 * 1024
"""Largest DATA a master sends in one TRANSFER (RocketMQ sends 32 KiB; bigger blocks cost
fewer thread hops per byte here)."""


class FrameError(ValueError):
    """Bytes on the HA connection that are not a frame of this protocol."""


class AnswerKind(enum.Enum):
    STREAM = b"S"
    TRUNCATE = b"T"
    PROBE = b"P"
    REFUSED = b"R"
    BEGIN = b"B"
    DENIED = b"D"


@attrs.frozen(slots=True)
class Greeting:
    """The master's first words: whether it wants a :class:`Proof`, and the nonce to sign."""

    auth: bool
    nonce: bytes = bytes(NONCE_SIZE)

    def encode(self) -> bytes:
        return GREETING.pack(GREETING_MAGIC, self.auth, self.nonce)

    @classmethod
    def decode(cls, data: bytes) -> Greeting:
        magic, auth, nonce = GREETING.unpack(data)
        if magic != GREETING_MAGIC:
            raise FrameError(f"not an evq HA master greeting: magic {magic!r}")
        return cls(auth, nonce)


@attrs.frozen(slots=True)
class Proof:
    """A slave's answer to a greeting that asks for an account: its key and the MAC."""

    access_key: str
    mac: bytes

    def encode(self) -> bytes:
        key = self.access_key.encode("utf-8")
        if not 0 < len(key) <= MAX_ACCESS_KEY or len(self.mac) != MAC_SIZE:
            raise FrameError(f"unsendable proof for access key {self.access_key!r}")
        return PROOF_HEAD.pack(PROOF_MAGIC, len(key)) + key + self.mac


def proof_rest_size(head: bytes) -> int:
    """From a PROOF's first :data:`PROOF_HEAD` bytes, how many bytes follow."""
    magic, key_len = PROOF_HEAD.unpack(head)
    if magic != PROOF_MAGIC:
        raise FrameError(f"not an evq HA proof: magic {magic!r}")
    if not 0 < key_len <= MAX_ACCESS_KEY:
        raise FrameError(f"access key of {key_len} bytes in an HA proof")
    return key_len + MAC_SIZE


def decode_proof(rest: bytes) -> Proof:
    """The proof from the bytes after its head (``proof_rest_size`` of them)."""
    try:
        key = rest[:-MAC_SIZE].decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError("an HA proof's access key is not UTF-8") from None
    return Proof(key, rest[-MAC_SIZE:])


@attrs.frozen(slots=True)
class Hello:
    """The slave's claim about its log: its end, and a CRC of a window ending at probe_end."""

    slave_max: int
    probe_end: int
    probe_len: int
    probe_crc: int

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.probe_len <= self.probe_end <= self.slave_max:
            raise FrameError(f"inconsistent hello: {self}")

    def encode(self) -> bytes:
        return HELLO.pack(HELLO_MAGIC, self.slave_max, self.probe_end, self.probe_len,
                          self.probe_crc)

    @classmethod
    def decode(cls, data: bytes) -> Hello:
        magic, slave_max, probe_end, probe_len, crc = HELLO.unpack(data)
        if magic != HELLO_MAGIC:
            raise FrameError(f"not an evq HA hello: magic {magic!r}")
        return cls(slave_max, probe_end, probe_len, crc)


@attrs.frozen(slots=True)
class Answer:
    kind: AnswerKind
    offset: int

    def encode(self) -> bytes:
        return ANSWER.pack(self.kind.value, self.offset)

    @classmethod
    def decode(cls, data: bytes) -> Answer:
        kind, offset = ANSWER.unpack(data)
        try:
            return cls(AnswerKind(kind), offset)
        except ValueError:
            raise FrameError(f"unknown HA answer kind {kind!r}") from None


@attrs.frozen(slots=True)
class Transfer:
    offset: int
    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        return not self.data

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


def transfer_head(offset: int, size: int) -> bytes:
    """The 12 bytes before a TRANSFER's data (the data is written as it is, not copied)."""
    return TRANSFER_HEAD.pack(offset, size)


def encode_report(max_offset: int) -> bytes:
    return REPORT.pack(max_offset)


class ReportDecoder:
    """The master's side of streaming: only the newest complete report matters (RocketMQ
    reads the last whole 8-byte value in its buffer), so older ones are skipped."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> int | None:
        """The latest offset completed by ``data``, or None if none was."""
        self._buffer += data
        whole = len(self._buffer) - len(self._buffer) % REPORT.size
        if whole == 0:
            return None
        (offset,) = REPORT.unpack_from(self._buffer, whole - REPORT.size)
        del self._buffer[:whole]
        if offset < 0:
            raise FrameError(f"negative slave offset {offset}")
        return offset


class TransferDecoder:
    """The slave's side of streaming: whole TRANSFER frames out of arbitrary reads."""

    def __init__(self, max_size: int = MAX_TRANSFER) -> None:
        self._buffer = bytearray()
        self._max_size = max_size

    def feed(self, data: bytes) -> list[Transfer]:
        self._buffer += data
        out: list[Transfer] = []
        pos = 0
        while len(self._buffer) - pos >= TRANSFER_HEAD.size:
            offset, size = TRANSFER_HEAD.unpack_from(self._buffer, pos)
            if offset < 0 or not 0 <= size <= self._max_size:
                raise FrameError(f"bad transfer header: offset {offset}, size {size}")
            end = pos + TRANSFER_HEAD.size + size
            if end > len(self._buffer):
                break
            out.append(Transfer(offset, bytes(self._buffer[pos + TRANSFER_HEAD.size:end])))
            pos = end
        del self._buffer[:pos]
        return out
