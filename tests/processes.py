"""``evq`` commands as real child processes, for tests that must watch a process survive,
refuse to start or shut down: only a separate process proves it never dies."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import attrs

REPO_ROOT = Path(__file__).resolve().parents[1]
EVQ = (sys.executable, "-m", "evq.cli")
LISTENING = re.compile(r"evq (namesrv|broker) listening on (\S+)")
EXIT_TIMEOUT = 30.0


def port_of(address: str) -> int:
    """The port of an ``ip:port`` a server printed."""
    return int(address.rpartition(":")[2])


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": os.environ.get("HOME", "/tmp")}


def run_evq(*args: str, timeout: float = EXIT_TIMEOUT, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run one ``evq`` command to its end, capturing both streams."""
    return subprocess.run([*EVQ, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=python_env(), timeout=timeout, check=False, input=stdin)


@attrs.define
class Running:
    """A started ``evq`` process and the addresses it printed, by server kind."""

    proc: subprocess.Popen[str]
    addresses: dict[str, str]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM, then the exit status (a clean shutdown answers within the timeout)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(EXIT_TIMEOUT)


@contextlib.contextmanager
def running_evq(*args: str, servers: int, stderr: IO[str] | int = subprocess.DEVNULL
                ) -> Iterator[Running]:
    """Start ``evq <args>`` and wait until it has printed ``servers`` "listening on" lines;
    kills whatever is still running on the way out (a test that wants a clean stop calls
    :meth:`Running.stop` itself)."""
    proc = subprocess.Popen([*EVQ, *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                            cwd=REPO_ROOT, env=python_env())
    assert proc.stdout is not None
    with proc:
        try:
            addresses: dict[str, str] = {}
            while len(addresses) < servers:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"evq {' '.join(args)} exited before listening")
                if m := LISTENING.search(line):
                    addresses[m[1]] = m[2]
            yield Running(proc, addresses)
        finally:
            if proc.poll() is None:
                proc.kill()
