"""kill -9 a writing process again and again; every acknowledged message must survive.

Each round starts :mod:`tests.backends.crash_child` on the same store directory, lets it append
(SYNC_FLUSH, acknowledging a message only once ``wait_durable`` returned) for a random
0.05-0.6 s after it opened the store, SIGKILLs it and reopens the store here.  The reopen must
take the abnormal recovery path (the child left the ``abort`` marker) and log nothing worse than
a warning; then every message acknowledged in any round so far must be readable by queue offset,
by physical offset and by key, with its body, and the store as a whole must be consistent:
queue offsets dense in every queue, every ConsumeQueue entry pointing at a whole record inside
the log, every record of the log in exactly one queue position, and no key twice.  The next
round's child continues appending to the recovered store.  Every other round the test leaves a
fresh ``abort`` marker behind its clean close, so the child also recovers abnormally itself.

The random timing comes from one seed, printed at the start and named in every failure; rerun
with ``EVQ_CRASH_SEED=<seed>`` (the child's timing is the OS's, so that narrows, not pins, it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import attrs
import pytest
from structlog.testing import capture_logs

from evq.backends.registry import TRAITS
from evq.domain import record as rec
from evq.domain.log import GetStatus, MessageLog
from evq.domain.message import Prop, decode_properties
from tests.backends import crash_child as child

ROUNDS = 20
KILL_AFTER = (0.05, 0.6)  # seconds after the child reported READY
READY_TIMEOUT = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]
FATAL_LEVELS = {"error", "critical", "exception", "fatal"}
ALL_TIME = (0, 2**62)


@attrs.frozen
class Ack:
    key: str
    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    msg_id: str
    uniq: str
    round_no: int


@attrs.frozen
class Stored:
    """One record as the reopened store holds it."""

    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    raw: bytes
    message: rec.Message


class _Lines(threading.Thread):
    """Drains one pipe of the child so it never blocks on a full pipe."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[str] = []
        self.ready = threading.Event()

    def run(self) -> None:
        for raw in self.stream:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if line == "READY\n":
                self.ready.set()
        self.ready.set()  # EOF: the child is gone, whatever it printed


