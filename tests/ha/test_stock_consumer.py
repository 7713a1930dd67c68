"""The stock C++ client (PyPI ``rocketmq``) consumer through a master kill: it follows the
routes and ``suggestWhichBrokerId`` and keeps consuming once its broker group is back."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import start_stock, stock
from tests.ha.group import broker_group, wait_caught_up

TOPIC = "HaStock"
PER_PHASE = 10
WAIT_S = 60.0


def lines_of(proc: Any) -> tuple[list[dict[str, Any]], threading.Thread]:
    """The driver's JSON lines, collected as they come by a reader thread (which ends when
    the driver does)."""
    out: list[dict[str, Any]] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                out.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return out, reader


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_stock_consumer_keeps_consuming_through_a_master_kill(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave()
        first = stock("produce", group.namesrv, TOPIC, "sync", str(PER_PHASE))
        assert [s["status"] for s in first] == ["OK"] * PER_PHASE
        proc = start_stock("consume", group.namesrv, TOPIC, "G_ha_stock", "clustering", "0",
                           "0", "90")
        lines, reader = lines_of(proc)
        try:

            def consumed() -> set[tuple[int, int]]:
                return {(m["queue"], m["offset"]) for m in list(lines) if "seq" in m}

            wait_for(lambda: len(consumed()) >= PER_PHASE, "the first messages")
            wait_caught_up(group)
            group.kill_master()
            group.start_master("ASYNC_MASTER")
            second = stock("produce", group.namesrv, TOPIC, "sync", str(PER_PHASE))
            assert [s["status"] for s in second] == ["OK"] * PER_PHASE
            wait_for(lambda: len(consumed()) >= 2 * PER_PHASE, "the messages after the kill")
            assert all(m["body_ok"] for m in lines if "seq" in m)
        finally:
            proc.kill()
            proc.wait(10)
            reader.join(10)
            proc.stdout.close()  # type: ignore[union-attr]
