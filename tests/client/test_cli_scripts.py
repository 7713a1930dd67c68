"""``evq produce`` and ``evq consume`` as real processes against a real name server and broker;
their failures as one line on stderr."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

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


def one_line_failure(out: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert out.returncode == code and out.stdout == "", (out.returncode, out.stdout)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("evq: error: "), out.stderr
    return lines[0]


@pytest.mark.parametrize("command, stdin", [
    (("consume", "-g", "G"), None),
    (("produce",), ""),
    (("produce",), "a line\n"),
])
def test_an_unreachable_name_server_fails_at_once_with_one_line(
        command: tuple[str, ...], stdin: str | None) -> None:
    started = time.monotonic()
    out = run_evq(*command, "-n", "127.0.0.1:1", "-t", "T", stdin=stdin, timeout=20)
    assert one_line_failure(out) == "evq: error: no name server reachable for topic 'T'"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("args, reason", [
    (("produce", "-t", "T"), "the following arguments are required: -n/--namesrv"),
    (("consume", "-n", "h:1", "-t", "T", "-g", "G", "--count", "0"), "argument --count"),
    (("bogus",), "invalid choice: 'bogus'"),
])
def test_usage_errors_are_one_line(args: tuple[str, ...], reason: str) -> None:
    assert reason in one_line_failure(run_evq(*args), code=2)
