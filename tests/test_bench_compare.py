"""Smoke tests of ``evq bench compare`` as a real subprocess with real servers (figures are
never judged for speed, only for shape)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PHASES = ("sync_produce", "sync_consume", "batch_produce", "batch_consume")
FIGURES = ("msgs_per_s", "server_cpu_us_per_msg", "client_cpu_us_per_msg", "p50_us", "p99_us")


def _compare(*args: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", "evq.cli", "bench", "compare", "--messages", "200",
         "--sync-messages", "50", "--batch", "8", "--json", *args],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # one JSON object, nothing else on stdout
    out: dict[str, object] = json.loads(lines[0])
    return out


def _check_system(figures: dict[str, object], sync: int, batch: int) -> None:
    assert isinstance(figures["version"], str) and figures["version"]
    for phase in PHASES:
        phase_figures = figures[phase]
        assert isinstance(phase_figures, dict)
        assert phase_figures["messages"] == (sync if phase.startswith("sync") else batch)
        for key in FIGURES:
            value = phase_figures[key]
            assert isinstance(value, int | float) and not isinstance(value, bool), (phase, key)
            assert math.isfinite(value) and value >= 0, (phase, key, value)
        assert phase_figures["msgs_per_s"] > 0 and phase_figures["client_cpu_us_per_msg"] > 0
        assert 0 < phase_figures["p50_us"] <= phase_figures["p99_us"], phase


@pytest.mark.parametrize(("flags", "client", "named"), [
    (("--loop", "uvloop"), "uvloop", "Producer / PullConsumer on uvloop"),  # (its old name)
    (("--client", "blocking"), "blocking", "SyncProducer / SyncPullConsumer"),
])
def test_bench_compare_evq_alone_says_why_redis_is_missing(
        tmp_path: Path, flags: tuple[str, str], client: str, named: str) -> None:
    out = _compare("--no-redis", *flags, "--data", str(tmp_path))
    assert (out["messages"], out["sync_messages"], out["batch"], out["size"]) == (200, 50, 8, 1024)
    systems = out["systems"]
    assert isinstance(systems, dict) and sorted(systems) == ["evq"]
    _check_system(systems["evq"], 50, 200)
    assert out["client"] == client and systems["evq"]["version"].endswith(named)
    assert out["ratios"] is None
    assert out["redis_note"] == "left out (--no-redis)"
    assert isinstance(out["rerun"], str) and "--no-redis" in out["rerun"]
    assert list(tmp_path.iterdir()) == []  # the servers' data is removed


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_bench_compare_beside_redis_computes_the_ratios(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    out = _compare("--data", str(tmp_path), "--runs", "2")
    systems = out["systems"]
    assert isinstance(systems, dict) and sorted(systems) == ["evq", "redis"]
    for name in ("evq", "redis"):
        _check_system(systems[name], 50, 200)
    assert out["redis_note"] is None
    assert out["client"] == "asyncio"
    ratios, by_run = out["ratios"], out["rate_ratios_by_run"]
    assert isinstance(ratios, dict) and sorted(ratios) == sorted(PHASES)
    assert isinstance(by_run, dict) and sorted(by_run) == sorted(PHASES)
    for phase in PHASES:
        runs = by_run[phase]
        assert len(runs) == 2 and all(r > 0 for r in runs), (phase, runs)
        # The ratio is the median of the runs' own ratios (two runs: their mean).
        assert ratios[phase]["msgs_per_s"] == pytest.approx(sum(runs) / 2)
        for figure in ("client_cpu_us_per_msg", "p50_us", "p99_us"):
            assert ratios[phase][figure] > 0, (phase, figure)
        # A phase this short may take the server less than a clock tick of CPU: no ratio.
        server = ratios[phase]["server_cpu_us_per_msg"]
        assert server is None or server >= 0, (phase, server)
    assert list(tmp_path.iterdir()) == []


def test_the_systems_take_turns_within_each_run() -> None:
    from evq.bench.compare import MODES, schedule

    order = schedule(4, ["evq", "redis"])
    assert len(order) == 4 * len(MODES) * 2
    for run in range(4):
        steps = [(mode, system) for r, mode, system in order if r == run]
        first = "evq" if run % 2 == 0 else "redis"
        other = "redis" if first == "evq" else "evq"
        # Each mode on both systems back to back; the first system alternates by run.
        assert steps == [(mode, s) for mode in MODES for s in (first, other)]
    assert schedule(3, ["evq"]) == [(r, m, "evq") for r in range(3) for m in MODES]


def test_a_ratio_is_the_median_of_each_runs_own_ratio() -> None:
    from evq.bench.compare import paired_ratio

    # A machine twice as fast in the second run: the runs agree on 0.5, two medians do not.
    assert paired_ratio([50.0, 100.0, 52.0], [100.0, 200.0, 104.0]) == pytest.approx(0.5)
    assert paired_ratio([1.0, 9.0, 2.0], [1.0, 1.0, 1.0]) == 2.0
    assert paired_ratio([None, 3.0], [1.0, 2.0]) == 1.5  # a run without /proc is left out
    assert paired_ratio([1.0], [0.0]) is None and paired_ratio([], []) is None


def test_a_workers_step_times_give_the_median_and_99th_percentile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of 1..100 us in a shuffled order: the median is the 51st shortest (nearest rank
    above the middle of an even count), the 99th percentile the 100th."""
    from evq.bench import compare_workers

    durations = [k * 1e-6 for k in (*range(100, 50, -1), *range(1, 51))]
    ticks = [0.0]
    for d in durations:
        ticks.append(ticks[-1] + d)
    clock = iter([0.0, 0.0, *ticks[1:], ticks[-1]])  # __init__, start, each step, outcome

    class FakeTime:
        @staticmethod
        def perf_counter() -> float:
            return next(clock)

        @staticmethod
        def process_time() -> float:
            return 0.0

    monkeypatch.setattr(compare_workers, "time", FakeTime)
    timer = compare_workers.Timer(60.0)
    timer.start()
    for _ in durations:
        timer.step()
    timer.done = 100
    outcome = timer.outcome()
    assert outcome.done == 100
    assert outcome.p50_us == pytest.approx(51) and outcome.p99_us == pytest.approx(100)
    assert outcome.seconds == pytest.approx(sum(durations))


def test_a_long_compare_shows_a_bar_of_its_phases_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the CLI turns on for a terminal: a step per phase, named by run, mode and system,
    on stderr, so that the report (or ``--json``) stays alone on stdout."""
    from evq.bench.compare import CompareOptions, run_compare

    result = run_compare(CompareOptions(messages=64, sync_messages=16, batch=8, redis=False,
                                        data=tmp_path, progress=True))
    out, err = capsys.readouterr()
    assert out == ""
    assert "run 1/1 sync evq" in err and "run 1/1 batch evq" in err
    assert "4/4" in err  # produce and consume of both modes
    assert result.systems["evq"].phases["batch_consume"].messages == 64
