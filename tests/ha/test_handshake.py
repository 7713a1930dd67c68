"""The handshake's decisions, on real logs (the in-memory reference backend and mmap).

The property: whatever a slave holds (a prefix of the master's log, extra bytes the master
lost, a forked tail), the exchange ends in STREAM after cutting the slave back at most to the
common prefix, never into it, and the slave then converges on the master's log byte for byte.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.backends.registry import open_log
from evq.domain.clock import ManualClock
from evq.domain.log import MessageLog
from evq.domain.message import new_message
from evq.domain.record import put_record
from evq.ha.frames import Answer, AnswerKind, Hello
from evq.ha.handshake import HandshakeError, decide, follow, hello
from evq.ha.log_window import LogWindow
from tests.conftest import SMALL

bodies = st.lists(st.integers(1, 3000), max_size=25)


def fill(log: MessageLog, sizes: list[int], letter: bytes) -> None:
    if sizes:
        log.append([put_record(new_message("T", letter * n, keys=f"{letter!r}{i}",
                                           compress_over=None))
                    for i, n in enumerate(sizes)])


def raw(log: MessageLog) -> bytes:
    return LogWindow(log).read(log.min_physical_offset, log.max_physical_offset)


def replicate(src: MessageLog, dst: MessageLog) -> None:
    while data := src.read_log(dst.max_physical_offset, 5000):
        dst.append_replicated(dst.max_physical_offset, data)


@attrs.define
class Outcome:
    truncated_to: list[int]
    rounds: int


def agree(master: MessageLog, slave: MessageLog, window: int) -> Outcome:
    """Run the exchange as the HA shells do, without the sockets."""
    m, s = LogWindow(master), LogWindow(slave)
    claim = hello(s, window=window)
    cuts: list[int] = []
    for rounds in range(1, 10_000):
        step = follow(decide(Hello.decode(claim.encode()), m), s.max_offset)
        if step.stream_from is not None:
            return Outcome(cuts, rounds)
        if step.begin_at is not None:
            slave.begin_at(step.begin_at)
            claim = hello(s, window=window)
        elif step.truncate_to is not None:
            cuts.append(step.truncate_to)
            slave.truncate(step.truncate_to)
            claim = hello(s, window=window)
        else:
            claim = hello(s, step.probe_at, window=window)
    raise AssertionError("the handshake did not end")


@pytest.fixture
def logs() -> Iterator[tuple[MessageLog, MessageLog]]:
    """Two mmap logs, closed before their directory goes: an open log's allocator may be
    making its next segment file there as the directory is removed."""
    with tempfile.TemporaryDirectory() as tmp:
        master, slave = pair(Path(tmp), "mmap")
        try:
            yield master, slave
        finally:
            master.close()
            slave.close()


def pair(root: Path, backend: str) -> tuple[MessageLog, MessageLog]:
    clock = ManualClock()
    return (open_log(backend, root / "m", SMALL, clock=clock, background=False),
            open_log(backend, root / "s", SMALL, clock=clock, background=False))


@given(prefix=bodies, master_tail=bodies, slave_tail=bodies,
       window=st.sampled_from([64, 700, 5000, 1 << 20]))
def test_any_slave_converges_on_the_master_without_losing_the_common_prefix(
    prefix: list[int], master_tail: list[int], slave_tail: list[int], window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        master, slave = pair(Path(tmp), "memory")
        try:
            fill(master, prefix, b"p")
            fill(slave, prefix, b"p")
            common = master.max_physical_offset
            fill(master, master_tail, b"m")
            fill(slave, slave_tail, b"s")
            outcome = agree(master, slave, window)
            assert all(cut <= common for cut in outcome.truncated_to)
            if not slave_tail:
                assert outcome.truncated_to == []
            elif not master_tail:
                assert outcome.truncated_to == [common]
            replicate(master, slave)
            assert raw(slave) == raw(master)
        finally:
            master.close()
            slave.close()


def test_slave_with_bytes_the_master_lost_is_cut_to_the_master_end(
    logs: tuple[MessageLog, MessageLog],
) -> None:
    master, slave = logs
    fill(master, [100] * 50, b"p")
    replicate(master, slave)
    end = master.max_physical_offset
    fill(slave, [100] * 5, b"x")
    outcome = agree(master, slave, 1 << 20)
    assert outcome.truncated_to == [end]
    assert raw(slave) == raw(master)


def test_forked_tail_across_segments_is_found_in_small_windows(
    logs: tuple[MessageLog, MessageLog],
) -> None:
    """A fork further back than one window takes several probes, crossing segment ends."""
    master, slave = logs
    fill(master, [900] * 100, b"p")
    replicate(master, slave)
    common = master.max_physical_offset
    fill(master, [1000] * 150, b"m")
    fill(slave, [1000] * 150, b"s")
    outcome = agree(master, slave, 4096)
    assert outcome.rounds > 10
    assert len(outcome.truncated_to) == 1
    assert common - 4096 - 2000 <= outcome.truncated_to[0] <= common
    replicate(master, slave)
    assert raw(slave) == raw(master)


def test_record_start_is_found_backwards(logs: tuple[MessageLog, MessageLog]) -> None:
    master, _ = logs
    results = master.append([put_record(new_message("T", b"z" * n, compress_over=None))
                             for n in (10, 5000, 60_000, 30_000, 3)])
    starts = [r.physical_offset for r in results]
    w = LogWindow(master)
    for start, nxt in zip(starts, [*starts[1:], master.max_physical_offset], strict=True):
        assert w.record_start_at_or_before(start) == start
        assert w.record_start_at_or_before(nxt - 1) == start
    assert w.record_start_at_or_before(0) == 0


def test_empty_slave_streams_from_zero(logs: tuple[MessageLog, MessageLog]) -> None:
    master, slave = logs
    fill(master, [10], b"p")
    assert decide(hello(LogWindow(slave)), LogWindow(master)) == Answer(AnswerKind.STREAM, 0)


@given(segments=st.integers(1, 3), tail=bodies, backend=st.sampled_from(["memory", "mmap"]),
       window=st.sampled_from([64, 1 << 20]))
def test_empty_slave_begins_at_the_min_of_a_master_whose_first_segments_expired(
    segments: int, tail: list[int], backend: str, window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        master, slave = pair(Path(tmp), backend)
        try:
            fill(master, [2000] * 40 * segments, b"p")
            fill(master, tail, b"t")
            for _ in range(segments):
                master.expire(force=True)
            assert master.min_physical_offset > 0
            outcome = agree(master, slave, window)
            assert outcome.truncated_to == [] and outcome.rounds == 2
            assert slave.min_physical_offset == master.min_physical_offset
            replicate(master, slave)
            assert raw(slave) == raw(master)
        finally:
            master.close()
            slave.close()


def test_slave_holding_bytes_below_the_master_min_is_refused(
    logs: tuple[MessageLog, MessageLog],
) -> None:
    master, slave = logs
    fill(master, [2000] * 80, b"p")
    slave.append_replicated(0, master.read_log(0, 20_000))  # the slave fell behind in there
    master.expire(force=True)
    assert 0 < slave.max_physical_offset < master.min_physical_offset
    with pytest.raises(HandshakeError, match="emptied"):
        agree(master, slave, 64)


def test_slave_refuses_answers_past_its_end() -> None:
    with pytest.raises(HandshakeError, match="past"):
        follow(Answer(AnswerKind.TRUNCATE, 11), 10)
    with pytest.raises(HandshakeError, match="stream from"):
        follow(Answer(AnswerKind.STREAM, 5), 10)
    with pytest.raises(HandshakeError, match="refused"):
        follow(Answer(AnswerKind.REFUSED, 5), 10)
    with pytest.raises(HandshakeError, match="begin at"):
        follow(Answer(AnswerKind.BEGIN, 5), 10)
