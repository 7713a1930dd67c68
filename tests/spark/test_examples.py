"""The examples/ pipeline runs as a user would run it: produce orders, aggregate them per minute
with Structured Streaming back into evq, then report offline from the stopped broker's store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.processes import REPO_ROOT, python_env, run_evq, running_evq, wait_registered

EXAMPLES = REPO_ROOT / "examples"


def example(name: str, *args: str, timeout: float = 240) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                         text=True, cwd=REPO_ROOT, env={**python_env(),
                                                        "PYSPARK_PYTHON": sys.executable},
                         timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_example_pipeline_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(data), servers=2) as running:
        namesrv = running.addresses["namesrv"]
        wait_registered(namesrv, running.addresses["broker"])
        # The README's first snippet sends text to the same topic: the report skips it.
        assert run_evq("produce", "-n", namesrv, "-t", "orders", stdin="order #1\n"
                       ).returncode == 0
        example("produce_orders.py", "-n", namesrv, "--orders", "200", "--rate", "1000",
                "--backdate-minutes", "10")
        example("orders_per_minute.py", "-n", namesrv, "--checkpoint",
                str(tmp_path / "checkpoint"), "--seconds", "60")
        got = run_evq("consume", "-n", namesrv, "-t", "orders-per-minute", "-g", "check",
                      "--from-beginning", "--json", "--idle-timeout", "8")
        assert got.returncode == 0, got.stderr
        windows = [json.loads(json.loads(line)["body"]) for line in got.stdout.splitlines()]
        assert len(windows) >= 5  # ten minutes of orders: the closed windows
        assert sum(w["orders"] for w in windows) <= 200
        assert all(w["orders"] > 0 and w["total"] > 0 for w in windows)
        assert running.stop() == 0
    report = example("offline_report.py", "--path", str(data))
    rows = [line.split() for line in report.splitlines() if line.strip()]
    assert sum(int(r[1]) for r in rows) == 200
