"""Smoke tests of ``evq bench store``, ``evq bench backends`` and ``evq bench net`` as real
subprocesses (figures are never judged for speed)."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

FIGURES = (
    "append_msgs_per_s",
    "append_mb_per_s",
    "append_single_msgs_per_s",
    "read_msgs_per_s",
    "key_lookups_per_s",
    "recovery_seconds",
    "floor_msgs_per_s",
    "ratio_to_floor",
    "fresh_page_us",
    "sync_msgs_per_s",
    "sync_async_msgs_per_s",
    "sync_producers",
    "messages",
    "size",
)


def _evq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evq.cli", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_bench_store_json_has_every_figure(tmp_path: Path) -> None:
    proc = _evq(
        "bench", "store", "--messages", "2000", "--size", "256", "--json", "--producers", "4",
        "--segment-size", "1048576", "--data", str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # one JSON object, nothing else on stdout
    out = json.loads(lines[0])
    for key in FIGURES:
        value = out[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (key, value)
    assert out["backend"] == "mmap"
    assert out["messages"] == 2000
    assert out["size"] == 256
    assert out["sync_producers"] == 4
    assert out["rerun"].startswith("evq bench store ")
    assert "--messages 2000" in out["rerun"]
    assert "--segment-size 1048576" in out["rerun"]
    assert list(tmp_path.iterdir()) == []  # the scratch directory is cleaned up


def test_bench_store_unknown_backend_names_the_choices() -> None:
    proc = _evq("bench", "store", "--backend", "nope", "--messages", "10", timeout=60)
    assert proc.returncode != 0
    assert proc.stdout == ""
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "nope" in err
    assert "mmap" in err  # the valid choices are listed


BACKEND_FIGURES = (
    "append_async_1_msgs_per_s",
    "append_async_many_msgs_per_s",
    "append_sync_1_msgs_per_s",
    "append_sync_many_msgs_per_s",
    "read_hot_msgs_per_s",
    "read_cold_msgs_per_s",
    "key_lookups_per_s",
    "time_lookups_per_s",
)
SCALE_RATIOS = (
    "append_async_1_msgs_per_s",
    "read_hot_msgs_per_s",
    "key_lookups_per_s",
    "time_lookups_per_s",
    "disk_bytes_per_msg",
)


def _positive(key: str, value: object) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    assert math.isfinite(value) and value > 0, (key, value)


def test_bench_backends_json_is_keyed_by_backend(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = _evq(
        "bench", "backends", "--messages", "400", "--size", "128", "--sync-messages", "40",
        "--lookups", "50", "--writers", "4", "--segment-size", "262144", "--json",
        "--data", str(tmp_path / "scratch"), "--out", str(out),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert sorted(result) == ["lmdb", "memory", "mmap", "rocks"]
    for name, figures in result.items():
        assert figures["backend"] == name
        assert (figures["messages"], figures["size"], figures["writers"]) == (400, 128, 4)
        assert (figures["sync_messages"], figures["scale_messages"]) == (40, 40)
        assert figures["key_lookup_misses"] == 0
        assert figures["sync_timeouts"] == 0
        for key in BACKEND_FIGURES:
            _positive(f"{name}.{key}", figures[key])
        assert sorted(figures["scale_ratios"]) == sorted(SCALE_RATIOS)
        persistent = name != "memory"
        for key in ("recovery_seconds", "disk_bytes_per_msg"):
            if persistent:
                _positive(f"{name}.{key}", figures[key])
            else:
                assert figures[key] is None, (name, key)
        assert (figures["scale_ratios"]["disk_bytes_per_msg"] is None) is not persistent
    report = (out / "backends.md").read_text()
    assert "| figure | lmdb | memory | mmap | rocks |" in report
    assert "evq bench backends --messages 400" in report
    step = r"dict of 40 keys takes \d+ ns and of 400 keys \d+ ns \(ratio \d\.\d\d\)"
    assert re.search(step, report), report
    for chart in ("throughput.png", "recovery_and_disk.png", "scale.png"):
        assert (out / chart).read_bytes().startswith(b"\x89PNG")
    assert list((tmp_path / "scratch").iterdir()) == []


def test_bench_backends_unknown_backend_names_the_choices(tmp_path: Path) -> None:
    proc = _evq("bench", "backends", "--backends", "mmap,nope", "--out", str(tmp_path),
                timeout=60)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "nope" in err and "lmdb" in err and "rocks" in err and "memory" in err, err
NET_FIGURES = (
    "produce_msgs_per_s",
    "produce_batch_msgs_per_s",
    "produce_pipelined_msgs_per_s",
    "consume_msgs_per_s",
    "send_p50_ms",
    "send_p99_ms",
    "send_max_ms",
    "latency_achieved_msgs_per_s",
    "produce_client_cpu_us_per_msg",
    "produce_batch_client_cpu_us_per_msg",
    "produce_pipelined_client_cpu_us_per_msg",
    "consume_client_cpu_us_per_msg",
    "loop_stall_max_ms",
)


def test_bench_net_json_has_every_figure(tmp_path: Path) -> None:
    proc = _evq(
        "bench", "net", "--messages", "300", "--size", "256", "--rate", "200",
        "--latency-seconds", "0.5", "--in-flight", "16", "--segment-size", "1048576",
        "--data", str(tmp_path), "--json",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # one JSON object, nothing else on stdout
    out = json.loads(lines[0])
    for key in NET_FIGURES:
        value = out[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (key, value)
    assert out["send_p50_ms"] <= out["send_p99_ms"] <= out["send_max_ms"]
    # Read from /proc where there is one, in clock ticks (10 ms): a short phase may cost 0.
    costs = [out[f"{phase}_broker_cpu_us_per_msg"]
             for phase in ("produce", "produce_batch", "produce_pipelined", "consume")]
    if Path("/proc/self/stat").exists():
        assert all(c >= 0 for c in costs) and sum(costs) > 0, costs
    else:
        assert costs == [None] * 4
    assert (out["backend"], out["messages"], out["size"], out["in_flight"]) == (
        "mmap", 300, 256, 16)
    assert out["consumed_messages"] == 3 * 300  # every produce phase read back
    assert out["latency_messages"] == 100
    assert out["rerun"].startswith("evq bench net ")
    assert "--messages 300" in out["rerun"] and "--segment-size 1048576" in out["rerun"]
    assert list(tmp_path.iterdir()) == []  # the broker's scratch directory is removed


def test_bench_net_refuses_a_batch_over_the_frame_limit() -> None:
    proc = _evq("bench", "net", "--size", "1048576", "--batch", "32", timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "frame limit" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_bench_backends_without_matplotlib_writes_the_table_and_says_why(tmp_path: Path) -> None:
    """matplotlib is the ``bench`` extra, not a broker dependency: without it the report is
    the markdown table, and the command says where the charts went."""
    out = tmp_path / "report"
    hide = ("import sys; sys.modules['matplotlib'] = None; from evq.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run(
        [sys.executable, "-c", hide, "bench", "backends", "--backends", "memory",
         "--messages", "200", "--size", "64", "--sync-messages", "20", "--lookups", "20",
         "--writers", "2", "--data", str(tmp_path / "scratch"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["backends.md"]
    assert "no charts: they need matplotlib (pip install -e '.[bench]')" in proc.stderr


def test_bench_recovery_times_a_crash_per_size(tmp_path: Path) -> None:
    proc = _evq("bench", "recovery", "--sizes", "2MiB,8MiB", "--tail", "256KiB",
                "--segment-size", "1048576", "--size", "200", "--data", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    runs = result["runs"]
    tail = 256 << 10
    for run, size in zip(runs, (2 << 20, 8 << 20), strict=True):
        # the size, the tail past the checkpoint, at most a segment's filler and a batch more
        assert size + tail <= run["log_bytes"] < size + tail + (1 << 20) + 32 * 400, run
        assert run["seconds"] > 0 and run["clean_seconds"] > 0
    assert result["ratio_largest_to_smallest"] == runs[1]["seconds"] / runs[0]["seconds"]
    assert list(tmp_path.iterdir()) == []  # the scratch stores are gone


SCALE_READ_FIGURES = ("read_us", "key_lookup_us", "time_lookup_us")


def test_bench_store_scale_reports_each_figure_by_size(tmp_path: Path) -> None:
    proc = _evq("bench", "store", "--scale", "2000,400", "--lookups", "100", "--size", "64",
                "--rounds", "2", "--segment-size", "1048576", "--data", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    sizes = [p["messages"] for p in result["points"]]
    assert sizes == [400, 2000]
    for point in result["points"]:
        assert point["key_misses"] == 0
        assert point["key_lookup_faults"] >= 0 and point["time_lookup_faults"] >= 0
        for figure in ("append_us", *SCALE_READ_FIGURES):
            _positive(figure, point[figure])
    points = result["points"]
    assert result["ratios"]["append_us"] == [1.0, points[1]["append_us"] / points[0]["append_us"]]
    rounds = result["rounds"]
    assert len(rounds) == 2 and all(sorted(r) == ["2000", "400"] for r in rounds)
    for figure in SCALE_READ_FIGURES:
        per_round = [[r[str(n)][figure] for n in sizes] for r in rounds]
        for k, point in enumerate(points):  # each figure the median of the rounds'
            assert point[figure] == pytest.approx(statistics.median(f[k] for f in per_round))
        # each ratio the median of the rounds' own ratios, within their lowest-highest
        round_ratios = [f[1] / f[0] for f in per_round]
        ratio = result["ratios"][figure]
        assert ratio[0] == 1.0
        assert ratio[1] == pytest.approx(statistics.median(round_ratios)), figure
        low, high = result["ratio_ranges"][figure][1]
        assert (low, high) == pytest.approx((min(round_ratios), max(round_ratios)))
        assert low <= ratio[1] <= high
        assert result["ratio_ranges"][figure][0] == [1.0, 1.0]
    assert list(tmp_path.iterdir()) == []
    bad = _evq("bench", "store", "--scale", "10,x")
    assert bad.returncode == 2 and "not a list like 100000,1000000" in bad.stderr
    none = _evq("bench", "store", "--scale", "10,20", "--rounds", "0")
    assert none.returncode == 2 and none.stdout == ""
    assert "argument --rounds: must be at least 1, got 0" in none.stderr


def test_bench_store_scale_refuses_stores_the_disk_cannot_hold(tmp_path: Path) -> None:
    """All the stores are kept until the end: a run they would not fit on stops before it
    fills any, naming what it needs and what is free."""
    proc = _evq("bench", "store", "--scale", "1000000000,1000000000000", "--size", "1000000",
                "--data", str(tmp_path), timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    needed = re.search(r"need about ([\d,]+) bytes of disk at once", err)
    free = re.search(rf"; {re.escape(str(tmp_path))} has ([\d,]+) bytes free", err)
    assert needed and free, err
    assert int(needed[1].replace(",", "")) > int(free[1].replace(",", "")) > 0
    assert ("2 stores of 1,000,000,000, 1,000,000,000,000 messages with 1,000,000-byte bodies "
            "need about") in err
    assert list(tmp_path.iterdir()) == []


def test_bench_embedded_json_has_each_rate_and_ratio(tmp_path: Path) -> None:
    proc = _evq("bench", "embedded", "--messages", "200", "--single-messages", "20",
                "--size", "128", "--segment-size", "1048576", "--data", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    for system in ("evq", "eventsourcing", "eventsourcing_normal"):
        for phase in ("batch", "single", "read"):
            value = out[system][f"{phase}_msgs_per_s"]
            assert math.isfinite(value) and value > 0, (system, phase, value)
    for key in ("ratio_batch", "ratio_single", "ratio_read", "ratio_batch_normal"):
        assert math.isfinite(out[key]) and out[key] > 0, (key, out[key])
    assert out["evq_read_decoded_msgs_per_s"] > 0
    assert math.isfinite(out["fresh_page_us"]) and out["fresh_page_us"] > 0
    assert out["rerun"].startswith("evq bench embedded --backend mmap --messages 200 ")
    assert list(tmp_path.iterdir()) == []


def test_bench_embedded_without_eventsourcing_measures_evq_alone_and_says_so(
    tmp_path: Path,
) -> None:
    hide = ("import sys; sys.modules['eventsourcing'] = None; from evq.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run(
        [sys.executable, "-c", hide, "bench", "embedded", "--messages", "64",
         "--single-messages", "8", "--size", "64", "--segment-size", "1048576",
         "--data", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "eventsourcing is not installed (pip install -e '.[bench]')" in proc.stderr
    assert "evq alone" in proc.stdout
    assert re.search(r"a fresh page-cache page cost [\d.]+ us a 4 KiB page", proc.stdout)
    assert re.search(r"batch \(32 per call\)\s+[\d,]+\s+-\s+-", proc.stdout), proc.stdout


def test_bench_path_counts_a_send_against_the_transports_floor(tmp_path: Path) -> None:
    runs = []
    for _ in range(2):
        proc = _evq("bench", "path", "--messages", "500", "--traced", "20",
                    "--data", str(tmp_path), "--json")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, proc.stdout
        runs.append(json.loads(lines[0]))
    out = runs[0]
    send, floor = out["send"], out["floor"]
    # (The send may run fewer Python bytecodes than the floor: its path is compiled, the
    # floor's constant answer is a Python handler.)
    assert all(path[figure] > 0 for path in (send, floor) for figure in ("calls", "bytecodes"))
    assert send["cpu_us"] > 0 and floor["cpu_us"] > 0
    assert out["ratios"]["bytecodes"] == send["bytecodes"] / floor["bytecodes"]
    # What the run counts does not move with the machine's speed, as rates do twofold: a
    # second run counts within a percent (a store time crossing a millisecond takes a branch).
    for path in ("send", "floor"):
        for figure in ("calls", "bytecodes"):
            first, second = (r[path][figure] for r in runs)
            assert abs(second - first) <= 0.01 * first, (path, figure, first, second)
    assert out["rerun"] == (f"evq bench path --messages 500 --traced 20 --size 1024 "
                            f"--data {tmp_path} --json")
    assert list(tmp_path.iterdir()) == []


def test_bench_path_refuses_nothing_to_count() -> None:
    proc = _evq("bench", "path", "--traced", "0")
    assert proc.returncode != 0
    assert "messages and traced must be positive" in proc.stderr
