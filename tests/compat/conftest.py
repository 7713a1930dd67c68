"""``evq serve`` as a real process on free ports, for the stock-client tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.processes import REPO_ROOT, python_env, running_evq, wait_registered
from tests.waiting import wait_for


@attrs.define
class Served:
    namesrv: str
    broker: str
    proc: subprocess.Popen[str]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(tmp_path / "data"), servers=2) as running:
        wait_registered(running.addresses["namesrv"], running.addresses["broker"])
        yield Served(running.addresses["namesrv"], running.addresses["broker"], running.proc)
        assert running.stop() == 0


def stock(*args: str, timeout: float = 60, env: dict[str, str] | None = None
          ) -> list[dict[str, Any]]:
    """Run the stock C++ client driver to completion (``env`` adds variables); its JSON
    lines."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.compat.stock_client", *args], capture_output=True,
        text=True, cwd=REPO_ROOT, env={**python_env(), **(env or {})}, timeout=timeout,
        check=False)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines and lines[-1] == {"done": True}, (out.returncode, out.stdout[-2000:],
                                                   out.stderr[-2000:])
    return lines[:-1]


STARTED: list[subprocess.Popen[str]] = []
"""Stock clients started by :func:`start_stock`; :func:`reap_stock_clients` ends those a
failing test left behind, so a dead or stuck client fails its own test and no other."""


def start_stock(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.compat.stock_client", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env={**python_env(), **(env or {})})
    STARTED.append(proc)
    return proc


def reap_stock_clients() -> None:
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


class Driver:
    """A stock client driver started by :func:`start_stock`, its JSON lines read as they come
    (by threads of its own), so that a test waits for what it expects to see rather than
    for a fixed time."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = start_stock(*args, env=env)
        self.lines: list[dict[str, Any]] = []
        self._err: list[str] = []  # drained as it comes too: a full pipe would stall the driver
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for reader in self._readers:
            reader.start()

    # Both readers end at the driver's end of stream, or when reap_stock_clients closes the
    # streams of a driver a failed test left running.

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.proc.stdout:
                if line.startswith("{"):
                    self.lines.append(json.loads(line))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):
            self._err.extend(self.proc.stderr)

    def _join(self, timeout: float) -> None:
        for reader in self._readers:
            reader.join(timeout)

    def received(self) -> list[dict[str, Any]]:
        """The messages a consumer has handed its listener so far, in order."""
        return [m for m in list(self.lines) if "seq" in m]

    def numbered(self) -> list[dict[str, Any]]:
        """:meth:`received`, less the warm-up messages of :func:`warm_up`."""
        return [m for m in self.received() if m["seq"].isdigit()]

    def seqs(self) -> set[int]:
        return {int(m["seq"]) for m in self.numbered()}

    def warm_queues(self, since: int = 0) -> set[int]:
        """The queues this consumer took warm-up messages from (its ``since``-th line on)."""
        return {m["queue"] for m in self.lines[since:]
                if "seq" in m and m["seq"].startswith(WARM + "-")}

    def stop(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Ask a consumer to shut down (SIGTERM: it shuts its client down cleanly, as an
        application would) and return its lines; any other end fails the test."""
        self.proc.terminate()
        self.proc.wait(timeout)
        self._join(timeout)
        assert self.lines and self.lines[-1] == {"done": True}, (
            self.proc.returncode, self.lines[-5:], "".join(self._err)[-3000:])
        return self.lines[:-1]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._join(10)


WARM = "warm"
"""The seq prefix of :func:`warm_up`'s messages."""


def warm_up(namesrv: str, topic: str, ready: Callable[[], bool], what: str) -> None:
    """Send messages (seq ``warm-N``) to ``topic`` until ``ready`` holds: consumers pull from
    where the group's offsets stand when they start, so a test sends what it checks only once
    they are seen consuming (C++ members rebalance on the broker's notice, or 10 s later)."""
    producer = Driver("produce-forever", namesrv, topic, WARM)
    try:
        wait_for(what, ready, within=60, every=0.1)
    finally:
        producer.kill()


def collect(proc: subprocess.Popen[str], timeout: float = 90) -> list[dict[str, Any]]:
    """What a consumer started by :func:`start_stock` printed, once it exited cleanly; any
    other end (a crash: faulthandler's report of every thread is in stderr) fails the test
    that started it."""
    out, err = proc.communicate(timeout=timeout)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert lines and lines[-1] == {"done": True}, (proc.returncode, out[-2000:], err[-3000:])
    return lines[:-1]
