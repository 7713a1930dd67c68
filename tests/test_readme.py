"""The README runs as written: each ``sh`` and ``python`` block, copied verbatim, in order,
against an ``evq serve`` on the default ports it names, from a fresh directory.

A block the suite cannot run says why in the README source, in a comment right before it
(``<!-- not run by tests/test_readme.py: REASON -->``): the set-up commands CI itself runs,
Spark, the chaos suite.  A block of servers that run until stopped, one a line
(``<!-- run by tests/test_readme.py as servers: ... -->``), is started a line a process, each
waited for until it listens, checked with a message through them, and stopped with SIGTERM.
Spark blocks (``<!-- run by tests/test_readme.py in the Spark test ... -->``) run after every
other block, against the same server, as a user reaching the Spark section has the quick
start's topics; those marked ``once the broker has stopped`` read its store directory
(``./evq-data``, the quick start's default) after a clean stop.  So one run is the first day
of a user who pastes the README from the top.  Every other block runs, so a new block is
tested by default; ``text`` blocks are usage synopses and never run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import attrs
import pytest

from tests.processes import REPO_ROOT, python_env, running_evq, wait_registered

README = REPO_ROOT / "README.md"
NOT_RUN = re.compile(r"<!-- not run by tests/test_readme\.py: (?P<why>[^>]+) -->\n*$")
SERVERS = re.compile(r"<!-- run by tests/test_readme\.py as servers(?:, clients with "
                     r"(?P<env>[^:>]+))?: [^>]+ -->\n*$")
WITH_SERVERS = re.compile(r"<!-- run by tests/test_readme\.py with the servers above -->\n*$")
SPARK = re.compile(r"<!-- run by tests/test_readme\.py in the Spark test(?P<stopped>, once the "
                   r"broker has stopped)?[^>]*-->\n*$")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.S | re.M)
BLOCK_TIMEOUT_S = 120.0
SPARK_BLOCK_TIMEOUT_S = 400.0  # Spark's start-up and a streaming catch-up, on two busy cores


@attrs.frozen
class Block:
    line: int
    lang: str
    body: str
    not_run: str | None
    servers: bool = False
    spark: bool = False
    after_stop: bool = False
    with_servers: bool = False
    clients_env: dict[str, str] = attrs.field(factory=dict)
    """For servers: what a client of theirs needs (credentials, a CA file)."""


def blocks() -> list[Block]:
    text = README.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()]
        skip = NOT_RUN.search(before)
        spark = SPARK.search(before)
        servers = SERVERS.search(before)
        env = dict(pair.split("=", 1) for pair in (servers["env"] or "").split()) \
            if servers else {}
        found.append(Block(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"],
                           skip["why"] if skip else None, servers is not None,
                           spark is not None, bool(spark and spark["stopped"]),
                           WITH_SERVERS.search(before) is not None, env))
    return found


RUNNABLE = [b for b in blocks() if b.lang in ("sh", "python")]


def test_every_block_the_suite_skips_says_why() -> None:
    assert RUNNABLE, "no sh or python blocks found in the README"
    for b in blocks():
        assert b.lang in ("sh", "python", "text", ""), f"README line {b.line}: {b.lang!r}"
    assert [b for b in RUNNABLE if b.not_run is None], "the README test would run nothing"


def venv_env() -> dict[str, str]:
    """The environment of a shell with the venv active: ``evq`` and ``python`` are its own
    (and Spark's JVMs take the suite's JAVA_TOOL_OPTIONS, tests/conftest.py)."""
    return {**python_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                    f"{os.environ.get('PATH', '')}"}


def run_block(block: Block, work: Path) -> str:
    """Run ``block`` in ``work`` as pasted into a shell (or ``python``) of the venv; its
    stdout, once it has exited 0."""
    command = (["bash", "-euo", "pipefail", "-c", block.body] if block.lang == "sh"
               else [sys.executable, "-c", block.body])
    out = subprocess.run(command, cwd=work, env=venv_env(), capture_output=True, text=True,
                         timeout=SPARK_BLOCK_TIMEOUT_S if block.spark else BLOCK_TIMEOUT_S,
                         check=False)
    assert out.returncode == 0, (
        f"README line {block.line} ({block.lang}) failed with {out.returncode}:\n"
        f"{block.body}\n--- stdout\n{out.stdout[-2000:]}\n--- stderr\n{out.stderr[-3000:]}")
    return out.stdout


def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    """Every block, in order, from a fresh directory, against ``evq serve`` on the README's
    ports (9876, 10911) with its data in ``./evq-data`` there; then, that server stopped, the
    blocks that read its store and each block of servers with the client blocks that follow
    it.  The Spark blocks run last of those against the first server."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO_ROOT / "examples")  # `python examples/...` as written
    spark = importlib.util.find_spec("pyspark") is not None
    printed: dict[int, str] = {}
    with running_evq("--log-level", "warning", "serve", "--data", str(work / "evq-data"),
                     servers=2) as evq:
        wait_registered(evq.addresses["namesrv"], evq.addresses["broker"])
        for block in RUNNABLE:
            if not (block.not_run or block.servers or block.spark or block.with_servers):
                run_block(block, work)
        for block in [b for b in SPARK_BLOCKS if spark and not b.after_stop]:
            printed[block.line] = run_block(block, work)
        assert evq.stop() == 0
    for block in [b for b in SPARK_BLOCKS if spark and b.after_stop]:
        printed[block.line] = run_block(block, work)
    assert SERVER_BLOCKS, "the README's server blocks are no longer marked"
    for servers, clients in SERVER_BLOCKS:
        run_servers(servers, clients, work)
    if not spark:
        pytest.skip("the README's Spark blocks need the 'spark' extra; the others passed")
    _check_the_spark_pipeline(printed)


