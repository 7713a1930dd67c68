"""An ACL-enabled deployment in real processes: a name server with the ACL file, a master
with ACL on and its slave, each broker signing with its own admin account.

evq's clients (producer, push and pull consumers, admin) and its commands (``evq produce``,
``evq consume``, ``evq admin``) work with credentials and are refused without; a stranger
cannot change the name server's tables; a slave with the wrong secret is not admitted to the
HA port while the real one replicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from evq.acl.signature import Credentials
from evq.admin.operations import Admin
from evq.client.blocking import SyncProducer, SyncPullConsumer
from evq.client.consumer import ConsumeFrom, ConsumeResult, ConsumerOptions, PushConsumer
from evq.client.errors import ClientError
from evq.client.offsets import max_offset
from evq.client.producer import Producer, SendStatus
from evq.client.pull_consumer import PullConsumer
from evq.client.routes import BrokerPool
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.message import Message, new_message
from evq.domain.queues import MessageQueue
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.transport import RemotingClient, run, split_address
from tests.processes import Running, free_port, run_evq, running_evq, wait_registered
from tests.waiting import wait_for

HOST = "127.0.0.1"
TOPIC = "Secured"
WAIT_S = 30.0
ADMIN = Credentials("evqAdmin", "evqAdminSecret")
USER = Credentials("appUser1", "appUserSecret")
ACL = f"""accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: {USER.access_key}
    secretKey: {USER.secret_key}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""


def signed(who: Credentials) -> ClientSecurity:
    return ClientSecurity(credentials=who)


def env_of(who: Credentials) -> dict[str, str]:
    return {"EVQ_ACCESS_KEY": who.access_key, "EVQ_SECRET_KEY": who.secret_key}


