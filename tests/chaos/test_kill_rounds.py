"""SIGKILL rounds over the wire with the stock C++ producer: nothing acknowledged is lost.

One stock producer (``tests.compat.stock_client produce-forever``) sends synchronously the
whole time, through every crash; the broker under it is killed with SIGKILL as soon as a few
more of its sends were acknowledged (every fifth round stopped with SIGTERM instead: a restart
under load), then restarted on the same port and data directory.
Afterwards every message the producer was told SEND_OK is in the store, at the queue offset it
was told, and the duplicates (sends the client retried after a lost answer) are counted and
reported.  Two deployments: one broker under SYNC_FLUSH, and a SYNC_MASTER (SYNC_FLUSH) with a
slave, where the slave must hold every acknowledged message too.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from evq.domain.message import Message, Prop
from tests.chaos.conftest import Report
from tests.ha.group import Group, broker_group, opened_store, queue_messages, wait_caught_up
from tests.processes import REPO_ROOT, python_env

TOPIC = "ChaosKill"
ACKS_PER_ROUND = 5
GRACEFUL_EVERY = 5  # every fifth round restarts the broker with SIGTERM, under the same load
SEND_OK = "OK"  # the wrapper's name for SendStatus SEND_OK
ACK_WAIT_S = 60.0
CONFIG = ("mappedFileSizeCommitLog=16777216\nwarmSegments=false\nslaveReadEnable=true\n"
          "flushDiskType=SYNC_FLUSH\n")


@attrs.define
class StockProducer:
    """The stock producer's answers as they arrive, read by a thread (the test's own waits
    poll them with a deadline)."""

    proc: subprocess.Popen[str]
    lines: list[dict[str, Any]] = attrs.field(factory=list)
    reader: threading.Thread | None = None

    def start_reading(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def stop(self) -> None:
        """Kill it and take the lines it wrote before it died."""
        self.proc.kill()
        self.proc.wait(10)
        if self.reader is not None:
            self.reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def acks(self) -> list[dict[str, Any]]:
        return [a for a in list(self.lines) if a["status"] == SEND_OK]

    def wait_acks(self, count: int, what: str) -> None:
        deadline = time.monotonic() + ACK_WAIT_S
        while len(self.acks()) < count:
            if self.proc.poll() is not None:
                raise AssertionError(f"the stock producer exited ({self.proc.returncode}) "
                                     f"while waiting for {what}")
            if time.monotonic() > deadline:
                failures = [x for x in self.lines[-3:] if x["status"] != SEND_OK]
                raise AssertionError(f"no {count} acknowledgements within {ACK_WAIT_S:g} s "
                                     f"({what}); last failures: {failures}")
            time.sleep(0.01)


@attrs.frozen
class Outcome:
    acked: int
    lost: list[str]
    misplaced: list[str]
    duplicates: int


def check_store(path: Path, acks: list[dict[str, Any]]) -> Outcome:
    """Every acknowledged message in the store at its queue offset; duplicates counted."""
    with opened_store(path) as log:
        stored: list[Message] = [m for ms in queue_messages(log, TOPIC).values() for m in ms]
    by_uniq = collections.defaultdict(list)
    for m in stored:
        by_uniq[m.properties.get(Prop.UNIQ_KEY, "")].append(m)
    lost = [a["seq"] for a in acks if a["msg_id"] not in by_uniq]
    misplaced = [a["seq"] for a in acks if a["msg_id"] in by_uniq
                 and a["offset"] not in {m.queue_offset for m in by_uniq[a["msg_id"]]}]
    seqs = collections.Counter(m.properties.get("seq") for m in stored)
    return Outcome(len(acks), lost, misplaced, sum(n - 1 for n in seqs.values() if n > 1))


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    (tmp_path / "broker.conf").write_text(CONFIG)
    with broker_group(tmp_path) as g:
        yield g


def stock_producer(namesrv: str) -> StockProducer:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.compat.stock_client", "produce-forever", namesrv, TOPIC,
         "chaos"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=REPO_ROOT, env=python_env())
    producer = StockProducer(proc)
    producer.start_reading()
    return producer


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"],
                         ids=["sync-flush", "sync-master-and-slave"])
def test_sigkill_rounds_lose_no_acknowledged_message(group: Group, role: str, kill_rounds: int,
                                                      report: Report) -> None:
    group.start_master(role)
    if role == "SYNC_MASTER":
        group.start_slave()
    producer = stock_producer(group.namesrv)
    try:
        for round_ in range(kill_rounds):
            producer.wait_acks(len(producer.acks()) + ACKS_PER_ROUND,
                               f"round {round_} of {kill_rounds}")
            if round_ % GRACEFUL_EVERY == GRACEFUL_EVERY - 1:
                assert group.master is not None and group.master.stop() == 0  # SIGTERM
            else:
                group.kill_master()
            group.start_master(role)
        producer.wait_acks(len(producer.acks()) + ACKS_PER_ROUND, "after the last round")
    finally:
        producer.stop()
    acks = producer.acks()
    outcomes = {}
    if role == "SYNC_MASTER":
        wait_caught_up(group)
        assert group.slave is not None and group.slave.stop() == 0
        outcomes["slave"] = check_store(group.root / "slave", acks)
    assert group.master is not None and group.master.stop() == 0
    outcomes["master"] = check_store(group.root / "master", acks)
    for where, o in outcomes.items():
        report(where=where, kill_rounds=kill_rounds, acknowledged=o.acked, lost=len(o.lost),
               misplaced=len(o.misplaced), duplicates=o.duplicates,
               failed_sends=sum(1 for x in producer.lines if x["status"] != SEND_OK))
        assert o.lost == [], f"{where}: acknowledged and lost: {o.lost[:20]}"
        assert o.misplaced == [], f"{where}: not at the acknowledged offset: {o.misplaced[:20]}"
    assert len(acks) >= ACKS_PER_ROUND * (kill_rounds + 1)
