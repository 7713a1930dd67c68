"""A name server with an ACL file: only an admin account's signature changes its tables.

Strangers, non-admin accounts and wrong secrets are refused NO_PERMISSION with the reason and
change nothing; lookups stay open; the file is re-read when it changes, and a broken edit
leaves the accounts in force as they were.  Real sockets, a real file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.acl.signature import Credentials
from evq.domain.codes import ResponseCode
from evq.net.acl_check import RefusalLog
from evq.net.codes import RequestCode
from evq.net.namesrv import NameServer
from evq.net.protocol import RemotingCommand
from evq.net.registration import BrokerRegistrar
from evq.net.security import ClientSecurity
from evq.net.transport import RemotingClient
from tests.net.harness import HOST, TIMEOUT
from tests.net.test_namesrv import MASTER, T, registrar

ADMIN = Credentials("adminKey1", "adminSecret1")
USER = Credentials("userKey01", "userSecret1")
ACL = """accounts:
  - accessKey: adminKey1
    secretKey: adminSecret1
    admin: true
  - accessKey: userKey01
    secretKey: userSecret1
    admin: {user_admin}
    defaultTopicPerm: PUB|SUB
"""


def acl_text(*, user_admin: bool = False) -> str:
    return ACL.format(user_admin=str(user_admin).lower())


@contextlib.asynccontextmanager
async def protected(tmp_path: Path) -> AsyncIterator[tuple[NameServer, Path]]:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(acl_text())
    async with NameServer(HOST, 0, acl_file=acl) as server:
        yield server, acl


@contextlib.asynccontextmanager
async def client(server: NameServer, who: Credentials | None) -> AsyncIterator[RemotingClient]:
    security = ClientSecurity(credentials=who) if who is not None else None
    async with RemotingClient(HOST, server.port, security=security) as c:
        yield c


async def ask(c: RemotingClient, code: int, fields: Mapping[str, object]) -> RemotingCommand:
    return await c.invoke(RemotingCommand.request(code, fields), TIMEOUT)


WRITES: list[tuple[int, dict[str, object]]] = [
    (RequestCode.UNREGISTER_BROKER, MASTER.unregister_fields()),
    (RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "x:1"}),
    (RequestCode.DELETE_KV_CONFIG, {"namespace": "NS", "key": "k"}),
    (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
]


async def registered(server: NameServer) -> BrokerRegistrar:
    broker = registrar([server], security=ClientSecurity(credentials=ADMIN))
    await broker.start()
    async with asyncio.timeout(TIMEOUT):
        while server.routes.route("T") is None:  # waits for the admin's registration
            await asyncio.sleep(0.005)
    return broker


@pytest.mark.parametrize(("who", "reason"), [
    (None, "No accessKey is configured"),
    (USER, "accessKey=userKey01 is not"),
    (Credentials("adminKey1", "wrongSecret"), "Check signature failed for accessKey=adminKey1"),
    (Credentials("nobody-at-all", "whatever1"), "No acl config for nobody-at-all"),
])
async def test_writes_need_an_admin_signature(tmp_path: Path, who: Credentials | None,
                                              reason: str) -> None:
    async with protected(tmp_path) as (server, _acl):
        broker = await registered(server)
        try:
            async with client(server, who) as c:
                for code, fields in WRITES:
                    answer = await ask(c, code, fields)
                    assert answer.code == ResponseCode.NO_PERMISSION, (code, answer.remark)
                    assert reason in (answer.remark or ""), answer.remark
                register = await c.invoke(RemotingCommand.request(
                    RequestCode.REGISTER_BROKER, MASTER.register_fields()), TIMEOUT)
                assert register.code == ResponseCode.NO_PERMISSION
                # Nothing changed, and reads stay open to anyone.
                assert server.routes.route("T") is not None
                assert server.routes.kv_list("ORDER_TOPIC_CONFIG") is None
                cluster = await ask(c, RequestCode.GET_BROKER_CLUSTER_INFO, {})
                assert cluster.code == ResponseCode.SUCCESS and b"broker-a" in cluster.body
                route = await ask(c, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": T.topic_name})
                assert route.code == ResponseCode.SUCCESS
        finally:
            await broker.shutdown()


async def test_an_admin_may_write(tmp_path: Path) -> None:
    async with protected(tmp_path) as (server, _acl), client(server, ADMIN) as c:
        broker = await registered(server)
        try:
            for code, fields in WRITES:
                answer = await ask(c, code, fields)
                assert answer.code == ResponseCode.SUCCESS, (code, answer.remark)
            assert server.routes.route("T") is None
        finally:
            await broker.shutdown()


async def test_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    async with protected(tmp_path) as (server, acl), client(server, USER) as c:
        put = (RequestCode.PUT_KV_CONFIG, {"namespace": "NS", "key": "k", "value": "v"})
        assert (await ask(c, *put)).code == ResponseCode.NO_PERMISSION
        acl.write_text(acl_text(user_admin=True))
        async with asyncio.timeout(TIMEOUT):  # waits for the watcher to apply the edit
            while (await ask(c, *put)).code != ResponseCode.SUCCESS:
                await asyncio.sleep(0.05)
        acl.write_text("accounts: [this is not: valid")
        assert server.acl is not None
        assert not await server.acl.reload_if_changed()  # refused: the last good file stays
        assert (await ask(c, *put)).code == ResponseCode.SUCCESS


async def test_a_missing_acl_file_stops_the_start(tmp_path: Path) -> None:
    from evq.acl.accounts import AclFileError

    with pytest.raises(AclFileError, match="cannot read ACL file"):
        async with NameServer(HOST, 0, acl_file=tmp_path / "absent.yml"):
            pass


def test_every_name_server_write_is_an_admin_code() -> None:
    """The name server checks its writes with the broker's verifier, which asks for an admin
    only on admin codes: a write code missing there would let any signed account through."""
    from evq.acl.resources import ADMIN_CODES
    from evq.net.namesrv import WRITE_CODES

    assert WRITE_CODES <= ADMIN_CODES


async def test_a_client_refused_in_a_loop_costs_ten_log_lines_and_a_total(tmp_path: Path
                                                                         ) -> None:
    """Refusals are logged a bounded number of times per connection, then once as a total
    when it closes: a client retrying a forbidden request cannot fill the server's disk."""
    limit = RefusalLog.LOGGED_PER_CONNECTION
    async with protected(tmp_path) as (server, _acl):
        with capture_logs() as logs:
            async with client(server, None) as c:
                for _ in range(5 * limit):
                    answer = await ask(c, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"})
                    assert answer.code == ResponseCode.NO_PERMISSION
            async with asyncio.timeout(TIMEOUT):
                while not any(e["event"] == "namesrv_write_refused_total" for e in logs):
                    await asyncio.sleep(0.01)  # the server sees the close
    each = [e for e in logs if e["event"] == "namesrv_write_refused"]
    total = [e for e in logs if e["event"] == "namesrv_write_refused_total"]
    assert [e["refusals"] for e in each] == list(range(1, limit + 1))
    assert [(e["refusals"], e["logged"]) for e in total] == [(5 * limit, limit)]
