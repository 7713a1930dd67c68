"""Damage the log tail on disk, reopen: recovery must cut at the first damaged record.

This targets a backend whose log tail lives in files written in place, and damages them
through the mmap CommitLog layout, ``root/commitlog/<20-digit start offset>`` (fixed-size
segments, records back to back, zeros after the last one).  Every test takes the ``backend``
fixture and skips, with the reason, a backend that has no such tail (``TRAITS[..].file_tail``):
LMDB commits copy-on-write pages and switches a meta page last, RocksDB appends checksummed
write-ahead-log records and replays only whole ones, so neither ever shows a torn or damaged
tail to recover from (their own recovery is what the SIGKILL rounds of test_crash.py prove);
the memory backend has no files at all.  A file-tail backend without mmap's layout would fail
the layout check in :func:`_segment_file` rather than pass vacuously.

Every example writes a few segments of messages through the port, closes the store, damages the
last segment, and reopens, either normally or as after a crash (``abort`` marker left, with the
clean checkpoint or with a zeroed one, which forces a re-dispatch of the whole log).  Then:

* the reopen does not raise, logs nothing above a warning, and reports the cut: a
  ``commitlog_truncated`` event whose ``cut_bytes`` is exactly the non-zero bytes from the
  first damaged record on (no event when there was nothing to cut);
* the log ends where the first damaged record began; every record entirely before it is
  intact and readable by queue offset, by physical offset and by key (KEYS and UNIQ_KEY);
  nothing from the damaged record on is returned by any of them; queue offsets are dense;
* appending afterwards works: queue offsets continue densely, the new messages read back, and
  a second (normal) reopen keeps them with nothing cut.

What counts as damage: the stored-record format protects the body with a CRC and nothing
else (RocketMQ 4.x's format), so a change confined to the topic, the properties text or a
header field such as QUEUEID, FLAG or a timestamp cannot be detected by any recovery.  The
damage that must be cut always reaches bytes the format can check: TOTALSIZE, MAGICCODE,
BODYCRC, PHYSICALOFFSET, the body length, the body, or the properties length.  For a flip in
an unchecked header field the damaged record's fate is open, but no other record may suffer
(a re-dispatch must not take a damaged QUEUEOFFSET at face value).

A segment file whose *length* is wrong is refused with a clear error and left untouched (as
RocketMQ refuses to load it); padded back to the segment size with zeros it recovers like a
zeroed tail.  A zero-length last segment (a crash between creating and sizing the file) is
removed and the log ends where it began.  Files the allocator left half-built under their
temporary names (a crash while it built the next segment or index file) are removed, and the
log loads whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from evq.backends.mmapfile.index_file import index_file_ms, index_file_name, index_file_size
from evq.backends.mmapfile.mapped_file import BUILDING_SUFFIX, building_path, segment_name
from evq.backends.registry import TRAITS
from evq.domain import record as rec
from evq.domain.log import GetStatus, MessageLog, PutStatus
from evq.domain.message import Prop, new_message
from tests.conftest import SMALL

pytestmark = pytest.mark.transient_pool_too

SEGMENT = 16 * 1024  # a couple of hundred messages span four segments
SIZES = {"commitlog_segment_size": SEGMENT}
TOPICS = ("DamageA", "DamageB")
QUEUES = 3
ALL_TIME = (0, 2**62)
FATAL_LEVELS = {"error", "critical", "exception", "fatal"}
BODY_AT = rec.HEADER_V4_SIZE  # 88: records here have IPv4 hosts
EXAMPLES = settings(
    max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
RECOVERY = ("normal", "abort", "abort+zeroed-checkpoint")


@pytest.fixture(autouse=True)
def file_tail_only(backend: str) -> None:
    if not TRAITS[backend].file_tail:
        pytest.skip(f"the {backend} backend has no log tail in files to damage: its writes are "
                    "atomic (see the module docstring)")


@attrs.frozen
class Written:
    key: str
    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    size: int
    body: bytes

    @property
    def end(self) -> int:
        return self.phys + self.size

    @property
    def uniq(self) -> str:
        return "U-" + self.key

    def checkable(self) -> range:
        """Offsets (relative to the record) of every byte the format can check, in order:
        the header up to and including the body, where any change is detected."""
        return range(BODY_AT + len(self.body))

    def fields(self) -> dict[str, range]:
        """The checkable fields a single bit flip is aimed at."""
        b = len(self.body)
        props_len_at = BODY_AT + b + 1 + len(self.topic.encode())
        return {
            "TOTALSIZE": range(0, 4),
            "MAGICCODE": range(4, 8),
            "BODYCRC": range(8, 12),
            "PHYSICALOFFSET": range(28, 36),
            "BODY length": range(84, 88),
            "BODY": range(BODY_AT, BODY_AT + b),
            "PROPERTIES length": range(props_len_at, props_len_at + 2),
        }


# --- writing, damaging, reopening ---------------------------------------------------------


def _append(log: MessageLog, clock, rng: random.Random, count: int, prefix: str) -> list[Written]:
    out: list[Written] = []
    while len(out) < count:
        batch = []
        for _ in range(min(rng.randint(1, 8), count - len(out) - len(batch))):
            i = len(out) + len(batch)
            key = f"{prefix}{i}"
            topic = rng.choice(TOPICS)
            body = f"{key}:".encode() + bytes(rng.choices(b"abcdefghij0123456789",
                                                         k=rng.randint(10, 300)))
            m = new_message(topic, body, tags=f"t{i % 4}", keys=[key],
                            properties={Prop.UNIQ_KEY: "U-" + key}, compress_over=None)
            m.queue_id = rng.randrange(QUEUES)
            batch.append((key, m))
        results = log.append([rec.put_record(m) for _, m in batch])
        for (key, m), r in zip(batch, results, strict=True):
            assert r.status is PutStatus.PUT_OK
            out.append(Written(key, m.topic, m.queue_id, r.queue_offset, r.physical_offset,
                               r.size, m.body))
        clock.advance(1.0)  # store times differ, so abnormal recovery picks a real segment
    return out


def _segment_file(root: Path, phys: int) -> tuple[Path, int]:
    """The mmap segment file holding log offset ``phys``, and the offset inside it."""
    directory = root / "commitlog"
    assert directory.is_dir(), f"{root} has no commitlog/ directory: not a file-tail backend"
    start = phys - phys % SEGMENT
    path = directory / segment_name(start)
    assert path.is_file(), f"no segment file {path.name} for offset {phys}"
    return path, phys - start


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _read(path: Path, at: int = 0, n: int = -1) -> bytes:
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(n)


def _expected_cut(root: Path, at: int) -> int:
    """The non-zero bytes a cut at ``at`` drops from the damaged files (the damage is in the
    segment holding ``at``; any later segment would go as a whole)."""
    path, rel = _segment_file(root, at)
    return len(_read(path, rel).rstrip(b"\0"))


def _prepare_recovery(root: Path, mode: str) -> None:
    if mode != "normal":
        (root / "abort").touch()
    if mode == "abort+zeroed-checkpoint":
        _patch(root / "checkpoint", 0, bytes(32))


@contextlib.contextmanager
def _fresh_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="evq-damage-") as d:
        yield Path(d) / "store"


def _reopen(open_log, root: Path) -> tuple[MessageLog, list[dict]]:
    with capture_logs() as logs:
        log = open_log(path=root, **SIZES)
    return log, logs


# --- checking ----------------------------------------------------------------------------


def _check_logs(logs: list[dict], mode: str, cut: int) -> None:
    fatal = [e for e in logs if e.get("log_level") in FATAL_LEVELS]
    assert not fatal, f"recovery logged {fatal}"
    [recovered] = [e for e in logs if e["event"] == "store_recovered"]
    assert recovered["abnormal"] is (mode != "normal")
    assert recovered["cut_bytes"] == cut
    truncated = [e for e in logs if e["event"] == "commitlog_truncated"]
    if cut:
        assert [e["cut_bytes"] for e in truncated] == [cut], logs
    else:
        assert not truncated, logs


def _check_store(log: MessageLog, kept: list[Written], lost: list[Written]) -> None:
    """``kept`` is all the store must hold (in log order), ``lost`` what it must not."""
    lost_keys = {w.key for w in lost}
    # Queue by queue: dense offsets, exactly the kept records, in order.
    per_queue: dict[tuple[str, int], list[Written]] = {}
    for w in kept:
        per_queue.setdefault((w.topic, w.queue_id), []).append(w)
    for (topic, qid), max_offset in log.queues().items():
        want = per_queue.get((topic, qid), [])
        assert max_offset == len(want), (topic, qid, max_offset, len(want))
        assert log.bounds(topic, qid) == (0, len(want))
        got: list[rec.Message] = []
        offset = 0
        while offset < len(want):
            res = log.read(topic, qid, offset, max_count=32, max_bytes=1 << 20)
            assert res.status is GetStatus.FOUND, (topic, qid, offset, res.status)
            assert res.queue_offsets == list(range(offset, offset + len(res.records)))
            got += [rec.decode(v) for v in res.records]  # body CRC checked
            offset = res.next_offset
        assert [m.keys for m in got] == [[w.key] for w in want]
        assert [m.body for m in got] == [w.body for w in want]
        assert [m.commit_log_offset for m in got] == [w.phys for w in want]
        assert [m.queue_offset for m in got] == list(range(len(want)))
        end = log.read(topic, qid, len(want))
        assert end.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
        assert not end.records
    assert set(per_queue) <= set(log.queues())
    assert log.max_physical_offset >= (kept[-1].end if kept else 0)

    for w in kept:
        view = log.lookup(w.phys)
        assert view is not None, f"{w.key} at {w.phys} is gone"
        m = rec.decode(view)
        assert (m.keys, m.body, m.queue_offset) == ([w.key], w.body, w.queue_offset)
        for key in (w.key, w.uniq):
            q = log.query_keys(w.topic, key, 4, *ALL_TIME)
            assert q.physical_offsets == [w.phys], f"query_keys({key})"
    for w in lost:
        view = log.lookup(w.phys)
        if view is not None:  # a later append may sit there now; never the lost record
            assert rec.decode(view, check_crc=False).keys[0] not in lost_keys
        for key in (w.key, w.uniq):
            q = log.query_keys(w.topic, key, 4, *ALL_TIME)
            assert q.physical_offsets == [], f"the lost {key} is still found by key"


def _damage_and_check(
    open_log, clock, data: st.DataObject, damage: Callable[[Path, list[Written], Written], int]
) -> None:
    """Write, damage the last segment (``damage`` returns where the log must end), reopen
    with a drawn recovery mode, check, append, reopen, check."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    count = data.draw(st.integers(150, 260), label="messages")
    mode = data.draw(st.sampled_from(RECOVERY), label="recovery")
    rng = random.Random(seed)
    with _fresh_dir() as root:
        log = open_log(path=root, **SIZES)
        written = _append(log, clock, rng, count, "m")
        log.close()
        assert len(list((root / "commitlog").iterdir())) >= 3

        last_seg = written[-1].phys - written[-1].phys % SEGMENT
        in_last = [w for w in written if w.phys >= last_seg]
        victims = in_last[-6:]
        victim = victims[data.draw(st.integers(0, len(victims) - 1), label="victim")]
        cut_at = damage(root, written, victim)
        expected_cut = _expected_cut(root, cut_at)
        kept = [w for w in written if w.end <= cut_at]
        lost = [w for w in written if w.end > cut_at]
        assert not kept or kept[-1].end <= cut_at

        _prepare_recovery(root, mode)
        log, logs = _reopen(open_log, root)
        _check_logs(logs, mode, expected_cut)
        assert log.max_physical_offset == cut_at
        _check_store(log, kept, lost)

        more = _append(log, clock, rng, data.draw(st.integers(1, 40), label="more"), "n")
        assert more[0].phys in (cut_at, cut_at - cut_at % SEGMENT + SEGMENT)
        _check_store(log, kept + more, lost)
        log.close()

        log, logs = _reopen(open_log, root)
        _check_logs(logs, "normal", 0)
        _check_store(log, kept + more, lost)
        log.close()


