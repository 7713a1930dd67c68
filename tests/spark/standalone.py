"""A Spark standalone cluster in processes: a master and workers, each its own JVM started
with the ``spark-class`` that ships in the pyspark package, on 127.0.0.1 and free ports, as a
Spark user deploys one.  Executors are JVMs the workers start, and they start their own
Python workers: a test on this cluster proves the connector from processes that share
nothing with the driver but the network and the disk.

A worker can be killed as if its machine died (itself, its executor and every Python worker
of its session, SIGKILL).  Where the kernel lets an unprivileged process have its own mount
namespace, the workers run in one with :attr:`Standalone.hidden` covered by an empty tmpfs:
a directory the driver reads and no executor sees, as on a cluster without shared storage.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pyspark

from tests.processes import REPO_ROOT

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_WAIT_S = 90.0
"""JVMs start slowly on two shared cores; a healthy cluster is up in a few seconds."""
KILL_WAIT_S = 30.0
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "640m"
"""Room for one executor of 512m (Spark refuses executors under 450m)."""
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI = re.compile(r"MasterWebUI: Bound .* started at http://\S+?:(\d+)")
PROPERTIES = "spark.master.rest.enabled false\n"
"""The master's REST submission server would take the fixed port 6066."""
HIDE = 'mount -t tmpfs evq-hidden "$0" && exec "$@"'


def _session_of(pid: int) -> int | None:
    """The session of a running process (None once it is gone or only a zombie: a container's
    first process may never reap the orphans of a killed worker)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, _, _, session = stat.rpartition(")")[2].split()[:4]  # (the name may hold spaces)
    return None if state == "Z" else int(session)


@attrs.define(eq=False)
class Daemon:
    """A master or worker JVM, in a session of its own, logging to ``log`` (compared by
    identity: one process is one daemon)."""

    proc: subprocess.Popen[bytes]
    log: Path
    work: Path | None = None
    """A worker's work directory: its executors (and their Python workers) run in a
    directory below it, so a task's working directory says which worker ran it."""

    def session(self) -> list[int]:
        """Every live process of this daemon's session: itself, a worker's executor JVM, the
        PySpark daemon (which moves to a process group of its own, not out of the session)
        and its Python workers, even once the worker is gone and they are orphans (the kernel
        reuses no pid a live session is named by)."""
        pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
        return [p for p in pids if _session_of(p) == self.proc.pid]

    def kill(self) -> None:
        """SIGKILL this process and everything it started, as if its machine lost power, and
        return once none of them runs: a process is still listed while it dies, and one may
        fork between the listing and the kill, so the session is swept until it is empty."""
        deadline = time.monotonic() + KILL_WAIT_S
        while alive := self.session():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.log.stem}: {alive} outlived SIGKILL for "
                                     f"{KILL_WAIT_S:.0f} s")
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)  # the kernel's teardown of what was just killed
        self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@attrs.frozen
class Standalone:
    url: str
    """``spark://127.0.0.1:port``, the master for SparkSession.builder."""
    ui_port: int
    master: Daemon
    workers: tuple[Daemon, ...]
    hidden: Path | None
    """A directory the workers see empty (None where mount namespaces are not allowed)."""

    def state(self) -> dict[str, object]:
        """The master's own account of the cluster (its web UI's JSON)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)  # type: ignore[no-any-return]

    def worker_of(self, cwd: str) -> Daemon | None:
        """The worker whose executor ran in ``cwd`` (a task's working directory)."""
        return next((w for w in self.workers
                     if w.work is not None and Path(cwd).is_relative_to(w.work)), None)


def spark_env() -> dict[str, str]:
    """The environment of the daemons, which their executors and Python workers inherit:
    this interpreter, this checkout importable, loopback only."""
    path = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY, "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def namespaces_allowed(probe: Path) -> bool:
    """Whether this kernel lets us mount a tmpfs in a user + mount namespace of our own."""
    if shutil.which("unshare") is None:
        return False
    probe.mkdir(exist_ok=True)
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           HIDE, str(probe), "true"], capture_output=True, check=False)
    return done.returncode == 0


def _start(cls: str, args: list[str], log: Path, *, hidden: Path | None = None,
           work: Path | None = None) -> Daemon:
    command = [str(SPARK_HOME / "bin" / "spark-class"), f"org.apache.spark.deploy.{cls}", *args]
    if hidden is not None:
        command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", HIDE,
                   str(hidden), *command]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=spark_env(),
                                start_new_session=True)
    return Daemon(proc, log, work)


def _wait(what: str, daemons: list[Daemon], ready: Callable[[], bool]) -> None:
    """Poll ``ready`` until the deadline; a daemon that exits meanwhile fails it at once."""
    deadline = time.monotonic() + START_WAIT_S
    while not ready():
        for daemon in daemons:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"waiting for {what}, {daemon.log.name} exited "
                                   f"({daemon.proc.returncode}):\n{daemon.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no sign of {what} within {START_WAIT_S:.0f} s:\n"
                                 + "\n".join(d.tail() for d in daemons))
        time.sleep(0.1)


@contextlib.contextmanager
def running_standalone(root: Path, workers: int = 2) -> Iterator[Standalone]:
    """A master and ``workers`` workers of one core each; returns once the master lists every
    worker ALIVE, kills them all on the way out."""
    conf = root / "spark-daemons.conf"
    conf.write_text(PROPERTIES)
    probe = root / "hidden-from-executors"
    hidden = probe if namespaces_allowed(probe) else None
    daemons: list[Daemon] = []
    try:
        master = _start("master.Master", ["--host", "127.0.0.1", "--port", "0",
                                          "--webui-port", "0", "--properties-file", str(conf)],
                        root / "master.log")
        daemons.append(master)
        found: dict[str, str] = {}

        def announced() -> bool:
            text = master.log.read_text(errors="replace")
            for key, pattern in (("url", MASTER_URL), ("ui", MASTER_UI)):
                if m := pattern.search(text):
                    found[key] = m[1]
            return len(found) == 2

        _wait("the Spark master announcing its address", daemons, announced)
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir()
            daemons.append(_start(
                "worker.Worker", [found["url"], "--host", "127.0.0.1", "--port", "0",
                                  "--webui-port", "0", "--cores", "1", "--memory",
                                  WORKER_MEMORY, "--work-dir", str(work),
                                  "--properties-file", str(conf)],
                root / f"worker-{i}.log", hidden=hidden, work=work))
        cluster = Standalone(found["url"], int(found["ui"]), master, tuple(daemons[1:]), hidden)

        def registered() -> bool:
            return cluster.state().get("aliveworkers") == workers

        _wait(f"the Spark master listing {workers} workers ALIVE", daemons, registered)
        yield cluster
    finally:
        for daemon in reversed(daemons):
            daemon.kill()