@attrs.frozen
class Secured:
    root: Path
    namesrv: str
    master: Running
    slave: Running
    ha_port: int

    def log_of(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    acl = root / "plain_acl.yml"
    acl.write_text(ACL)
    conf = root / "broker.conf"
    conf.write_text(f"mappedFileSizeCommitLog=16777216\nwarmSegments=false\n"
                    f"aclEnable=true\naclFile={acl}\n")
    ha_port = free_port()
    keys = ("--access-key", ADMIN.access_key, "--secret-key", ADMIN.secret_key)
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(running_evq(
            "--log-level", "warning", "namesrv", "--port", "0", "--acl-file", str(acl),
            servers=1, stderr=stack.enter_context((root / "namesrv.log").open("w"))))
        namesrv = ns.addresses["namesrv"]

        def broker(name: str, *extra: str) -> Running:
            return stack.enter_context(running_evq(
                "--log-level", "warning", "broker", "--config", str(conf), "--port", "0",
                "--namesrv", namesrv, "--broker-name", "broker-a", "--data", str(root / name),
                *extra, servers=1, stderr=stack.enter_context((root / f"{name}.log").open("w"))))

        master = broker("master", "--ha-port", str(ha_port), *keys)
        slave = broker("slave", "--role", "SLAVE", "--broker-id", "1",
                       "--master-ha", f"{HOST}:{ha_port}", *keys)
        for running in (master, slave):
            wait_registered(namesrv, running.addresses["broker"])
        yield Secured(root, namesrv, master, slave, ha_port)


def test_clients_with_credentials_work_and_without_are_refused(cluster: Secured) -> None:
    async def main() -> None:
        master = cluster.master.addresses["broker"]
        config = tp.TopicConfig(topic_name=TOPIC, read_queue_nums=2, write_queue_nums=2)
        async with Admin(cluster.namesrv) as stranger:
            with pytest.raises(ClientError, match=r"16|NO_PERMISSION|permission"):
                await stranger.update_topic(config, broker=master)
        async with Admin(cluster.namesrv, security=signed(ADMIN)) as admin:
            await admin.update_topic(config, broker=master)
            async with asyncio.timeout(WAIT_S):  # waits for the master to register the topic
                while TOPIC not in await admin.topic_list():
                    await asyncio.sleep(0.05)
        async with Producer("SecuredProducer", cluster.namesrv, retries=0) as unsigned:
            with pytest.raises(ClientError):
                await unsigned.send(new_message(TOPIC, b"never"))
        async with Producer("SecuredProducer", cluster.namesrv,
                            security=signed(USER)) as producer:
            for i in range(6):
                sent = await producer.send(new_message(TOPIC, f"m{i}".encode()))
                assert sent.status is SendStatus.SEND_OK
        pulled: list[Message] = []
        async with PullConsumer("SecuredPull", cluster.namesrv, security=signed(USER)) as pull:
            await pull.assign(await pull.queues(TOPIC))
            async with asyncio.timeout(WAIT_S):  # waits for the pulls to bring all six
                while len(pulled) < 6:
                    pulled += await pull.poll_all(32, wait_ms=200)
        assert sorted(m.body for m in pulled) == [f"m{i}".encode() for i in range(6)]
        pushed: list[Message] = []
        done = asyncio.Event()

        async def listener(msgs: list[Message]) -> ConsumeResult:
            pushed.extend(msgs)
            if len(pushed) >= 6:
                done.set()
            return ConsumeResult.CONSUME_SUCCESS

        push = PushConsumer("SecuredPush", cluster.namesrv, listener=listener,
                            options=ConsumerOptions(consume_from=ConsumeFrom.FIRST_OFFSET),
                            security=signed(USER))
        push.subscribe(TOPIC)
        async with push:
            async with asyncio.timeout(WAIT_S):  # waits for the push consumer's six messages
                await done.wait()

    run(main())


def test_a_sync_producers_sends_on_its_callers_thread_are_signed(cluster: Secured) -> None:
    """The broker refuses unsigned sends (above): those a SyncProducer makes on its caller's
    thread, over a connection of their own, carry the signature the loop's sends do."""
    async def topic() -> None:
        async with Admin(cluster.namesrv, security=signed(ADMIN)) as admin:
            await admin.update_topic(tp.TopicConfig(topic_name="SecuredSync"),
                                     broker=cluster.master.addresses["broker"])
            async with asyncio.timeout(WAIT_S):  # waits for the master to register the topic
                while "SecuredSync" not in await admin.topic_list():
                    await asyncio.sleep(0.05)

    run(topic())
    with SyncProducer("SecuredSync", cluster.namesrv, security=signed(USER)) as p:
        sent = [p.send(new_message("SecuredSync", b"s%d" % i)) for i in range(10)]
        assert p.direct_sends == 9
    assert {r.status for r in sent} == {SendStatus.SEND_OK}
    assert len({r.offset_msg_id for r in sent}) == 10
    got: list[bytes] = []
    with SyncPullConsumer("SecuredSyncReaders", cluster.namesrv, security=signed(USER)) as c:
        c.assign(c.queues("SecuredSync"))
        deadline, polls = time.monotonic() + WAIT_S, 0
        while len(got) < 10:
            assert time.monotonic() < deadline, f"read {len(got)} of 10"
            for queue in c.assignment:
                got += [m.body for m in c.poll(queue).messages]
                polls += 1
        assert c.direct_polls == polls  # every one on the caller's thread, signed too
    assert sorted(got) == sorted(b"s%d" % i for i in range(10))


def test_the_commands_take_credentials_from_the_environment(cluster: Secured) -> None:
    lines = "c1\nc2\nc3\n"
    refused = run_evq("produce", "-n", cluster.namesrv, "-t", TOPIC, stdin=lines,
                      env={"EVQ_ACCESS_KEY": "", "EVQ_SECRET_KEY": ""})
    assert refused.returncode == 1 and refused.stderr.startswith("evq: error:"), refused.stderr
    sent = run_evq("produce", "-n", cluster.namesrv, "-t", TOPIC, stdin=lines,
                   env=env_of(USER))
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.count('"SEND_OK"') == 3
    got = run_evq("consume", "-n", cluster.namesrv, "-t", TOPIC, "-g", "SecuredCli",
                  "--from-beginning", "--count", "9", env=env_of(USER))
    assert got.returncode == 0, got.stderr
    assert {"c1", "c2", "c3"} <= set(got.stdout.split())
    stranger = run_evq("admin", "updateTopic", "-n", cluster.namesrv, "-t", "NotByYou",
                       "-b", cluster.master.addresses["broker"],
                       env={"EVQ_ACCESS_KEY": "", "EVQ_SECRET_KEY": ""})
    assert stranger.returncode == 1, stranger.stdout
    user = run_evq("admin", "updateTopic", "-n", cluster.namesrv, "-t", "NotByYou",
                   "-b", cluster.master.addresses["broker"], env=env_of(USER))
    assert user.returncode == 1, user.stdout
    admin = run_evq("admin", "updateTopic", "-n", cluster.namesrv, "-t", "ByTheAdmin",
                    "-b", cluster.master.addresses["broker"], "--access-key",
                    ADMIN.access_key, env={"EVQ_SECRET_KEY": ADMIN.secret_key})
    assert admin.returncode == 0, admin.stderr


def test_a_stranger_cannot_change_the_name_servers_tables(cluster: Secured) -> None:
    master = cluster.master.addresses["broker"]

    async def main() -> None:
        async with RemotingClient(*split_address(cluster.namesrv)) as c:
            for code, fields in [
                (RequestCode.UNREGISTER_BROKER, {"clusterName": "DefaultCluster",
                                                 "brokerName": "broker-a", "brokerId": 0,
                                                 "brokerAddr": master}),
                (RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                             "key": TOPIC, "value": "broker-a:1"}),
                (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": tp.AUTO_CREATE_TOPIC}),
            ]:
                answer = await c.invoke(RemotingCommand.request(code, fields), 5)
                assert answer.code == ResponseCode.NO_PERMISSION, (code, answer.remark)

    run(main())
    wait_registered(cluster.namesrv, master)  # still routed: nothing was removed


def test_only_the_slave_with_the_admin_account_replicates(cluster: Secured) -> None:
    async def ends(addr: str) -> list[int]:
        pool = BrokerPool(security=signed(ADMIN))
        try:
            return [await max_offset(pool, addr, MessageQueue(tp.AUTO_CREATE_TOPIC,
                                                              "broker-a", q))
                    for q in range(4)]
        finally:
            await pool.close()

    master, slave = cluster.master.addresses["broker"], cluster.slave.addresses["broker"]

    async def produce() -> None:
        async with Producer("SecuredHA", cluster.namesrv, security=signed(USER)) as producer:
            await producer.send(new_message(TOPIC, b"replicated"))

    run(produce())
    wait_for("the slave to hold what the master holds",
             lambda: run(ends(master)) == run(ends(slave)))
    with (cluster.root / "intruder.log").open("w") as intruder_log, running_evq(
            "--log-level", "warning", "broker", "--port", "0", "--role", "SLAVE",
            "--broker-id", "2", "--broker-name", "broker-a", "--data",
            str(cluster.root / "intruder"), "--master-ha", f"{HOST}:{cluster.ha_port}",
            "--access-key", ADMIN.access_key, "--secret-key", "a-guessed-secret", servers=1,
            stderr=intruder_log) as intruder:
        wait_for("the intruder to be turned away",
                 lambda: "ha_slave_not_admitted" in cluster.log_of("intruder"))
        assert "ha_slave_refused" in cluster.log_of("master")
        assert "ha_streaming" not in cluster.log_of("intruder")
        assert intruder.stop() == 0