# --- the damage ------------------------------------------------------------------------------


@EXAMPLES
@given(data=st.data())
def test_garbage_over_the_tail(open_log, clock, backend, data):
    """Random bytes over the last K bytes of data (and maybe a little past the log end)."""

    def damage(root: Path, written: list[Written], victim: Written) -> int:
        off = data.draw(st.sampled_from(victim.checkable()), label="garbage from")
        past = data.draw(st.integers(0, 200), label="past the end")
        start = victim.phys + off
        path, rel = _segment_file(root, start)
        end_rel = min(written[-1].end + past - (start - rel), SEGMENT)
        old = _read(path, rel, end_rel - rel)
        noise = random.Random(data.draw(st.integers(0, 2**32 - 1), label="noise"))
        # every byte changes, so the first one reached is damaged for sure
        _patch(path, rel, bytes(b ^ noise.randint(1, 255) for b in old))
        return victim.phys

    _damage_and_check(open_log, clock, data, damage)


@EXAMPLES
@given(data=st.data())
def test_zeroed_tail_from_inside_a_record(open_log, clock, backend, data):
    """Everything from a point inside a record is zeros (a torn write, a lost page)."""

    def damage(root: Path, written: list[Written], victim: Written) -> int:
        off = data.draw(st.sampled_from(victim.checkable()), label="zeros from")
        path, rel = _segment_file(root, victim.phys + off)
        _patch(path, rel, bytes(SEGMENT - rel))
        return victim.phys

    _damage_and_check(open_log, clock, data, damage)


