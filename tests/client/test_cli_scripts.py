"""``evq produce`` and ``evq consume`` as real processes against ``evq serve``."""

from __future__ import annotations

import json
import subprocess

from tests.compat.conftest import Served
from tests.processes import EVQ, REPO_ROOT, python_env, run_evq


def test_produce_lines_then_consume_them_as_json(cluster: Served) -> None:
    lines = "first line\nsecond ünïcødé line\nthird\n"
    produced = subprocess.run(
        [*EVQ, "produce", "-n", cluster.namesrv, "-t", "CLI", "--tags", "t1", "--keys", "k1 k2"],
        input=lines, capture_output=True, text=True, cwd=REPO_ROOT, env=python_env(),
        timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr
    results = [json.loads(x) for x in produced.stdout.splitlines()]
    assert [r["status"] for r in results] == ["SEND_OK"] * 3
    consumed = run_evq("consume", "-n", cluster.namesrv, "-t", "CLI", "-g", "G_cli",
                       "--from-beginning", "--count", "3", "--json", "--idle-timeout", "30",
                       timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    got = [json.loads(x) for x in consumed.stdout.splitlines()]
    assert sorted(m["body"] for m in got) == sorted(lines.splitlines())
    assert {m["tags"] for m in got} == {"t1"} and got[0]["keys"] == ["k1", "k2"]


def test_produce_in_batches(cluster: Served) -> None:
    produced = subprocess.run(
        [*EVQ, "produce", "-n", cluster.namesrv, "-t", "CLIB", "--batch", "4"],
        input="".join(f"m{i}\n" for i in range(10)), capture_output=True, text=True,
        cwd=REPO_ROOT, env=python_env(), timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr
    assert [json.loads(x)["messages"] for x in produced.stdout.splitlines()] == [4, 4, 2]
