"""``evq serve`` as a real process on free ports, for the stock-client tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.processes import REPO_ROOT, python_env, running_evq, wait_registered


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


def collect(proc: subprocess.Popen[str], timeout: float = 90) -> list[dict[str, Any]]:
    """What a consumer started by :func:`start_stock` printed, once it exited cleanly; any
    other end (a crash: faulthandler's report of every thread is in stderr) fails the test
    that started it."""
    out, err = proc.communicate(timeout=timeout)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert lines and lines[-1] == {"done": True}, (proc.returncode, out[-2000:], err[-3000:])
    return lines[:-1]