@EXAMPLES
@given(data=st.data())
def test_single_bit_flip_in_one_of_the_last_records(open_log, clock, backend, data):
    """One flipped bit: in the body the CRC catches it, in the header the size, magic or
    physical offset no longer add up."""

    def damage(root: Path, written: list[Written], victim: Written) -> int:
        fields = victim.fields()
        name = data.draw(st.sampled_from(sorted(fields)), label="field")
        off = data.draw(st.sampled_from(fields[name]), label="byte")
        bit = data.draw(st.integers(0, 7), label="bit")
        path, rel = _segment_file(root, victim.phys + off)
        [b] = _read(path, rel, 1)
        _patch(path, rel, bytes([b ^ (1 << bit)]))
        return victim.phys

    _damage_and_check(open_log, clock, data, damage)


@EXAMPLES
@given(data=st.data())
def test_garbage_in_the_zeros_after_the_last_record(open_log, clock, backend, data):
    """Junk where the log should be all zeros: nothing is lost, the junk is cut away."""

    def damage(root: Path, written: list[Written], victim: Written) -> int:
        end = written[-1].end
        path, rel = _segment_file(root, end - 1)
        rel += 1
        gap = data.draw(st.integers(0, 64), label="gap")
        kind = data.draw(st.sampled_from(["random", "replayed last record"]), label="kind")
        if kind == "random":
            junk = data.draw(st.binary(min_size=1, max_size=512), label="junk")
        else:  # the last record again, as if its write had landed twice
            junk = _read(path, rel - written[-1].size, written[-1].size)
        _patch(path, rel + gap, junk[: max(0, SEGMENT - rel - gap)])
        return end

    _damage_and_check(open_log, clock, data, damage)


