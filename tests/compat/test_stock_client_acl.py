"""The stock C++ client (``set_session_credentials``) against a broker with ACL on: its
signature is RocketMQ's, checked by evq's verifier, so sends and a push consumer work with
the right secret and are refused with a wrong one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import Driver, Served, reap_stock_clients, stock
from tests.processes import REPO_ROOT, python_env, running_evq, wait_registered
from tests.waiting import wait_for

ACCOUNTS = """\
accounts:
  - accessKey: evq-broker
    secretKey: evq-broker-secret
    admin: true
  - accessKey: cppclient
    secretKey: cpp-client-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [T_acl=PUB|SUB]
    groupPerms: [G_acl=SUB]
"""
RIGHT = {"STOCK_ACCESS_KEY": "cppclient", "STOCK_SECRET_KEY": "cpp-client-secret"}
WRONG = {"STOCK_ACCESS_KEY": "cppclient", "STOCK_SECRET_KEY": "not-the-secret"}


@pytest.fixture
def acl_served(tmp_path: Path) -> Iterator[Served]:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACCOUNTS)
    with (tmp_path / "serve.log").open("w") as log, running_evq(
            "--log-level", "info", "serve", "--port", "0", "--namesrv-port", "0",
            "--data", str(tmp_path / "data"), "--acl", "--acl-file", str(acl_file),
            "--access-key", "evq-broker", "--secret-key", "evq-broker-secret",
            servers=2, stderr=log) as running:
        wait_registered(running.addresses["namesrv"], running.addresses["broker"])
        yield Served(running.addresses["namesrv"], running.addresses["broker"], running.proc)
        reap_stock_clients()
        assert running.stop() == 0


def test_stock_producer_and_push_consumer_with_credentials(acl_served: Served) -> None:
    sent = stock("produce", acl_served.namesrv, "T_acl", "sync", "10", env=RIGHT)
    assert [s["status"] for s in sent] == ["OK"] * 10
    consumer = Driver("consume", acl_served.namesrv, "T_acl", "G_acl", "clustering", "0", "0",
                      "120", env=RIGHT)
    wait_for("every message", lambda: consumer.seqs() == set(range(10)), within=60)
    assert all(m["body_ok"] for m in consumer.stop() if "seq" in m)


@pytest.mark.parametrize(("env", "why"), [
    (WRONG, "Check signature failed for accessKey=cppclient"),
    ({}, "No acl config for "),  # without credentials the C++ client sends AccessKey ""
])
def test_stock_producer_with_a_wrong_or_no_secret_is_refused(acl_served: Served,
                                                              env: dict[str, str], why: str,
                                                              tmp_path: Path) -> None:
    stock("produce", acl_served.namesrv, "T_acl", "sync", "1", env=RIGHT)  # routes the topic
    out = subprocess.run(
        [sys.executable, "-m", "tests.compat.stock_client", "produce", acl_served.namesrv,
         "T_acl", "sync", "1"], capture_output=True, text=True, cwd=REPO_ROOT,
        env={**python_env(), **env}, timeout=60, check=False)
    assert '"status"' not in out.stdout and '{"done": true}' not in out.stdout, out.stdout
    # The C++ client reports its own words ("No route info...") once its retries are spent;
    # the broker's log says why it refused.
    refusals = [line for line in (tmp_path / "serve.log").read_text().splitlines()
                if "acl_refused" in line]
    assert any(why in line and '"code": 10,' in line for line in refusals), refusals[-5:]
