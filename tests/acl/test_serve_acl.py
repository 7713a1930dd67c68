"""``evq serve --acl``: the one-process deployment guards its name server with the broker's
account file, so the broker must bring an admin account of that file to register."""

from __future__ import annotations

from pathlib import Path

from tests.acl.test_secured_cluster import ACL, ADMIN, USER, env_of
from tests.processes import run_evq, running_evq, wait_registered


def test_serve_with_acl_needs_the_brokers_own_admin_account(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    out = run_evq("serve", "--port", "0", "--namesrv-port", "0", "--data", str(tmp_path / "d"),
                  "--acl", "--acl-file", str(acl))
    assert out.returncode == 2
    assert "--access-key and --secret-key" in out.stderr and str(acl) in out.stderr


def test_serve_with_acl_checks_clients_and_registrations(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(tmp_path / "d"), "--acl", "--acl-file", str(acl),
                     "--access-key", ADMIN.access_key, "--secret-key", ADMIN.secret_key,
                     servers=2) as served:
        namesrv = served.addresses["namesrv"]
        wait_registered(namesrv, served.addresses["broker"])  # its signed registration
        sent = run_evq("produce", "-n", namesrv, "-t", "T", stdin="hello\n", env=env_of(USER))
        assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stderr
        refused = run_evq("produce", "-n", namesrv, "-t", "T", stdin="no keys\n")
        assert refused.returncode != 0 and "No accessKey is configured" in refused.stderr
        stranger = run_evq("admin", "deleteTopic", "-n", namesrv, "-t", "T", "-c",
                           "DefaultCluster", env=env_of(USER))
        assert stranger.returncode != 0 and "Need admin permission" in stranger.stderr
        assert served.stop() == 0
