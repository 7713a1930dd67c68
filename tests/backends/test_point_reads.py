"""The mmap store's point reads (a record by offset, a store time per offset-for-time probe, a
key lookup's verification) go through a second mapping of each segment advised for random
access, which follows the log through expiry, truncation and restarts."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from evq.domain.clock import ManualClock
from evq.domain.record import read_fields
from tests.backends.test_store import SEG, OpenLog, append, at, message, sized


@pytest.fixture
def backend() -> str:
    return "mmap"


def segment_mappings(log_root: Path) -> list[tuple[str, set[str]]]:
    """(path, VmFlags) of this process's mappings of files under ``log_root/commitlog``."""
    out: list[tuple[str, set[str]]] = []
    path = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            path = " ".join(fields[5:]) if len(fields) > 5 else ""
        elif fields and fields[0] == "VmFlags:" and path.startswith(str(log_root / "commitlog")):
            out.append((path, set(fields[1:])))
    return out


def test_point_reads_use_a_random_access_mapping_of_the_segment(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log()
    results = append(log, *(message(body=b"x" * 100, keys=f"k{i}") for i in range(10)))
    assert at(log, results[3].physical_offset) == log.read("T", 0, 3, max_count=1).records[0]
    flags = [f for p, f in segment_mappings(tmp_path / "store") if p.endswith("0" * 20)]
    # "rr": VM_RAND_READ, madvise(MADV_RANDOM): a fault reads the page, not a window around it.
    assert any("rr" in f for f in flags), flags
    assert any("rr" not in f for f in flags), "the segment's own mapping keeps read-around"


def test_an_expired_segment_is_unmapped_once_it_leaves_the_log(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log()
    results = append(log, *(sized(2000, keys=f"k{i}") for i in range(100)))
    for r in results:  # a point mapping of every segment
        assert log.lookup(r.physical_offset) is not None
    log.expire(force=True)
    log.expire(force=True)
    assert log.min_physical_offset == 2 * SEG
    gc.collect()  # the views handed out above are gone
    left = {p for p, _ in segment_mappings(tmp_path / "store")}
    assert not {p for p in left if p.endswith("(deleted)")}, left
    assert log.lookup(results[-1].physical_offset) is not None


def test_point_reads_after_a_cut_see_the_records_written_since(
    open_log: OpenLog, clock: ManualClock, tmp_path: Path
) -> None:
    log = open_log()
    first = append(log, *(sized(2000, keys=f"old{i}") for i in range(80)))
    cut = next(r.physical_offset for r in first if r.physical_offset > SEG)
    later = [r for r in first if r.physical_offset >= 2 * SEG]
    assert later and all(log.lookup(r.physical_offset) is not None for r in later)
    log.truncate(cut)  # the third segment goes, and is made anew by the appends below
    clock.advance(60_000)
    again = append(log, *(sized(2000, topic="U", keys=f"new{i}") for i in range(80)))
    gc.collect()
    assert not {p for p, _ in segment_mappings(tmp_path / "store") if p.endswith("(deleted)")}
    for r in again:
        assert read_fields(at(log, r.physical_offset), 0, check_crc=False).topic == "U"
    assert [r.physical_offset for r in again[:1]] == [cut]
    assert log.offset_for_time("U", 0, clock.now_ms()) == 0
    assert log.query_keys("U", "new79", 8, 0, 2**62).physical_offsets == [again[-1].physical_offset]
    assert log.query_keys("T", "old79", 8, 0, 2**62).physical_offsets == []


def test_point_reads_work_again_after_a_restart(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    results = append(log, *(sized(2000, keys=f"k{i}") for i in range(80)))
    log.close()
    log = open_log()
    for i in (0, 40, 79):
        found = log.query_keys("T", f"k{i}", 8, 0, 2**62).physical_offsets
        assert found == [results[i].physical_offset]
    assert log.offset_for_time("T", 0, results[40].store_timestamp) <= 40
