"""A smoke test of ``evq bench spark`` as a real subprocess: a tiny topic, every figure
present and positive (figures are never judged for speed)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.processes import run_evq

FIGURES = ("fill_msgs_per_s", "pull_floor_msgs_per_s", "count_rows_per_s",
           "spark_floor_rows_per_s", "count_spark_floor_ratio",
           "groupby_rows_per_s", "write_rows_per_s", "count_floor_ratio",
           "groupby_floor_ratio", "write_fill_ratio")


def test_bench_spark_json_has_every_figure(tmp_path: Path) -> None:
    proc = run_evq("bench", "spark", "--messages", "300", "--batch", "16", "--data",
                   str(tmp_path), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(out[name] > 0 for name in FIGURES), out
    assert (out["messages"], out["batch"], out["master"]) == (300, 16, "local[2]")
    assert out["rerun"].startswith("evq bench spark --messages 300 --batch 16 ")
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_bench_spark_refuses_a_batch_of_zero() -> None:
    proc = run_evq("bench", "spark", "--batch", "0")
    assert proc.returncode == 2 and "--batch" in proc.stderr
