"""After a power cut the store's files are not all of one moment; recovery must not care.

The kernel writes the dirty pages of a mapped file back on its own schedule, so after a power
cut one ConsumeQueue (or the index) can be on disk as of a second ago while another is as of
the last projection flush, or has one later page on disk and not the pages before it.  The
CommitLog holds every acknowledged record (msync'd before the answer) and the checkpoint says
where all projections were last flushed.  Abnormal recovery must rebuild every queue from
there, whatever the newer files of other queues say, and must write over entries a power cut
left unwritten (zeros) or torn (an entry straddling a page boundary), which name no record.

The examples write two rounds of messages to two queues, flushing after each; then they put
the files of one queue and the checkpoint back as they were after the first round (as if the
second round's pages of that queue had never been written back), keeping all other files as
they are, leave the abort marker, and reopen.  Only a backend whose projections live in files
written in place has this to recover from (``TRAITS[..].file_tail``).
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.backends.mmapfile.mapped_file import segment_name
from evq.backends.registry import TRAITS
from evq.domain import record as rec
from evq.domain.log import GetStatus, MessageLog, PutStatus
from evq.domain.message import new_message

STALE, FRESH = "PowerStale", "PowerFresh"
ROUND = 300  # entries 0-299 fill the first 6000 bytes of a queue file, 300-599 the next
ENTRIES = 1024  # entries a ConsumeQueue file: 20 KiB, five pages
PAGE = 4096
HEADER = 40  # an index file's header: the first bytes of its first sector


def _append(log: MessageLog, clock, round_no: int) -> dict[str, list[bytes]]:
    bodies: dict[str, list[bytes]] = {STALE: [], FRESH: []}
    for i in range(ROUND):
        batch = []
        for topic in (STALE, FRESH):
            body = f"{topic}|{round_no}|{i}|".encode() * (1 + i % 5)
            m = new_message(topic, body, keys=[f"{topic}-{round_no}-{i}"], compress_over=None)
            m.queue_id = 0
            batch.append(m)
            bodies[topic].append(body)
        assert all(r.status is PutStatus.PUT_OK
                   for r in log.append([rec.put_record(m) for m in batch]))
        clock.advance(0.01)
    return bodies


def _queue_file(root: Path, topic: str) -> Path:
    return root / "consumequeue" / topic / "0" / segment_name(0)


def _check_queue(log: MessageLog, topic: str, bodies: list[bytes]) -> None:
    assert log.bounds(topic, 0) == (0, len(bodies))
    for qo, body in enumerate(bodies):
        got = log.read(topic, 0, qo, max_count=1)
        assert got.status is GetStatus.FOUND and got.queue_offsets == [qo], (topic, qo, got)
        assert rec.decode(got.records[0]).body == body, (topic, qo)


@pytest.mark.parametrize("lost", ["the queue's newer pages",
                                  "a page in the middle of the queue's newer entries"])
def test_a_queue_file_older_than_the_others_is_rebuilt_from_the_log(
    open_log, clock, backend: str, tmp_path: Path, lost: str
) -> None:
    if not TRAITS[backend].file_tail:
        pytest.skip(f"the {backend} backend writes its projections atomically with the log")
    root = tmp_path / "store"
    log = open_log(path=root, consume_queue_entries=ENTRIES)
    first = _append(log, clock, 1)
    log.flush()
    stale_file = _queue_file(root, STALE)
    queue_then, checkpoint_then = stale_file.read_bytes(), (root / "checkpoint").read_bytes()
    second = _append(log, clock, 2)
    log.flush()
    log.close()

    queue_now = stale_file.read_bytes()
    on_disk = bytearray(queue_then)
    if lost != "the queue's newer pages":  # only the third page was written back: both its
        on_disk[2 * PAGE : 3 * PAGE] = queue_now[2 * PAGE : 3 * PAGE]  # edges tear an entry
    stale_file.write_bytes(on_disk)
    (root / "checkpoint").write_bytes(checkpoint_then)
    (root / "abort").touch()

    log = open_log(path=root, consume_queue_entries=ENTRIES)
    for topic in (STALE, FRESH):
        _check_queue(log, topic, first[topic] + second[topic])
    [r] = log.append([rec.put_record(new_message(STALE, b"after", compress_over=None))])
    assert r.queue_offset == 2 * ROUND


Images = dict[str, bytes]
"""The index directory's files by name: their bytes as the page cache held them."""


