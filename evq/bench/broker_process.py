"""A broker in a child process, for benchmarks that must not share its interpreter.

A broker and its clients in one Python process share one GIL and one event loop, so each would
be measured with the other's CPU time taken out of it.  :class:`BrokerProcess` runs
``python -m evq.cli broker --port 0`` instead, learns the bound address from the line the
command prints once it serves (``evq broker listening on HOST:PORT (...)``), and stops it with
SIGTERM as an operator would, so the store is flushed and closed as in production.

The child's CPU time is read from ``/proc`` where there is one: it tells whether a figure was
bound by the broker or by the benchmark's client, and lets a phase start once the broker has
finished warming its store segments in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import attrs

from evq import logs

log = logs.get_logger(__name__)

LISTENING = re.compile(r"\blistening on (?P<host>\S+):(?P<port>\d+)")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SETTLE_WINDOW_S = 0.25
SETTLE_BUSY = 0.2  # "idle": under a fifth of one core over a window
STDERR_TAIL_LINES = 5


class BrokerProcessError(Exception):
    """The broker child could not be started, or died while it was needed."""


def listening_address(line: str) -> tuple[str, int] | None:
    """``(host, port)`` from the line a server prints once it listens; None for other lines."""
    match = LISTENING.search(line)
    if match is None:
        return None
    port = int(match["port"])
    return (match["host"], port) if 0 < port < 65536 else None


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far; None without a ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may hold spaces) start at field 3,
    # the state; utime and stime are fields 14 and 15.
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@attrs.define
class BrokerProcess:
    """A running broker child: where it listens and how much CPU it has used."""

    process: asyncio.subprocess.Process
    host: str
    port: int

    @property
    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.process.pid)

    async def settle(self, max_seconds: float) -> float:
        """Wait until the broker is nearly idle (its store warms segments in the background
        after start-up, its flusher trails a burst of writes); returns the seconds waited."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < max_seconds:
            before = self.cpu_seconds
            await asyncio.sleep(SETTLE_WINDOW_S)
            after = self.cpu_seconds
            if before is None or after is None or after - before < SETTLE_BUSY * SETTLE_WINDOW_S:
                break
        return loop.time() - started

    def check_alive(self) -> None:
        if self.process.returncode is not None:
            raise BrokerProcessError(
                f"the broker process exited with status {self.process.returncode}")


def broker_command(backend: str, data: Path, host: str) -> list[str]:
    return [sys.executable, "-m", "evq.cli", "--log-level", "warning", "broker",
            "--backend", backend, "--data", str(data), "--host", host, "--port", "0"]


@contextlib.asynccontextmanager
async def broker_process(
    backend: str, data: Path, *, host: str = "127.0.0.1",
    settings: Mapping[str, object] | None = None,
) -> AsyncIterator[BrokerProcess]:
    """Start a broker child on a free port with its store in ``data`` and stop it on exit.

    ``settings`` are extra broker settings by evq name (``commitlog_segment_size`` ...),
    handed over as ``EVQ_*`` environment variables.  The child's log goes to
    ``data/../broker.log``; its last lines are quoted when it fails to start.
    """
    env = dict(os.environ)
    env.update({f"EVQ_{name.upper()}": str(value) for name, value in (settings or {}).items()})
    log_path = data.parent / f"{data.name}.log"
    with log_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *broker_command(backend, data, host), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    try:
        address = await _await_listening(process, log_path)
        log.info("bench_broker_started", pid=process.pid, address=f"{address[0]}:{address[1]}")
        yield BrokerProcess(process, *address)
    finally:
        await stop_process(process)


async def _await_listening(
    process: asyncio.subprocess.Process, log_path: Path
) -> tuple[str, int]:
    assert process.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := await process.stdout.readline():
                address = listening_address(line.decode(errors="replace"))
                if address is not None:
                    return address
            await process.wait()
    except TimeoutError:
        raise BrokerProcessError(
            f"the broker did not listen within {START_TIMEOUT_S:g} s{_tail(log_path)}"
        ) from None
    raise BrokerProcessError(
        f"the broker exited with status {process.returncode} before listening{_tail(log_path)}")


def _tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return ": " + " | ".join(lines[-STDERR_TAIL_LINES:]) if lines else ""


async def stop_process(process: asyncio.subprocess.Process) -> None:
    """SIGTERM (a graceful shutdown that flushes the store), SIGKILL if that hangs."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await process.wait()
        except TimeoutError:
            log.warning("bench_broker_killed", pid=process.pid, after_s=STOP_TIMEOUT_S)
            process.kill()
            await process.wait()
    if process.returncode not in (0, -signal.SIGTERM):
        log.warning("bench_broker_exit_status", pid=process.pid, status=process.returncode)
