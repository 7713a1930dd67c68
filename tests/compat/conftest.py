"""``evq serve`` as a real process on free ports, for the stock-client tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"evq (namesrv|broker) listening on (\S+)")


@attrs.define
class Served:
    namesrv: str
    broker: str
    proc: subprocess.Popen[str]


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": os.environ.get("HOME", "/tmp")}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "evq.cli", "--log-level", "warning", "serve", "--port", "0",
         "--namesrv-port", "0", "--data", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
        env=python_env())
    assert proc.stdout is not None
    with proc:
        addrs: dict[str, str] = {}
        while len(addrs) < 2:
            line = proc.stdout.readline()
            if not line:
                proc.kill()
                raise RuntimeError("evq serve exited before listening")
            m = _LISTENING.search(line)
            if m:
                addrs[m[1]] = m[2]
        try:
            yield Served(addrs["namesrv"], addrs["broker"], proc)
        finally:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def stock(*args: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Run the stock C++ client driver to completion; its JSON lines."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.compat.stock_client", *args], capture_output=True,
        text=True, cwd=REPO_ROOT, env=python_env(), timeout=timeout, check=False)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines and lines[-1] == {"done": True}, (out.returncode, out.stdout[-2000:],
                                                   out.stderr[-2000:])
    return lines[:-1]


def start_stock(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.compat.stock_client", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO_ROOT, env=python_env())


def collect(proc: subprocess.Popen[str], timeout: float = 90) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=timeout)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert lines and lines[-1] == {"done": True}, out[-2000:]
    return lines[:-1]