def _index_images(root: Path) -> Images:
    return {f.name: f.read_bytes() for f in sorted((root / "index").iterdir())}


def _keyed_round(log: MessageLog, clock, n: int) -> None:
    """Round ``n`` of 100 records, each keyed ``k<n>-<i>`` and ``shared``."""
    for i in range(100):
        m = new_message(STALE, f"{n}|{i}".encode(), keys=["shared", f"k{n}-{i}"],
                        compress_over=None)
        m.queue_id = 0
        [r] = log.append([rec.put_record(m)])
        assert r.status is PutStatus.PUT_OK
        clock.advance(0.01)


def _write_sparse(path: Path, data: bytes) -> None:
    """``data`` as a store's file holds it: pages of zeros are holes, as the slots of an
    index file are where no write-back reached them (reserved blocks, never written, read
    as holes by ``SEEK_HOLE`` on ext4)."""
    with path.open("wb") as f:
        f.truncate(len(data))
        for at in range(0, len(data), PAGE):
            page = data[at : at + PAGE]
            if page.count(0) != len(page):
                f.seek(at)
                f.write(page)


def _crashed_copy(root: Path, case: Path, index: Images, checkpoint: bytes) -> Path:
    """A copy of the store at ``root`` as a crash left it: its index files ``index`` (written
    sparse), its checkpoint ``checkpoint``, and the abort marker down."""
    shutil.copytree(root, case)
    shutil.rmtree(case / "index")
    (case / "index").mkdir()
    for name, data in index.items():
        _write_sparse(case / "index" / name, data)
    (case / "checkpoint").write_bytes(checkpoint)
    (case / "abort").touch()
    return case


def _pieces(images: Images, head: int) -> list[tuple[str, int, int]]:
    """Each index file cut into the pieces a write-back may keep or lose independently: its
    pages, with the header (the first sector's), the slots (up to ``head``) and the entries
    apart."""
    out = []
    for name, data in images.items():
        edges = sorted({0, HEADER, head, len(data), *range(0, len(data), PAGE)})
        out += [(name, a, b) for a, b in itertools.pairwise(edges)]
    return out


def _disk(base: Images, newer: Images, pieces: list[tuple[str, int, int]]) -> Images:
    """``base`` with ``pieces`` as they are in ``newer`` (a file missing from ``base`` is
    zeros there; one none of whose pieces made it stays missing)."""
    out = dict(base)
    for name, a, b in pieces:
        data = bytearray(out.get(name) or bytes(len(newer[name])))
        data[a:b] = newer[name][a:b]
        out[name] = bytes(data)
    return out


@pytest.mark.parametrize("moment", ["between flushes", "while a flush writes the head"])
@pytest.mark.parametrize("sizes", [{"index_slots": 2000, "index_entries": 2000},
                                   {"index_slots": 97, "index_entries": 300}],
                         ids=["one file", "a roll between the rounds"])