UNCHECKED = {  # fixed-header fields no CRC covers (STORETIMESTAMP aside, see below)
    "QUEUEID": range(12, 16),
    "FLAG": range(16, 20),
    "QUEUEOFFSET": range(20, 28),
    "SYSFLAG": range(36, 40),
    "BORNTIMESTAMP": range(40, 48),
    "BORNHOST": range(48, 56),
    "STOREHOSTADDRESS": range(64, 72),
    "RECONSUMETIMES": range(72, 76),
    "PREPARED TRANSACTION OFFSET": range(76, 84),
}


@pytest.mark.parametrize("name", sorted(UNCHECKED))
@settings(EXAMPLES, max_examples=8)
@given(data=st.data())
def test_bit_flip_in_an_unchecked_header_field_harms_no_other_record(
    open_log, clock, backend, name, data
):
    """A flip the format cannot detect (no CRC covers the header) passes recovery, and what
    the damaged record then says is anyone's guess; but the recovery must not raise, nor let
    it disturb any other record: a QUEUEOFFSET or QUEUEID that a re-dispatch (abnormal
    recovery) takes at face value must not overwrite another record's queue entry or blank-fill
    a queue up to a far offset.  (A flip in SYSFLAG's host-width bits changes the layout and is
    detected, so those two bits are left out; STORETIMESTAMP is left out because the store keeps
    store times monotonic across restarts, so a far-future one would stamp every later append.)
    """
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    mode = data.draw(st.sampled_from(RECOVERY), label="recovery")
    rng = random.Random(seed)
    with _fresh_dir() as root:
        log = open_log(path=root, **SIZES)
        written = _append(log, clock, rng, data.draw(st.integers(150, 260), label="count"), "m")
        log.close()
        victim = data.draw(st.sampled_from(written[-8:]), label="victim")
        off = data.draw(st.sampled_from(UNCHECKED[name]), label="byte")
        bit = data.draw(st.sampled_from([0, 1, 2, 3, 6, 7] if off == 39 else range(8)),
                        label="bit")
        path, rel = _segment_file(root, victim.phys + off)
        [b] = _read(path, rel, 1)
        _patch(path, rel, bytes([b ^ (1 << bit)]))

        _prepare_recovery(root, mode)
        log, logs = _reopen(open_log, root)
        _check_logs(logs, mode, 0)
        assert log.max_physical_offset == written[-1].end
        others = [w for w in written if w is not victim]
        _check_unharmed(log, others)
        more = _append(log, clock, rng, 20, "n")
        _check_unharmed(log, others + more)
        log.close()
        log, logs = _reopen(open_log, root)
        _check_logs(logs, "normal", 0)
        _check_unharmed(log, others + more)
        log.close()


