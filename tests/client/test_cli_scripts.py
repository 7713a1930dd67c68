"""``evq produce`` and ``evq consume`` as real processes against a real name server and broker;
their failures as one line on stderr."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import time

import pytest

from evq.client.pull_consumer import PullConsumer
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
    assert one_line_failure(out) == (
        "evq: error: no name server reachable for topic 'T' (tried 127.0.0.1:1: cannot "
        "connect to 127.0.0.1:1: [Errno 111] Connection refused)")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("args, reason", [
    (("produce", "-n", "h:1"), "the following arguments are required: -t/--topic"),
    (("consume", "-n", "h:1", "-t", "T", "-g", "G", "--count", "0"), "argument --count"),
    (("bogus",), "invalid choice: 'bogus'"),
])
def test_usage_errors_are_one_line(args: tuple[str, ...], reason: str) -> None:
    assert reason in one_line_failure(run_evq(*args), code=2)


def read_lines(proc: subprocess.Popen[bytes], n: int, timeout: float = 30) -> list[str]:
    """The first ``n`` lines ``proc`` prints, or fail after ``timeout`` seconds (read from the
    pipe itself: a buffered reader could hold lines the selector no longer sees)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while data.count(b"\n") < n:
            left = deadline - time.monotonic()
            assert left > 0 and selector.select(left), f"only {data!r} printed"
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"exited ({proc.wait()}) after printing {data!r}"
            data += chunk
    return data.decode().splitlines()[:n]


async def committed(namesrv: str, group: str, topic: str) -> int:
    """The sum of ``group``'s committed offsets over the queues of ``topic``."""
    async with PullConsumer(group, namesrv, auto_commit=False) as pc:
        return sum([max(await pc.committed(q), 0) for q in await pc.queues(topic)])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_consume_stopped_by_a_signal_commits_what_it_printed(cluster: Served,
                                                             sig: signal.Signals) -> None:
    topic, group = f"CLIS{sig.name}", f"G_cli_{sig.name}"
    bodies = [f"m{i}" for i in range(6)]
    assert run_evq("produce", "-n", cluster.namesrv, "-t", topic,
                   stdin="".join(b + "\n" for b in bodies)).returncode == 0
    with subprocess.Popen([*EVQ, "consume", "-n", cluster.namesrv, "-t", topic, "-g", group,
                           "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=REPO_ROOT, env=python_env()) as proc:
        try:
            assert sorted(read_lines(proc, len(bodies))) == bodies
            proc.send_signal(sig)
            assert proc.wait(30) == 0
            assert proc.stderr is not None and proc.stderr.read() == b""
        finally:
            if proc.poll() is None:
                proc.kill()
    assert asyncio.run(committed(cluster.namesrv, group, topic)) == len(bodies)


def test_consuming_a_topic_nobody_created_fails_at_once(cluster: Served) -> None:
    out = run_evq("consume", "-n", cluster.namesrv, "-t", "NeverMade", "-g", "G_none",
                  timeout=30)
    assert one_line_failure(out) == (f"evq: error: topic 'NeverMade' does not exist on "
                                     f"{cluster.namesrv} (--wait-for-topic waits for it)")


def test_wait_for_topic_says_what_it_waits_for_then_consumes(cluster: Served) -> None:
    with subprocess.Popen([*EVQ, "consume", "-t", "MadeLater", "-g", "G_later",
                           "--from-beginning", "--count", "1", "--wait-for-topic"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
                          env={**python_env(), "NAMESRV_ADDR": cluster.namesrv}) as proc:
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().decode() == (
                f"evq: waiting for topic 'MadeLater' to be created (name servers "
                f"{cluster.namesrv})\n")
            made = run_evq("produce", "-t", "MadeLater", stdin="late\n",  # -n from the env
                           env={"NAMESRV_ADDR": cluster.namesrv})
            assert made.returncode == 0, made.stderr
            assert read_lines(proc, 1, timeout=60) == ["late"]
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
