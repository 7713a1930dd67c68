"""How a master and a slave agree on where streaming starts: pure decisions, no I/O.

The slave sends a :class:`~evq.ha.frames.Hello`: its log end and a CRC of a window of its log
ending at ``probe_end``.  The master answers from its own log, by this table (``start`` is
``probe_end - probe_len``, the window's first byte)::

    situation (checked in order)                 answer
    -------------------------------------------  --------------------------------------------
    probe_end > master end                       PROBE at master end (slave holds lost bytes)
    start < master min, the slave's log empty    BEGIN at master min (its first bytes expired)
    start < master min                           REFUSED (the bytes to compare are gone)
    window CRCs equal, probe_end == slave end    STREAM from slave end
    window CRCs equal, probe_end <  slave end    TRUNCATE to probe_end (a proven common point)
    differ, start == master min == 0             TRUNCATE to 0 (nothing in common)
    differ, otherwise                            PROBE at the master's last record start
                                                 at or before start (or REFUSED if none)

A PROBE offset is always a record start in the master's log (its end is one too), so when the
slave's window before it matches, the offset is a record boundary of the common prefix and
safe to truncate to.  Every PROBE moves strictly back, so the exchange ends.
An empty slave (a window of length 0 ending at its end) that the master's expiry left behind
starts its log at the master's min offset, as RocketMQ starts a new slave at the master's
current log, and says hello again from there; a slave holding bytes below the master's min is
refused for good (nothing proves its log agrees with the master's, so it is an operator's
call: empty its store).  Windows are
compared, not whole logs: a divergence is taken to show in the last :data:`WINDOW` bytes before
a probe (forked records differ in store time, offsets or body), which is what a master that
lost or rewrote its tail produces.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from evq.ha.frames import Answer, AnswerKind, Hello

WINDOW = 1024 * 1024


class LogSide(Protocol):
    """What the handshake needs to know about one side's log."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def crc(self, start: int, end: int) -> int:
        """The CRC-32 (zlib's) of the log bytes in ``[start, end)``."""
        ...

    def record_start_at_or_before(self, position: int) -> int:
        """The greatest record start <= ``position`` (at least the log's min offset)."""
        ...


class HandshakeError(Exception):
    """A peer's handshake message that cannot be acted on."""


class AdmissionDenied(HandshakeError):
    """The master did not admit this slave: no admin account, or the wrong secret."""


def hello(slave: LogSide, probe_end: int | None = None, window: int = WINDOW) -> Hello:
    """The slave's claim about its log, probing the ``window`` bytes that end at
    ``probe_end`` (by default its end)."""
    end = slave.max_offset if probe_end is None else probe_end
    if not slave.min_offset <= end <= slave.max_offset:
        raise HandshakeError(f"probe at {end} outside the slave's log "
                             f"[{slave.min_offset}, {slave.max_offset}]")
    length = min(window, end - slave.min_offset)
    return Hello(slave.max_offset, end, length, slave.crc(end - length, end))


def decide(claim: Hello, master: LogSide) -> Answer:
    """The master's answer to a slave's :class:`Hello` (the table above)."""
    if claim.probe_end > master.max_offset:
        return Answer(AnswerKind.PROBE, master.max_offset)
    start = claim.probe_end - claim.probe_len
    if start < master.min_offset:
        empty = claim.probe_len == 0 and claim.probe_end == claim.slave_max
        return Answer(AnswerKind.BEGIN if empty else AnswerKind.REFUSED, master.min_offset)
    if master.crc(start, claim.probe_end) == claim.probe_crc:
        if claim.probe_end == claim.slave_max:
            return Answer(AnswerKind.STREAM, claim.slave_max)
        return Answer(AnswerKind.TRUNCATE, claim.probe_end)
    if start == master.min_offset:
        return (Answer(AnswerKind.TRUNCATE, 0) if start == 0
                else Answer(AnswerKind.REFUSED, master.min_offset))
    at = master.record_start_at_or_before(start)
    if at >= claim.probe_end:  # only a window of length 0 with a wrong CRC gets here
        return Answer(AnswerKind.REFUSED, at)
    return Answer(AnswerKind.PROBE, at)


@attrs.frozen(slots=True)
class SlaveStep:
    """What the slave does with an answer: send ``hello_at`` as the next probe, or cut its log
    to ``truncate_to`` (or begin its empty log at ``begin_at``) and say hello again, or stream
    from ``stream_from``."""

    probe_at: int | None = None
    truncate_to: int | None = None
    begin_at: int | None = None
    stream_from: int | None = None


def follow(answer: Answer, slave_max: int) -> SlaveStep:
    """The slave's reading of an answer, checked against its own log end."""
    if answer.kind is AnswerKind.DENIED:
        raise AdmissionDenied("the master did not admit this slave (it needs an admin "
                              "account's accessKey and secretKey)")
    if answer.kind is AnswerKind.REFUSED:
        raise HandshakeError(f"the master refused replication from {slave_max} "
                             f"(it holds the log from {answer.offset}); a slave whose "
                             f"log starts below that must be emptied to follow it")
    if answer.kind is AnswerKind.BEGIN:
        if answer.offset < slave_max:
            raise HandshakeError(f"begin at {answer.offset}, before this log's end {slave_max}")
        return SlaveStep(begin_at=answer.offset)
    if not 0 <= answer.offset <= slave_max:
        raise HandshakeError(f"{answer.kind.name} at {answer.offset}, past this log's end "
                             f"{slave_max}")
    if answer.kind is AnswerKind.PROBE:
        return SlaveStep(probe_at=answer.offset)
    if answer.kind is AnswerKind.TRUNCATE:
        return SlaveStep(truncate_to=answer.offset)
    if answer.offset != slave_max:
        raise HandshakeError(f"stream from {answer.offset}, but this log ends at {slave_max}")
    return SlaveStep(stream_from=answer.offset)
