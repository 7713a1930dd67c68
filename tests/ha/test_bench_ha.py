"""``evq bench ha`` as a real subprocess: it runs, its JSON has every setup's figures, and it
names the command that repeats it (figures are never judged for speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evq.bench.ha import SETUPS, HABenchOptions
from tests.processes import REPO_ROOT, python_env


@pytest.mark.slow
def test_bench_ha_json_has_every_setup(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "evq.cli", "bench", "ha", "--messages", "300", "--size", "100",
         "--in-flight", "8", "--data", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO_ROOT,
        env=python_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [s["setup"] for s in out["setups"]] == list(SETUPS)
    for s in out["setups"]:
        assert s["produce_msgs_per_s"] > 0
        assert 0 < s["send_p50_ms"] <= s["send_p99_ms"]
        assert (s["lag_max_bytes"] is None) == (s["setup"] == "no slave")
    assert out["rerun"].startswith("evq bench ha ")
    assert list(tmp_path.iterdir()) == []  # the scratch stores are removed


def test_bench_ha_refuses_nonsense_options() -> None:
    with pytest.raises(ValueError, match="positive"):
        HABenchOptions(messages=0)