def test_an_index_the_kernel_wrote_back_in_part_loses_no_key(
    open_log, clock, backend: str, tmp_path: Path, sizes: dict[str, int], moment: str
) -> None:
    """A power cut keeps any part of what the kernel held dirty in the index files: every
    acknowledged record must still be found by each of its keys.

    Two rounds of 100 records, each with a key of its own and one shared by all (so 200
    entries chain through one slot), the first round flushed.  ``between flushes``: the disk
    holds the first flush's files with any subset of the pieces (pages; the head apart from
    the entries) that differ in the page cache before the second flush.  Slots written in
    place through the mapping failed this: the page holding a slot could reach the disk
    before the page of the entry it names, which came back as zeros and hid its chain.
    ``while a flush writes the head``: the second flush put the entries on disk and was
    writing the slots back: any subset of their pieces is new, and the header too once all
    are (a header newer than a slot page would vouch for entries the old slot hides).  The
    2,000 slots span two pages; 300 entries a file make the second round roll into a new
    file.
    """
    if not TRAITS[backend].file_tail:
        pytest.skip(f"the {backend} backend writes its projections atomically with the log")
    root = tmp_path / "store"
    log = open_log(path=root, **sizes)

    _keyed_round(log, clock, 1)
    log.flush()
    then, checkpoint_then = _index_images(root), (root / "checkpoint").read_bytes()
    _keyed_round(log, clock, 2)
    before_flush = _index_images(root)
    log.flush()
    after_flush = _index_images(root)
    log.close()

    head = 40 + 4 * sizes["index_slots"]
    if moment == "between flushes":
        base, newer = then, before_flush
        choices = [p for p in _pieces(newer, head)
                   if then.get(p[0], bytes(len(newer[p[0]])))[p[1]:p[2]] != newer[p[0]][p[1]:p[2]]]
        cases = [[p for k, p in enumerate(choices) if mask >> k & 1]
                 for mask in range(2 ** len(choices))]
    else:
        base = _disk(then, after_flush, [p for p in _pieces(after_flush, head) if p[1] >= head])
        newer = after_flush
        choices = [p for p in _pieces(newer, head) if p[1] >= HEADER and p[2] <= head]
        headers = [p for p in _pieces(newer, head) if p[2] <= HEADER]
        cases = [[p for k, p in enumerate(choices) if mask >> k & 1]
                 for mask in range(2 ** len(choices))] + [choices + headers]
    assert 0 < len(choices) <= 8, choices
    far = 10**15
    for mask, chosen in enumerate(cases):
        case = _crashed_copy(root, tmp_path / f"case{mask}", _disk(base, newer, chosen),
                             checkpoint_then)
        log = open_log(path=case, **sizes)
        found = len(log.query_keys(STALE, "shared", 1000, 0, far).records)
        assert found == 200, (chosen, found)
        for n in (1, 2):
            for i in range(100):
                assert len(log.query_keys(STALE, f"k{n}-{i}", 10, 0, far).records) == 1, (
                    chosen, n, i)
        log.close()


def test_entries_a_round_put_on_disk_between_index_write_backs_are_linked_in_again(
    open_log, clock, backend: str, tmp_path: Path
) -> None:
    """A projection round between write-backs of the index head puts the new entries on disk
    and the checkpoint counts them; a power cut then keeps the head of the last write-back,
    those entries, and any part of what came after (entries of a later round of appends,
    page by page).  Reopened, the store links the counted entries in again, indexes the rest
    from the log, and finds every key of every record exactly once."""
    if not TRAITS[backend].file_tail:
        pytest.skip(f"the {backend} backend writes its projections atomically with the log")
    root = tmp_path / "store"
    sizes = {"index_slots": 97, "index_entries": 2000}
    log = open_log(path=root, flush_index_interval_ms=3_600_000, **sizes)

    _keyed_round(log, clock, 1)
    log.flush()
    then = _index_images(root)
    _keyed_round(log, clock, 2)
    log._flush_projections(periodic=True)  # the flusher's round (background=False runs none)
    after_round, checkpoint = _index_images(root), (root / "checkpoint").read_bytes()
    _keyed_round(log, clock, 3)
    in_cache = _index_images(root)
    log.close()

    head = 40 + 4 * sizes["index_slots"]
    assert then.keys() == after_round.keys() and all(
        then[n][:head] == after_round[n][:head] for n in then), "the round wrote no head back"
    synced = [p for p in _pieces(after_round, head)
              if p[1] >= head and then[p[0]][p[1]:p[2]] != after_round[p[0]][p[1]:p[2]]]
    base = _disk(then, after_round, synced)
    choices = [p for p in _pieces(in_cache, head)
               if p[1] >= head and base[p[0]][p[1]:p[2]] != in_cache[p[0]][p[1]:p[2]]]
    assert synced and 0 < len(choices) <= 6, (synced, choices)
    far = 10**15
    for mask in range(2 ** len(choices)):
        chosen = [p for k, p in enumerate(choices) if mask >> k & 1]
        case = _crashed_copy(root, tmp_path / f"case{mask}", _disk(base, in_cache, chosen),
                             checkpoint)
        with capture_logs() as logs:
            log = open_log(path=case, flush_index_interval_ms=3_600_000, **sizes)
        relinked = [e["entries"] for e in logs if e["event"] == "index_relinked"]
        assert relinked == [200], (chosen, relinked)  # round 2's keys, from the disk
        found = len(log.query_keys(STALE, "shared", 1000, 0, far).records)
        assert found == 300, (chosen, found)
        for n in (1, 2, 3):
            for i in range(100):
                assert len(log.query_keys(STALE, f"k{n}-{i}", 10, 0, far).records) == 1, (
                    chosen, n, i)
        log.close()