def _check_unharmed(log: MessageLog, records: list[Written]) -> None:
    """Each record where it was put: at its queue offset, its physical offset, its keys; and
    the queues they are in are dense from 0."""
    queues = log.queues()
    for w in records:
        res = log.read(w.topic, w.queue_id, w.queue_offset, max_count=1)
        assert res.status is GetStatus.FOUND and res.queue_offsets == [w.queue_offset], w
        m = rec.decode(res.records[0])
        assert (m.keys, m.body, m.commit_log_offset) == ([w.key], w.body, w.phys)
        view = log.lookup(w.phys)
        assert view is not None and bytes(view) == bytes(res.records[0])
        for key in (w.key, w.uniq):
            assert log.query_keys(w.topic, key, 4, *ALL_TIME).physical_offsets == [w.phys]
    for topic, qid in {(w.topic, w.queue_id) for w in records}:
        lo, hi = log.bounds(topic, qid)
        assert lo == 0 and hi == queues[(topic, qid)]
        offset = 0
        while offset < hi:  # dense: every offset readable
            res = log.read(topic, qid, offset, max_count=32, max_bytes=1 << 20)
            assert res.status is GetStatus.FOUND
            assert res.queue_offsets == list(range(offset, offset + len(res.records)))
            offset = res.next_offset


# --- a segment file of the wrong length --------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != "lock"
    }


