"""The HA wire codec: every frame round-trips, decoders cope with any split of the stream."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.ha.frames import (
    MAX_TRANSFER,
    Answer,
    AnswerKind,
    FrameError,
    Hello,
    ReportDecoder,
    TransferDecoder,
    encode_report,
    transfer_head,
)
from tests.strategies import non_negative_int64s


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@st.composite
def hellos(draw: st.DrawFn) -> Hello:
    slave_max = draw(non_negative_int64s)
    probe_end = draw(st.integers(0, slave_max))
    probe_len = draw(st.integers(0, min(probe_end, 2**31 - 1)))
    return Hello(slave_max, probe_end, probe_len, draw(st.integers(0, 2**32 - 1)))


@given(hellos())
def test_hello_round_trips(h: Hello) -> None:
    assert len(h.encode()) == 28
    assert Hello.decode(h.encode()) == h


def test_hello_with_another_magic_is_refused() -> None:
    raw = bytearray(Hello(10, 10, 4, 7).encode())
    raw[0:4] = b"HTTP"
    with pytest.raises(FrameError, match="magic"):
        Hello.decode(bytes(raw))


@pytest.mark.parametrize(("slave_max", "probe_end", "probe_len"),
                         [(10, 11, 0), (10, 5, 6), (10, 5, -1)])
def test_inconsistent_hello_is_refused(slave_max: int, probe_end: int, probe_len: int) -> None:
    with pytest.raises(FrameError, match="inconsistent"):
        Hello(slave_max, probe_end, probe_len, 0)


@given(st.sampled_from(AnswerKind), non_negative_int64s)
def test_answer_round_trips(kind: AnswerKind, offset: int) -> None:
    a = Answer(kind, offset)
    assert len(a.encode()) == 9
    assert Answer.decode(a.encode()) == a


def test_unknown_answer_kind_is_refused() -> None:
    with pytest.raises(FrameError, match="kind"):
        Answer.decode(b"X" + bytes(8))


@given(st.lists(non_negative_int64s, min_size=1, max_size=20),
       st.lists(st.integers(0, 200), max_size=10))
def test_report_decoder_yields_the_newest_complete_report(
    offsets: list[int], cuts: list[int]
) -> None:
    stream = b"".join(encode_report(o) for o in offsets)
    decoder = ReportDecoder()
    seen = [o for part in split(stream, cuts) if (o := decoder.feed(part)) is not None]
    assert seen[-1] == offsets[-1]
    assert set(seen) <= set(offsets)


def test_negative_report_is_refused() -> None:
    with pytest.raises(FrameError, match="negative"):
        ReportDecoder().feed(b"\xff" * 8)


@given(st.lists(st.tuples(non_negative_int64s, st.binary(max_size=300)), max_size=12),
       st.lists(st.integers(0, 4000), max_size=12))
def test_transfer_decoder_reassembles_frames_from_any_split(
    frames: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(transfer_head(o, len(d)) + d for o, d in frames)
    decoder = TransferDecoder()
    out = [t for part in split(stream, cuts) for t in decoder.feed(part)]
    assert [(t.offset, t.data) for t in out] == frames
    assert [t.is_heartbeat for t in out] == [not d for _o, d in frames]


def test_transfer_bigger_than_the_limit_is_refused() -> None:
    with pytest.raises(FrameError, match="size"):
        TransferDecoder().feed(transfer_head(0, MAX_TRANSFER + 1))
