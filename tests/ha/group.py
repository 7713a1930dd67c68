"""A broker group in real processes: a name server, a master on fixed ports (so it can be
killed and restarted where its slave and clients expect it) and a slave."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import attrs

from evq.backends.config import StoreConfig
from evq.backends.registry import open_log
from evq.client.producer import Producer, SendStatus
from evq.domain.log import GetStatus, MessageLog
from evq.domain.message import Message, Prop, new_message
from evq.domain.record import decode
from evq.ha.log_window import LogWindow
from evq.net import fastjson
from evq.net.codes import RequestCode
from evq.net.headers.offsets import (
    QueryConsumerOffsetRequest,
    QueryConsumerOffsetResponse,
    UpdateConsumerOffsetRequest,
)
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, TransportError, split_address
from tests.processes import Running, free_port, running_broker, running_evq, running_namesrv

HOST = "127.0.0.1"
CATCH_UP_S = 30.0
WAIT_S = 40.0


@attrs.define
class Group:
    """Where everything runs; :meth:`start_master` may be called again after a kill."""

    root: Path
    namesrv: str
    master_port: int = attrs.field(factory=free_port)
    ha_port: int = attrs.field(factory=free_port)
    stack: contextlib.ExitStack = attrs.field(factory=contextlib.ExitStack)
    master: Running | None = None
    slave: Running | None = None

    @property
    def master_addr(self) -> str:
        return f"{HOST}:{self.master_port}"

    @property
    def slave_addr(self) -> str:
        assert self.slave is not None
        return self.slave.addresses["broker"]

    @property
    def config(self) -> Path:
        """Small unwarmed segments: a broker restarted every few seconds must not spend
        them pre-faulting a 1 GiB file."""
        path = self.root / "broker.conf"
        if not path.exists():
            path.write_text("mappedFileSizeCommitLog=16777216\nwarmSegments=false\n"
                            "slaveReadEnable=true\n")
        return path

    def start_master(self, role: str, *extra: str, log_level: str = "warning") -> Running:
        """Start (or restart) the master; returns once the name server routes to it."""
        self.master = self.stack.enter_context(running_broker(
            self.namesrv, self.root / "master", "--config", str(self.config),
            "--ha-port", str(self.ha_port), "--role", role, *extra, port=self.master_port,
            stderr=self.stack.enter_context((self.root / "master.log").open("a")),
            log_level=log_level))
        return self.master

    def start_slave(self, *extra: str, master_ha: bool = True) -> Running:
        """Without ``master_ha`` the slave learns its master's HA address from the name
        server's answer to its registration."""
        named = ("--master-ha", f"{HOST}:{self.ha_port}") if master_ha else ()
        self.slave = self.stack.enter_context(running_evq(
            "--log-level", "warning", "broker", "--config", str(self.config), "--port", "0",
            "--role", "SLAVE", "--broker-id", "1", *named,
            "--namesrv", self.namesrv, "--data", str(self.root / "slave"), *extra, servers=1,
            stderr=self.stack.enter_context((self.root / "slave.log").open("a"))))
        return self.slave

    def master_log(self) -> str:
        """What the master (every start of it) wrote on stderr."""
        return (self.root / "master.log").read_text()

    def slave_log(self) -> str:
        """The slave's own log (stderr), for the message of a failed assertion."""
        return (self.root / "slave.log").read_text()[-4000:]

    def kill_master(self) -> None:
        assert self.master is not None
        self.master.proc.kill()
        self.master.proc.wait(10)


@contextlib.contextmanager
def broker_group(root: Path) -> Iterator[Group]:
    with running_namesrv() as namesrv:
        group = Group(root, namesrv)
        with group.stack:
            yield group


async def log_end(addr: str) -> int:
    """A broker's commit-log end, from GET_BROKER_RUNTIME_INFO."""
    async with RemotingClient(*split_address(addr)) as client:
        answer = await client.invoke(
            RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0)
    return int(json.loads(answer.body)["table"]["commitLogMaxOffset"])


async def committed(addr: str, group: str, topic: str, queues: int) -> list[int]:
    """The group's committed offset of each queue on one broker (-1: none)."""
    out = []
    async with RemotingClient(*split_address(addr)) as client:
        for q in range(queues):
            answer = await client.invoke(RemotingCommand.request(
                RequestCode.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetRequest.write(
                    consumer_group=group, topic=topic, queue_id=q)), 5.0)
            out.append(QueryConsumerOffsetResponse.read(answer.ext_fields).offset
                       if answer.code == 0 else -1)
    return out


