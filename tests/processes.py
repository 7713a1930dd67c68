"""``evq`` commands as real child processes, for tests that must watch a process survive,
refuse to start or shut down: only a separate process proves it never dies; and a name server
and brokers as separate processes, the way they are deployed, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import attrs

from evq.client.errors import ClientError
from evq.client.routes import Routes
from evq.domain import topics as tp

REPO_ROOT = Path(__file__).resolve().parents[1]
EVQ = (sys.executable, "-m", "evq.cli")
LISTENING = re.compile(r"evq (namesrv|broker) listening on (\S+)")
EXIT_TIMEOUT = 30.0
REGISTRATION_WAIT_S = 30.0


def port_of(address: str) -> int:
    """The port of an ``ip:port`` a server printed."""
    return int(address.rpartition(":")[2])


_HANDED_OUT: set[int] = set()
"""Every port :func:`free_port` has handed out in this process."""


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, for a server that must know its port before it
    starts (a master restarted where its slave and clients expect it, an HA port, a server
    started in the test's own process): never one this process handed out before.

    It remembers the ports it handed out because the kernel may give a port just closed to the
    next bind(0): two calls in a row can return the same port, and once a broker group's master
    port and HA port came out the same (its clients' connections then went to the HA listener).
    Only within a process: each pytest-xdist worker has its own set."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": os.environ.get("HOME", "/tmp")}


def run_evq(*args: str, timeout: float = EXIT_TIMEOUT, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one ``evq`` command to its end, capturing both streams (``env`` adds variables)."""
    return subprocess.run([*EVQ, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**python_env(), **(env or {})}, timeout=timeout, check=False,
                          input=stdin)


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
    with contextlib.ExitStack() as stack:
        # Where stderr is not wanted it is still kept, for the error of a server that could
        # not start (a port in use, a bad flag) to say why.
        early = (stack.enter_context(tempfile.TemporaryFile("w+"))
                 if stderr == subprocess.DEVNULL else None)
        proc = stack.enter_context(subprocess.Popen(
            [*EVQ, *args], stdout=subprocess.PIPE, stderr=early or stderr, text=True,
            cwd=REPO_ROOT, env=python_env()))
        assert proc.stdout is not None
        try:
            addresses: dict[str, str] = {}
            while len(addresses) < servers:
                line = proc.stdout.readline()
                if not line:
                    why = ""
                    if early is not None:
                        early.seek(0)
                        why = ": " + early.read()[-2000:]
                    raise RuntimeError(f"evq {' '.join(args)} exited before listening{why}")
                if m := LISTENING.search(line):
                    addresses[m[1]] = m[2]
            yield Running(proc, addresses)
        finally:
            if proc.poll() is None:
                proc.kill()


def wait_registered(namesrv: str, broker_addr: str) -> None:
    """Poll until the name server routes the default topic to ``broker_addr``: a broker
    prints where it listens before its first registration has arrived, and a client asking in
    between is told no topic exists."""
    deadline = time.monotonic() + REGISTRATION_WAIT_S
    while not asyncio.run(_routed(namesrv, broker_addr)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{broker_addr} never registered with {namesrv}")
        time.sleep(0.05)


async def _routed(namesrv: str, broker_addr: str) -> bool:
    routes = Routes(namesrv)
    try:
        route = await routes.lookup(tp.AUTO_CREATE_TOPIC)
    except ClientError:
        return False
    finally:
        await routes.close()
    return any(broker_addr in ids.values() for ids in route.brokers.values())


@contextlib.contextmanager
def running_namesrv() -> Iterator[str]:
    """``evq namesrv`` on a free port; its address."""
    with running_evq("--log-level", "warning", "namesrv", "--port", "0", servers=1) as ns:
        yield ns.addresses["namesrv"]


@contextlib.contextmanager
def running_broker(namesrv: str, data: Path, *args: str, port: int = 0,
                   stderr: IO[str] | int = subprocess.DEVNULL, log_level: str = "warning",
                   ) -> Iterator[Running]:
    """``evq broker`` (on a free port unless ``port`` is given) with ``args``, once the name
    server routes to it."""
    with running_evq("--log-level", log_level, "broker", "--port", str(port),
                     "--namesrv", namesrv, "--data", str(data), *args, servers=1,
                     stderr=stderr) as broker:
        wait_registered(namesrv, broker.addresses["broker"])
        yield broker
