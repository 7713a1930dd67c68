"""Power loss is not SIGKILL: every SYNC_FLUSH acknowledgement must hold with the page cache gone.

A kill test cannot see what a power cut drops (unsynced data, sizes, directory entries): the
page cache survives the process.  So the store runs in a child process
(:mod:`tests.backends.power_child`) under ``strace``, which records every call that creates,
writes, maps or syncs a file, and every acknowledgement the child writes; then
:mod:`tests.backends.sync_trace` replays the trace and checks, at each acknowledgement, that
the file holding the acknowledged data, its size, its directory entry and every directory
created above it had been synced by then.  The child creates the store from nothing, so every
file and directory of it is new to the run: new CommitLog segments, ConsumeQueue and index
directories, the abort marker, the metadata database.  After its last message the child
flushes and acknowledges every file of the mmap store (a flush promises the projections too),
and the test checks that none the store kept was left out.

The tests of the checker itself, including an excerpt of a trace recorded before new files got
their directories synced, are in test_sync_trace.py.

Skipped, with the reason, where strace is not installed or may not trace (a container without
ptrace).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evq.backends.registry import TRAITS
from tests.backends.sync_trace import SYSCALLS, check
from tests.processes import REPO_ROOT, python_env

MESSAGES = 200  # ~6 CommitLog segments, 4 ConsumeQueue files a queue, 2 index files (mmap)
RUN_TIMEOUT_S = 120.0
STRING_BYTES = 256  # strace prints this much of a written buffer: a whole ACK line, not pages


def _strace() -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    probe = subprocess.run([strace, "-f", "-qq", "-e", "trace=none", "true"],
                           capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()}")
    return strace


@pytest.mark.parametrize("backend", sorted(b for b, t in TRAITS.items() if t.persistent))
def test_every_sync_acknowledgement_survives_a_power_cut(tmp_path: Path, backend: str) -> None:
    strace = _strace()
    root = tmp_path.resolve() / "store"  # as strace prints it
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [strace, "-f", "-y", "-qq", "-s", str(STRING_BYTES), "-o", str(trace),
         "-e", "trace=" + ",".join(SYSCALLS),
         sys.executable, "-m", "tests.backends.power_child", backend, str(root), str(MESSAGES)],
        cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, check=False,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}): {proc.stderr[-2000:]}"
    acked = {line.split()[1] for line in proc.stdout.splitlines()}
    if backend == "mmap":  # every file the store kept was acknowledged after its last flush
        kept = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
        assert kept - acked <= {"lock"}, f"never acknowledged: {sorted(kept - acked)}"
        assert any(p.startswith("consumequeue/") for p in acked), sorted(acked)
    acks, violations = check(trace.read_text().splitlines(), str(root))
    assert acks == len(proc.stdout.splitlines()) >= MESSAGES + 2, proc.stdout
    assert not violations, (
        f"{len(violations)} acknowledgements a power cut could break, first ones:\n"
        + "\n".join(str(v).replace(str(root), "<store>") for v in violations[:12])
    )
