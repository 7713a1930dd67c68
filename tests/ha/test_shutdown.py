"""A master stopped with SIGTERM while a slave streams from it, in real processes: a clean
exit (status 0) and nothing on stderr that looks like a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.ha.group import broker_group, produce_numbered, wait_caught_up


def test_sigterm_stops_a_master_with_a_slave_attached_cleanly(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        master = group.start_master("ASYNC_MASTER")
        group.start_slave()
        asyncio.run(produce_numbered(group.namesrv, "HaStop", "m", 3))
        assert wait_caught_up(group) > 0  # the slave's session is streaming
        assert master.stop() == 0
        assert "Traceback" not in group.master_log(), group.master_log()
        assert "CancelledError" not in group.master_log(), group.master_log()
        assert group.slave is not None and group.slave.stop() == 0, group.slave_log()
        assert "Traceback" not in group.slave_log(), group.slave_log()