@pytest.mark.parametrize("mode", RECOVERY)
@pytest.mark.parametrize("where", ["inside a record", "at a record start"])
def test_short_last_segment_is_refused_then_recovers_once_padded(
    open_log, clock, backend, mode, where
):
    rng = random.Random(f"{mode}/{where}")
    with _fresh_dir() as root:
        log = open_log(path=root, **SIZES)
        written = _append(log, clock, rng, 200, "m")
        log.close()
        victim = written[-4]
        cut_at = victim.phys
        if where == "inside a record":
            cut_at += rng.randrange(1, BODY_AT + len(victim.body))
        path, rel = _segment_file(root, cut_at)
        os.truncate(path, rel)
        _prepare_recovery(root, mode)
        before = _snapshot(root)

        with pytest.raises(ValueError, match=r"size \d+ differs from the configured segment"):
            open_log(path=root, **SIZES)
        assert _snapshot(root) == before, "a refused open changed the store"

        os.truncate(path, SEGMENT)  # the operator pads it back: a zeroed tail
        expected_cut = _expected_cut(root, victim.phys)
        log, logs = _reopen(open_log, root)
        _check_logs(logs, mode, expected_cut)
        kept = [w for w in written if w.end <= victim.phys]
        _check_store(log, kept, [w for w in written if w.end > victim.phys])
        assert log.max_physical_offset == victim.phys
        more = _append(log, clock, rng, 10, "n")
        _check_store(log, kept + more, [])
        log.close()


@pytest.mark.parametrize("mode", RECOVERY)
def test_zero_length_last_segment_is_dropped(open_log, clock, backend, mode):
    """A crash between creating a segment file and sizing it leaves it empty: the log ends
    where that segment would have begun."""
    rng = random.Random(mode)
    with _fresh_dir() as root:
        log = open_log(path=root, **SIZES)
        written = _append(log, clock, rng, 200, "m")
        log.close()
        last_start = written[-1].phys - written[-1].phys % SEGMENT
        path, _ = _segment_file(root, last_start)
        os.truncate(path, 0)
        _prepare_recovery(root, mode)
        log, logs = _reopen(open_log, root)
        assert any(e["event"] == "empty_segment_removed" for e in logs)
        _check_logs(logs, mode, 0)
        kept = [w for w in written if w.phys < last_start]
        assert log.max_physical_offset == last_start
        _check_store(log, kept, [w for w in written if w.phys >= last_start])
        more = _append(log, clock, rng, 10, "n")
        assert more[0].phys == last_start
        _check_store(log, kept + more, [])
        log.close()


@pytest.mark.parametrize("mode", RECOVERY)
def test_files_left_half_built_are_removed(open_log, clock, backend, mode):
    """A crash while the allocator builds the next segment or index file leaves it under its
    temporary name, empty or sized: opening removes it, saying so, and loads the log whole."""
    rng = random.Random(mode)
    with _fresh_dir() as root:
        log = open_log(path=root, **SIZES)
        written = _append(log, clock, rng, 200, "m")
        log.close()
        next_start = written[-1].phys - written[-1].phys % SEGMENT + SEGMENT
        newest_index = max(p.name for p in (root / "index").iterdir())
        left = [building_path(root / "commitlog" / segment_name(next_start)),
                building_path(root / "index" / index_file_name(index_file_ms(newest_index) + 1))]
        left[0].touch()  # killed once it was created
        with open(left[1], "wb") as f:  # killed once it was sized and its head allocated
            f.truncate(index_file_size(SMALL.index_slots, SMALL.index_entries))
            os.posix_fallocate(f.fileno(), 0, 4096)
        _prepare_recovery(root, mode)
        log, logs = _reopen(open_log, root)
        # Not whether they exist now: the reopened store builds those very files again.
        removed = [e["path"] for e in logs if e["event"] == "unfinished_file_removed"]
        assert sorted(removed) == sorted(map(str, left))
        _check_logs(logs, mode, 0)
        _check_store(log, written, [])
        more = _append(log, clock, rng, 10, "n")
        assert more[0].phys == written[-1].end
        _check_store(log, written + more, [])
        log.close()
        assert not [p for d in ("commitlog", "index") for p in (root / d).iterdir()
                    if p.name.endswith(BUILDING_SUFFIX)]