def _check_the_spark_pipeline(printed: dict[int, str]) -> None:
    """What the Spark section's blocks print: the orders sent, five closed minutes aggregated
    back into evq, and a report from the stopped broker's store that counts every order."""
    text = "\n".join(printed.values())
    assert "sent 1000 orders to orders" in text, text[-2000:]
    windows = [json.loads(line) for line in text.splitlines() if line.startswith('{"minute"')]
    assert len(windows) == 5 and all(w["orders"] > 0 for w in windows), text[-2000:]
    counted = re.search(r"^(\d+) messages in orders$", text, re.M)
    assert counted is not None and int(counted[1]) >= 1000, text[-2000:]
    report = [line.split() for line in text.splitlines() if re.fullmatch(
        r"\S+\s+\d+\s+\d+\.\d\d", line.strip())]
    assert sum(int(row[1]) for row in report) == 1000, text[-2000:]


def _server_blocks() -> list[tuple[Block, list[Block]]]:
    """Each block of servers with the client blocks after it (up to the next servers)."""
    found: list[tuple[Block, list[Block]]] = []
    for block in RUNNABLE:
        if block.servers:
            found.append((block, []))
        elif block.with_servers:
            assert found, f"README line {block.line}: 'with the servers above', but none are"
            found[-1][1].append(block)
    return found


SERVER_BLOCKS = _server_blocks()
SPARK_BLOCKS = [b for b in RUNNABLE if b.spark]
LISTENING = re.compile(r"evq (namesrv|broker) listening on ")
LISTEN_WAIT_S = 60.0


def run_servers(block: Block, clients: list[Block], work: Path) -> None:
    """Each line of a server block in a process of its own, as a user runs it in terminals;
    a message sent through them is consumed (by a client with the block's ``clients with``
    environment), the client blocks after it run, and each server stops cleanly on SIGTERM."""
    env = venv_env()
    lines = [x for x in block.body.replace("\\\n", " ").splitlines() if x.strip()]
    with contextlib.ExitStack() as stack:
        procs = []
        for line in lines:
            proc = stack.enter_context(subprocess.Popen(
                ["bash", "-c", f"exec env {line}"], cwd=work, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            stack.callback(lambda p=proc: p.poll() is None and p.kill())
            procs.append(proc)
            assert proc.stdout is not None
            seen = threading.Event()
            threading.Thread(target=lambda s=proc.stdout, e=seen: _wait_listening(s, e),
                             daemon=True).start()
            assert seen.wait(LISTEN_WAIT_S), f"README line {block.line}: {line!r} never listened"
        client_env = {**env, **block.clients_env}
        sent = subprocess.run(["bash", "-c", "echo through-servers | evq produce -t orders"],
                              cwd=work, env=client_env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S, check=False)
        assert sent.returncode == 0 and '"SEND_OK"' in sent.stdout, (block.line, sent.stderr)
        got = subprocess.run(["bash", "-c", "evq consume -t orders -g readme "
                              "--from-beginning --count 1"], cwd=work, env=client_env,
                             capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                             check=False)
        assert got.stdout == "through-servers\n", (block.line, got.stderr)
        for client in clients:
            run_block(client, work)
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, f"README line {block.line}: a server did not stop"


def _wait_listening(stream: IO[str], seen: threading.Event) -> None:
    for line in stream:
        if LISTENING.search(line):
            seen.set()
