"""Client ids are unique by default: within one process and across processes on one host, in
Java's ``ip@instance`` form with ``pid#random`` as the instance."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from evq.admin.operations import Admin
from evq.client.consumer import PushConsumer
from evq.client.producer import Producer
from tests.client.conftest import Served
from tests.client.inbox import Inbox, produce
from tests.processes import REPO_ROOT, python_env

CLIENT_ID = re.compile(r"^(?P<host>[0-9.]+)@(?P<pid>\d+)#(?P<random>[0-9a-f]{8})$")
PRINT_ID = "from evq.client.producer import Producer; print(Producer('PG', 'h:1').client_id)"


async def test_two_consumers_of_one_process_are_two_members(cluster: Served) -> None:
    await produce(cluster.namesrv, "CID", [b"x"])
    members = [PushConsumer("G-cid", cluster.namesrv, listener=Inbox()) for _ in range(2)]
    for c in members:
        c.subscribe("CID")
    async with members[0], members[1], Admin(cluster.namesrv) as admin:
        listed = [c["clientId"] for c in
                  (await admin.consumer_connection("G-cid"))["connectionSet"]]
    assert sorted(listed) == sorted(c.client_id for c in members)
    assert len(set(listed)) == 2
    for cid in listed:
        m = CLIENT_ID.match(cid)
        assert m is not None and int(m["pid"]) == os.getpid(), cid


def test_client_ids_differ_across_processes() -> None:
    ids = [subprocess.run([sys.executable, "-c", PRINT_ID], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=python_env(), check=True).stdout.strip()
           for _ in range(2)]
    matches = [CLIENT_ID.match(i) for i in ids]
    assert all(matches), ids
    assert len({m["pid"] for m in matches if m}) == 2
    assert Producer("PG", "h:1").client_id not in ids
