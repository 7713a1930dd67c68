"""``evq broker`` and ``evq namesrv`` as real processes: how they refuse to start, and how they
stop.  A refusal is one line on stderr and a non-zero exit; SIGTERM is a clean shutdown that
leaves a store the next start opens without abnormal recovery."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from evq.domain.codes import ResponseCode
from evq.net.codes import RequestCode
from evq.net.protocol import FrameDecoder, RemotingCommand
from tests.processes import (
    EXIT_TIMEOUT,
    REPO_ROOT,
    port_of,
    python_env,
    run_evq,
    running_evq,
)

QUIET = ("--log-level", "warning")  # logs only what is wrong: stderr is the refusal alone
TIMEOUT = 5.0


def ask(address: str, cmd: RemotingCommand) -> RemotingCommand:
    """One request over a plain socket, as a client that knows nothing of evq would send it."""
    with socket.create_connection(("127.0.0.1", port_of(address)), TIMEOUT) as sock:
        sock.sendall(cmd.encode())
        decoder = FrameDecoder()
        while (answer := decoder.next_command()) is None:
            data = sock.recv(1 << 16)
            assert data, "closed without an answer"
            decoder.feed(data)
    return answer


def max_offset(address: str, topic: str) -> int:
    answer = ask(address, RemotingCommand(code=RequestCode.GET_MAX_OFFSET, opaque=1,
                                          ext_fields={"topic": topic, "queueId": 0}))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return int(answer.ext_fields["offset"])


def send_one(address: str, topic: str) -> None:
    answer = ask(address, RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=1, ext_fields={
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0,
        "bornTimestamp": 1_700_000_000_000}, body=b"kept across a restart"))
    assert answer.code == ResponseCode.SUCCESS, answer.remark


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("evq: error: "), stderr
    return lines[0]


def test_namesrv_refuses_a_port_in_use_with_one_line() -> None:
    with running_evq(*QUIET, "namesrv", "--port", "0", servers=1) as first:
        port = port_of(first.addresses["namesrv"])
        second = run_evq(*QUIET, "namesrv", "--port", str(port))
        assert second.returncode == 1
        assert one_error_line(second.stderr) == (
            f"evq: error: cannot listen on 127.0.0.1:{port}: Address already in use")
        assert second.stdout == ""
        assert first.alive()
        assert first.stop() == 0


def test_broker_refuses_a_port_in_use_before_touching_its_data_dir(tmp_path: Path) -> None:
    with running_evq(*QUIET, "broker", "--port", "0", "--data", str(tmp_path / "first"),
                     servers=1) as first:
        port = port_of(first.addresses["broker"])
        second = run_evq(*QUIET, "broker", "--port", str(port), "--data",
                         str(tmp_path / "second"))
        assert second.returncode == 1
        assert one_error_line(second.stderr) == (
            f"evq: error: cannot listen on 127.0.0.1:{port}: Address already in use")
        assert not (tmp_path / "second").exists()
        assert first.stop() == 0


def test_a_sync_master_names_its_ha_port_when_that_one_is_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ha_port = taken.getsockname()[1]
        broker = run_evq(*QUIET, "broker", "--port", "0", "--role", "SYNC_MASTER",
                         "--ha-port", str(ha_port), "--data", str(tmp_path / "data"))
    assert broker.returncode == 1
    assert one_error_line(broker.stderr) == (
        f"evq: error: cannot listen on 127.0.0.1:{ha_port}: Address already in use")


def test_broker_refuses_a_data_dir_another_broker_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_evq(*QUIET, "broker", "--port", "0", "--data", str(data), servers=1) as first:
        second = run_evq(*QUIET, "broker", "--port", "0", "--data", str(data))
        assert second.returncode == 1
        assert one_error_line(second.stderr) == (
            f"evq: error: {data} is in use by another process")
        assert (data / "abort").exists()  # the running broker's marker is left alone
        send_one(first.addresses["broker"], "T")  # and it still serves
        assert first.stop() == 0


@pytest.mark.parametrize("backend", ["mmap", "lmdb", "rocks"])
def test_broker_says_it_cannot_open_its_store_rather_than_its_port(tmp_path: Path,
                                                                   backend: str) -> None:
    # A data dir under a regular file fails to open even for root (chmod would not).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    data = blocker / "data"
    refused = run_evq(*QUIET, "broker", "--port", "0", "--backend", backend,
                      "--data", str(data))
    assert refused.returncode == 1
    assert one_error_line(refused.stderr) == (
        f"evq: error: cannot open the store at {data}: Not a directory")
    assert refused.stdout == ""


def test_a_slave_without_a_broker_id_is_a_usage_error(tmp_path: Path) -> None:
    refused = run_evq(*QUIET, "broker", "--role", "SLAVE", "--port", "0", "--data",
                      str(tmp_path / "data"))
    assert refused.returncode == 2
    assert one_error_line(refused.stderr) == (
        "evq: error: a SLAVE needs a brokerId greater than 0")
    assert not (tmp_path / "data").exists()


def test_sigterm_shuts_the_broker_down_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_evq(*QUIET, "broker", "--port", "0", "--data", str(data), servers=1) as evq:
        address = evq.addresses["broker"]
        send_one(address, "T")
        assert (data / "abort").exists()  # a running store is marked...
        assert evq.stop() == 0
    assert not (data / "abort").exists()  # ...and a cleanly closed one is not

    log = tmp_path / "restart.log"
    with log.open("w") as stderr, running_evq("--log-level", "info", "broker", "--port", "0",
                                              "--data", str(data), servers=1,
                                              stderr=stderr) as again:
        assert max_offset(again.addresses["broker"], "T") == 1
        assert again.stop() == 0
    (recovered,) = [record for line in log.read_text().splitlines()
                    if (record := json.loads(line))["event"] == "store_recovered"]
    assert recovered["abnormal"] is False


def test_python_dash_m_evq_is_the_evq_command() -> None:
    """``python -m evq`` runs the same command as the ``evq`` script (a venv whose scripts
    are not on PATH, or a checkout run without installing)."""
    proc = subprocess.run([sys.executable, "-m", "evq", "admin", "--help"], capture_output=True,
                          text=True, cwd=REPO_ROOT, env=python_env(), timeout=EXIT_TIMEOUT,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: evq admin")
