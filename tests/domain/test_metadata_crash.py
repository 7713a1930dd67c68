"""SIGKILL a broker while it changes its config and offsets; the reopened broker must hold
exactly what it acknowledged (plus at most the one change in flight) and offsets no older than
the last acknowledged snapshot."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from evq.backends.config import StoreConfig
from evq.backends.registry import open_log
from evq.domain.broker import Broker, tags_code_fn
from evq.domain.clock import SYSTEM_CLOCK
from evq.domain.delay import DelayLevels
from evq.meta.sql import SqlMetadataStore

ROUNDS = 8
REPO_ROOT = Path(__file__).resolve().parents[2]


def reopen(root: Path) -> Broker:
    log = open_log("mmap", root / "store", StoreConfig(commitlog_segment_size=256 * 1024),
                   clock=SYSTEM_CLOCK, tags_code_fn=tags_code_fn(DelayLevels.parse()),
                   background=False)
    return Broker(log, SqlMetadataStore.in_dir(root / "config"), clock=SYSTEM_CLOCK)


def run_round(root: Path, round_no: int, rng: random.Random) -> list[list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.domain.meta_child", str(root), str(round_no)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(rng.uniform(0.05, 0.5))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    lines = [line.split() for line in out.splitlines()]
    return lines[:-1] if out and not out.endswith("\n") else lines  # drop a torn last line


def test_acknowledged_metadata_survives_sigkill(tmp_path: Path) -> None:
    seed = int(os.environ.get("EVQ_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    topics: dict[str, int] = {}
    snapshots: dict[tuple[str, str, int], int] = {}
    for round_no in range(ROUNDS):
        acked = run_round(tmp_path, round_no, rng)
        in_flight = f"R{round_no}_{sum(1 for a in acked if a[0] == 'TOPIC') + 1}"
        for ack in acked:
            if ack[0] == "TOPIC":
                topics[ack[1]] = int(ack[2])
            elif ack[0] == "DELETED":
                del topics[ack[1]]
            else:
                snapshots[(ack[1], ack[2], int(ack[3]))] = int(ack[4])
        broker = reopen(tmp_path)
        try:
            present = {name: c.read_queue_nums for name, c in broker.topics().items()
                       if re.fullmatch(r"R\d+_\d+", name)}
            extra = present.keys() - topics.keys()
            assert extra <= {in_flight}, (seed, extra)
            for name, queues in topics.items():
                # a delete in flight may have landed; anything acknowledged must be there
                if name in present or not _delete_in_flight(acked, name):
                    assert present.get(name) == queues, (seed, round_no, name)
            for key, offset in snapshots.items():
                assert broker.query_offset(*key) >= offset, (seed, key)
            topics = {n: q for n, q in topics.items() if n in present}
            topics.update({n: present[n] for n in extra})
        finally:
            broker.close()
            broker.log.close()


def _delete_in_flight(acked: list[list[str]], name: str) -> bool:
    """The child deletes R_{n-1} right after acknowledging topic n; if it died in between,
    the delete may or may not have been stored."""
    return bool(acked) and acked[-1][0] == "TOPIC" and int(acked[-1][1].split("_")[1]) == int(
        name.split("_")[1]) + 1 and int(acked[-1][1].split("_")[1]) % 3 == 0