def _run_child(backend: str, store: Path, round_no: int, seed: int, kill_after: float,
               pool: bool = False):
    """Start the child, kill it ``kill_after`` s after READY; returns (stdout lines, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.crash_child", backend, str(store), str(round_no),
         str(seed), *(["pool"] if pool else [])],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = _Lines(proc.stdout), _Lines(proc.stderr)
    out.start()
    err.start()
    try:
        assert out.ready.wait(READY_TIMEOUT), "the child never reported READY"
        assert out.lines[:1] == ["READY\n"], (
            f"the child did not start: rc={proc.poll()} stdout={out.lines[:3]} "
            f"stderr={''.join(err.lines)[-2000:]}"
        )
        time.sleep(kill_after)
        assert proc.poll() is None, (
            f"the child died on its own (rc={proc.returncode}): {''.join(err.lines)[-2000:]}"
        )
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:  # an assertion above fired: do not leave it running
            proc.kill()
            proc.wait(10)
        out.join(10)
        err.join(10)
        proc.stdout.close()
        proc.stderr.close()
    return out.lines, "".join(err.lines)


def _parse_acks(lines: list[str], round_no: int) -> list[Ack]:
    acks = []
    for line in lines[1:]:
        if not line.endswith("\n"):  # torn by the kill: never a complete acknowledgement
            continue
        tag, key, topic, qid, qo, phys, msg_id, uniq = line.split()
        assert tag == "ACK", line
        acks.append(Ack(key, topic, int(qid), int(qo), int(phys), msg_id, uniq, round_no))
    return acks


def _walk_queues(log: MessageLog) -> dict[tuple[str, int, int], Stored]:
    """Every record reachable through the ConsumeQueues, checking offsets are dense."""
    out: dict[tuple[str, int, int], Stored] = {}
    log_end = log.max_physical_offset
    for (topic, qid), max_offset in sorted(log.queues().items()):
        lo, hi = log.bounds(topic, qid)
        assert hi == max_offset
        assert 0 <= lo <= hi
        offset = lo
        while offset < hi:
            res = log.read(topic, qid, offset, max_count=64, max_bytes=1 << 20)
            assert res.status is GetStatus.FOUND, (topic, qid, offset, res.status)
            # dense: the read returns exactly the next offsets, none skipped, none unreadable
            assert res.queue_offsets == list(range(offset, offset + len(res.records)))
            assert res.next_offset == offset + len(res.records)
            for qo, view in zip(res.queue_offsets, res.records, strict=True):
                m = rec.decode(view)  # full decode, body CRC included
                assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, qo)
                assert m.commit_log_offset + len(view) <= log_end, "entry past the log end"
                out[(topic, qid, qo)] = Stored(topic, qid, qo, m.commit_log_offset, bytes(view), m)
            offset = res.next_offset
        assert log.read(topic, qid, hi).status is GetStatus.OFFSET_OVERFLOW_ONE
    return out


def _walk_log(log: MessageLog, segment_size: int) -> list[tuple[int, rec.Fields]]:
    """Every record of the raw log, in order (BLANK padding skipped), CRC-checked."""
    out = []
    pos, end = log.min_physical_offset, log.max_physical_offset
    while pos < end:
        chunk = log.read_log(pos, segment_size)
        assert chunk, f"read_log({pos}) is empty below the log end {end}"
        i = 0
        while i < len(chunk):
            size, magic = rec.peek(chunk, i)
            if magic == rec.BLANK_MAGIC:
                assert (pos + i + size) % segment_size == 0, "BLANK not reaching a segment end"
                i += size
                continue
            f = rec.read_fields(chunk, i, check_crc=True)
            assert f.crc_ok and f.physical_offset == pos + i, f"bad record at {pos + i}"
            out.append((pos + i, f))
            i += size
        pos += len(chunk)
    assert pos == end
    return out


def _check_store(log: MessageLog, acks: dict[str, Ack], fresh: list[Ack], since: int) -> int:
    """All the round's checks; ``since`` is where the log ended after the previous round.
    Returns how many records the store holds."""
    by_queue = _walk_queues(log)
    in_log = _walk_log(log, child.CONFIG.commitlog_segment_size)

    # Every record in the log is one message the child wrote, in exactly one queue position.
    keys = Counter(decode_properties(f.properties)[Prop.KEYS] for _, f in in_log)
    dup = [k for k, n in keys.items() if n > 1]
    assert not dup, f"keys stored twice: {dup[:10]}"
    assert sorted(s.phys for s in by_queue.values()) == [p for p, _ in in_log]
    for s in by_queue.values():
        key = s.message.keys[0]
        assert s.message.body == child.body_for(key), f"wrong body at {s.phys}"
        assert s.message.properties[Prop.UNIQ_KEY] == child.uniq_key_for(key)

    # Every acknowledged message, by queue offset and by physical offset.
    for a in acks.values():
        s = by_queue.get((a.topic, a.queue_id, a.queue_offset))
        assert s is not None, f"acknowledged {a} is not readable by queue offset"
        assert s.message.keys == [a.key], f"{a}: queue offset holds {s.message.keys}"
        assert s.phys == a.phys
        assert rec.offset_msg_id(child.CONFIG.store_host, a.phys) == a.msg_id
        view = log.lookup(a.phys)
        assert view is not None, f"acknowledged {a} is not readable by physical offset"
        assert view == s.raw, f"{a}: lookup and read disagree"

    # By key: every record this round's child wrote, acknowledged or not (the index is a
    # projection: recovery must have completed it for a batch the kill interrupted).
    for phys, f in in_log:
        if phys < since:
            continue
        props = decode_properties(f.properties)
        for key in (props[Prop.KEYS], props[Prop.UNIQ_KEY]):
            got = log.query_keys(f.topic, key, 8, f.store_timestamp - 1, f.store_timestamp + 1)
            assert got.physical_offsets == [phys], f"query_keys({key}) for the record at {phys}"
            assert rec.decode(got.records[0]).body == child.body_for(props[Prop.KEYS])

    # By key, acknowledged messages: this round's, and a sample of the older ones, which must
    # survive every later recovery too.  This round's records were all asked for above by the
    # same keys and store time (an ack's record is the one at its offsets, keys checked
    # above), so an ack of this round is asked for again only if it lies below ``since``.
    fresh_keys = {a.key for a in fresh}
    older = [a for a in acks.values() if a.key not in fresh_keys]
    sample = random.Random(len(acks)).sample(older, min(len(older), 200))
    for a in [*fresh, *sample]:
        ts = by_queue[(a.topic, a.queue_id, a.queue_offset)].message.store_timestamp
        for key in (a.key, a.uniq) if a.key not in fresh_keys or a.phys < since else ():
            got = log.query_keys(a.topic, key, 8, ts - 1, ts + 1)
            assert got.physical_offsets == [a.phys], f"query_keys({key}) for {a}"
            assert rec.decode(got.records[0]).body == child.body_for(a.key)
        # and over all time, for a few (the index files are searched newest first)
        if a.queue_offset % 50 == 0:
            got = log.query_keys(a.topic, a.key, 8, *ALL_TIME)
            assert got.physical_offsets == [a.phys], f"query_keys({a.key}) over all time"
    return len(in_log)


def _reopen(open_log, store: Path) -> tuple[MessageLog, list[dict]]:
    with capture_logs() as logs:
        log = open_log(path=store, **child.SIZES)
    return log, logs


@pytest.mark.slow
@pytest.mark.transient_pool_too
def test_sigkill_rounds_lose_no_acknowledged_message(open_log, backend, transient_pool, tmp_path):
    """With the transient store pool (``mmap-pool``) "acknowledged" means committed: a
    killed process loses what its buffers held, never what was in the file."""
    if not TRAITS[backend].persistent:
        pytest.skip(f"the {backend} backend keeps nothing past its process: there is no "
                    "store for a killed process to leave behind")
    seed = int(os.environ.get("EVQ_CRASH_SEED") or random.randrange(2**32))
    print(f"crash test seed: {seed} (rerun with EVQ_CRASH_SEED={seed})")
    rng = random.Random(seed)
    store = tmp_path / "store"
    acks: dict[str, Ack] = {}
    total_acked = 0
    torn_tails = 0
    since = 0
    for round_no in range(ROUNDS):
        where = f"seed {seed}, round {round_no}"
        kill_after = rng.uniform(*KILL_AFTER)
        lines, stderr = _run_child(backend, store, round_no, seed, kill_after, transient_pool)
        fresh = _parse_acks(lines, round_no)
        for bad in ("Traceback", "CHILD-FAIL", '"level": "error"', '"level": "critical"'):
            assert bad not in stderr, f"{where}: the child wrote {bad!r}: {stderr[-3000:]}"
        for a in fresh:
            assert a.key not in acks, f"{where}: {a.key} acknowledged twice"
            acks[a.key] = a
        total_acked += len(fresh)

        assert (store / "abort").exists(), f"{where}: the killed child left no abort marker"
        log, logs = _reopen(open_log, store)
        fatal = [e for e in logs if e.get("log_level") in FATAL_LEVELS]
        assert not fatal, f"{where}: recovery logged {fatal}"
        recovered = [e for e in logs if e["event"] == "store_recovered"]
        assert len(recovered) == 1 and recovered[0]["abnormal"] is True, f"{where}: {logs}"

        try:
            held = _check_store(log, acks, fresh, since)
        except AssertionError as exc:
            raise AssertionError(f"{where} (killed after {kill_after:.3f} s): {exc}") from exc
        assert held >= len(acks)
        since = log.max_physical_offset
        log.close()
        assert not (store / "abort").exists()
        if round_no % 2:
            # The child of the next round recovers abnormally too (with a clean checkpoint).
            (store / "abort").touch()
        cut = recovered[0]["cut_bytes"]
        torn_tails += cut > 0
        print(f"round {round_no}: killed after {kill_after:.3f} s, {len(fresh)} acknowledged, "
              f"{held} held, {cut} bytes cut")

    # The rounds did what they are for: acknowledged plenty and crossed many segments.
    print(f"{total_acked} acknowledged in all, {torn_tails} rounds recovered a torn tail")
    assert total_acked >= ROUNDS * 20, f"seed {seed}: only {total_acked} acknowledgements"
    assert len({a.round_no for a in acks.values()}) >= ROUNDS // 2
    log = open_log(path=store, **child.SIZES)
    segments = log.max_physical_offset // child.CONFIG.commitlog_segment_size + 1
    assert segments >= 3, f"seed {seed}: the log never rolled over ({segments} segments)"