async def commit_offset(addr: str, group: str, topic: str, queue_id: int, offset: int) -> None:
    """Commit a consumer offset on one broker, as a consumer's UPDATE_CONSUMER_OFFSET does."""
    async with RemotingClient(*split_address(addr)) as client:
        answer = await client.invoke(RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequest.write(
                consumer_group=group, topic=topic, queue_id=queue_id,
                commit_offset=offset)), 5.0)
    assert answer.code == 0, answer.remark


async def until(cond: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``cond`` until it holds, or fail naming ``what`` after :data:`WAIT_S`."""
    try:
        async with asyncio.timeout(WAIT_S):
            while not await cond():
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def same_admin_answers(group: Group, offsets_of: str) -> bool:
    """Master and slave answer the admin tables alike, and the offset table holds
    ``offsets_of`` (``topic@group``), so two empty answers do not pass."""
    master, slave = await asyncio.gather(admin_tables(group.master_addr),
                                         admin_tables(group.slave_addr))
    return (master is not None and master == slave
            and offsets_of in master["offsetTable"])  # type: ignore[operator]


async def admin_tables(addr: str) -> dict[str, object] | None:
    """What an operator's tools read from a broker: every topic config, subscription group,
    consumer offset and delay offset (data versions left out: each broker stamps its own).
    None when the broker refuses one (a slave cut back to nothing has no topic to list)."""
    out: dict[str, object] = {}
    async with RemotingClient(*split_address(addr)) as client:
        for code, table in ((RequestCode.GET_ALL_TOPIC_CONFIG, "topicConfigTable"),
                            (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                             "subscriptionGroupTable"),
                            (RequestCode.GET_ALL_CONSUMER_OFFSET, "offsetTable"),
                            (RequestCode.GET_ALL_DELAY_OFFSET, "delay:offsetTable")):
            answer = await client.invoke(RemotingCommand.request(code, {}), 5.0)
            if answer.code != 0:
                return None
            out[table] = fastjson.loads(answer.body.decode())[table.rpartition(":")[2]]
    return out


def wait_caught_up(group: Group) -> int:
    """Poll until the slave's log end equals the master's; returns it."""
    deadline = time.monotonic() + CATCH_UP_S
    while True:
        try:
            master, slave = (asyncio.run(log_end(a))
                             for a in (group.master_addr, group.slave_addr))
            if master == slave:
                return master
        except (TransportError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the slave did not catch up with the master")
        time.sleep(0.05)


@attrs.frozen
class StoreContents:
    queues: dict[tuple[str, int], list[str]]
    """UNIQ_KEYs of every queue, by queue offset (from the queue's min offset)."""
    raw: bytes


def read_store(path: Path, topic: str) -> StoreContents:
    with opened_store(path) as log:
        queues = {key: [m.properties[Prop.UNIQ_KEY] for m in messages]
                  for key, messages in queue_messages(log, topic).items()}
        raw = LogWindow(log).read(log.min_physical_offset, log.max_physical_offset)
        return StoreContents(queues, raw)


@contextlib.contextmanager
def opened_store(path: Path) -> Iterator[MessageLog]:
    """A stopped (or killed) broker's mmap store, recovered, as the group's brokers write it."""
    config = StoreConfig(commitlog_segment_size=16 * 1024 * 1024, warm_segments=False)
    log: MessageLog = open_log("mmap", path, config, background=False)
    try:
        yield log
    finally:
        log.close()


def queue_messages(log: MessageLog, topic: str) -> dict[tuple[str, int], list[Message]]:
    """Every message of ``topic`` by queue, in queue order from offset 0."""
    queues: dict[tuple[str, int], list[Message]] = {}
    for (t, q), hi in log.queues().items():
        if t != topic:
            continue
        messages = queues.setdefault((t, q), [])
        offset = 0
        while offset < hi:
            r = log.read(t, q, offset, max_count=256, max_bytes=8 << 20)
            assert r.status is GetStatus.FOUND, (t, q, offset, r.status)
            messages += [decode(v, check_crc=False) for v in r.records]
            offset = r.next_offset
    return queues


async def produce_numbered(namesrv: str, topic: str, prefix: str, n: int, *,
                           repeat: int = 1) -> None:
    """Send ``prefix0`` .. ``prefix{n-1}`` (each body repeated ``repeat`` times) to ``topic``;
    every send must be acknowledged."""
    async with Producer(f"ha-{topic}", namesrv) as producer:
        for i in range(n):
            r = await producer.send(new_message(topic, f"{prefix}{i}".encode() * repeat))
            assert r.status is SendStatus.SEND_OK
