"""Transactional sends against a real name server and a broker whose transaction checker runs
every half second: commit, rollback, check-back, and a producer killed between its database
commit and END_TRANSACTION whose successor answers the check from the database."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from evq.client.blocking import SyncTransactionProducer
from evq.client.errors import RouteNotFound
from evq.client.pull_consumer import PullConsumer
from evq.client.sqltx import SqlTransactions, decide
from evq.client.transactions import TransactionProducer, TransactionState
from evq.domain.clock import ManualClock
from evq.domain.message import Message, Prop, new_message
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, split_address
from tests.client.conftest import Served
from tests.client.tx_tables import orders, record_order
from tests.processes import REPO_ROOT, python_env, running_broker, running_namesrv

CHECK_CONF = "transactionTimeOut=1000\ntransactionCheckInterval=300\n"


@pytest.fixture
def tx_cluster(tmp_path: Path) -> Iterator[Served]:
    conf = tmp_path / "broker.conf"
    conf.write_text(CHECK_CONF)
    with running_namesrv() as namesrv, running_broker(
            namesrv, tmp_path / "data", "--config", str(conf)) as broker:
        yield Served(namesrv, broker.addresses["broker"], broker.proc)
        assert broker.stop() == 0


class Scripted:
    """Answers ``execute`` per body and ``check`` with one state; records the checks."""

    def __init__(self, execute: dict[bytes, TransactionState],
                 check: TransactionState = TransactionState.UNKNOWN) -> None:
        self._execute = execute
        self.check_answer = check
        self.checked: list[bytes] = []

    async def execute(self, msg: Message, arg: object) -> TransactionState:
        return self._execute[msg.payload()]

    async def check(self, msg: Message) -> TransactionState:
        self.checked.append(msg.payload())
        return self.check_answer


async def bodies(namesrv: str, topic: str) -> list[bytes]:
    """What consumers can read of ``topic``; nothing while no commit has created it (a half
    lives in the half topic)."""
    async with PullConsumer("G-tx-read", namesrv, auto_commit=False) as c:
        try:
            queues = await c.queues(topic)
        except RouteNotFound:
            return []
        return [m.payload() for q in queues for m in (await c.pull(q, 0, 64)).messages]


async def check_passes(broker: str) -> int:
    """The broker's transaction checker passes so far (``evqTransactionCheckPasses``)."""
    async with RemotingClient(*split_address(broker)) as client:
        answer = await client.invoke(
            RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0)
    return int(json.loads(answer.body)["table"]["evqTransactionCheckPasses"])


async def after_passes(broker: str, n: int) -> None:
    """Return once the checker has run ``n`` whole passes begun after the call: what a test
    that says "and nothing more happens" waits for, however slow the machine."""
    start = await check_passes(broker)
    async with asyncio.timeout(20):
        while await check_passes(broker) < start + n + 1:  # the first may be under way
            await asyncio.sleep(0.1)


async def until_delivered(namesrv: str, topic: str, body: bytes, timeout: float = 20
                          ) -> list[bytes]:
    async with asyncio.timeout(timeout):
        while body not in (got := await bodies(namesrv, topic)):
            await asyncio.sleep(0.2)
    return got


async def test_commit_is_delivered_and_rollback_never(tx_cluster: Served) -> None:
    listener = Scripted({b"yes": TransactionState.COMMIT, b"no": TransactionState.ROLLBACK})
    async with TransactionProducer("PTX", tx_cluster.namesrv, listener) as p:
        no = await p.send_in_transaction(new_message("TX1", b"no"))
        yes = await p.send_in_transaction(new_message("TX1", b"yes"))
        assert (no.state, yes.state) == (TransactionState.ROLLBACK, TransactionState.COMMIT)
        assert len(yes.transaction_id) == 32
        await until_delivered(tx_cluster.namesrv, "TX1", b"yes")
        await after_passes(tx_cluster.broker, 2)  # an ended half is never checked
        assert await bodies(tx_cluster.namesrv, "TX1") == [b"yes"]
        assert listener.checked == []


async def test_a_commit_sent_right_before_shutdown_is_not_lost(tx_cluster: Served) -> None:
    listener = Scripted({b"last": TransactionState.COMMIT})
    for _ in range(5):  # END_TRANSACTION is one-way; the producer hangs up at once
        async with TransactionProducer("PTX7", tx_cluster.namesrv, listener) as p:
            await p.send_in_transaction(new_message("TX7", b"last"))
    async with asyncio.timeout(3):  # well before any check-back (1 s timeout, rounds of 0.3 s)
        while len(await bodies(tx_cluster.namesrv, "TX7")) < 5:
            await asyncio.sleep(0.1)
    assert listener.checked == []


async def test_unknown_is_decided_by_the_check_back(tx_cluster: Served) -> None:
    listener = Scripted({b"later": TransactionState.UNKNOWN, b"never": TransactionState.UNKNOWN})
    async with TransactionProducer("PTX2", tx_cluster.namesrv, listener) as p:
        await p.send_in_transaction(new_message("TX2", b"later"))
        assert await bodies(tx_cluster.namesrv, "TX2") == []  # a half is invisible
        listener.check_answer = TransactionState.COMMIT
        got = await until_delivered(tx_cluster.namesrv, "TX2", b"later")
        assert got == [b"later"] and b"later" in listener.checked
        listener.check_answer = TransactionState.ROLLBACK
        await p.send_in_transaction(new_message("TX2", b"never"))
        async with asyncio.timeout(20):
            while b"never" not in listener.checked:
                await asyncio.sleep(0.1)
        await after_passes(tx_cluster.broker, 2)  # the rollback is in: no pass delivers it
        assert await bodies(tx_cluster.namesrv, "TX2") == [b"later"]


async def test_a_listener_that_raises_leaves_the_half_to_the_check(tx_cluster: Served) -> None:
    class Raising(Scripted):
        async def execute(self, msg: Message, arg: object) -> TransactionState:
            raise RuntimeError("local transaction crashed")

    listener = Raising({}, check=TransactionState.COMMIT)
    async with TransactionProducer("PTX3", tx_cluster.namesrv, listener) as p:
        result = await p.send_in_transaction(new_message("TX3", b"boom"))
        assert result.state is TransactionState.UNKNOWN
        await until_delivered(tx_cluster.namesrv, "TX3", b"boom")


async def test_database_failure_rolls_back_and_writes_nothing(tx_cluster: Served,
                                                              tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    orders.metadata.create_all(engine)
    tx = SqlTransactions(engine)

    def failing(conn: sa.Connection, msg: Message, arg: object) -> None:
        record_order(conn, msg, arg)
        raise RuntimeError("constraint violated")

    async with TransactionProducer("PTX4", tx_cluster.namesrv, tx.listener(failing)) as p:
        bad = await p.send_in_transaction(new_message("TX4", b"bad"), "order-1")
    assert bad.state is TransactionState.ROLLBACK
    with engine.connect() as conn:
        assert conn.execute(sa.select(orders.c.name)).all() == []
        assert conn.execute(sa.select(tx.table.c.transaction_id)).all() == []
    async with TransactionProducer("PTX4b", tx_cluster.namesrv,
                                   tx.listener(record_order)) as p:
        await p.send_in_transaction(new_message("TX4", b"good"), "order-2")
        got = await until_delivered(tx_cluster.namesrv, "TX4", b"good")
    assert got == [b"good"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(orders.c.name)).scalars().all() == ["order-2"]


async def test_a_producer_killed_after_its_commit_is_answered_for_by_the_group(
        tx_cluster: Served, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.client.tx_child", tx_cluster.namesrv, url, "TX5", "PTX5",
         "order-7"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env=python_env())
    try:
        assert child.stdout is not None
        line = ""
        while not line.startswith("committed "):  # structlog's lines come first
            line = await asyncio.to_thread(child.stdout.readline)
            assert line, "the child exited before its local commit"
        word, tx_id, state = line.split()
        assert (word, state) == ("committed", "COMMIT")
        assert await bodies(tx_cluster.namesrv, "TX5") == []  # the broker was never told
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    engine = sa.create_engine(url)
    successor = SqlTransactions(engine)
    async with TransactionProducer("PTX5", tx_cluster.namesrv,
                                   successor.listener(record_order)):
        got = await until_delivered(tx_cluster.namesrv, "TX5", b"order-7")
        await after_passes(tx_cluster.broker, 2)  # further passes must not deliver it again
        got = await bodies(tx_cluster.namesrv, "TX5")
    assert got == [b"order-7"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(successor.table.c.transaction_id)).scalars().all() == [
            tx_id]


def test_scripts_send_in_transaction_with_a_blocking_database_listener(
        tx_cluster: Served, tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    orders.metadata.create_all(engine)
    tx = SqlTransactions(engine)
    with SyncTransactionProducer("PTX6", tx_cluster.namesrv, tx.listener(record_order)) as p:
        result = p.send_in_transaction(new_message("TX6", b"sync"), "order-9")
    assert result.state is TransactionState.COMMIT
    got = asyncio.run(until_delivered(tx_cluster.namesrv, "TX6", b"sync"))
    assert got == [b"sync"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(tx.table.c.transaction_id)).scalars().all() == [
            result.transaction_id]


@given(st.sampled_from([None, TransactionState.COMMIT, TransactionState.ROLLBACK]),
       st.integers(0, 10**7), st.integers(1, 10**7))
def test_a_recorded_outcome_always_wins_and_a_missing_one_waits_out_its_window(
        recorded: TransactionState | None, age: int, pending: int) -> None:
    if recorded is not None:
        assert decide(recorded, age, pending) is recorded
    else:
        expected = TransactionState.UNKNOWN if age < pending else TransactionState.ROLLBACK
        assert decide(None, age, pending) is expected


def _msg(uniq: str, born_ms: int) -> Message:
    msg = new_message("T", uniq.encode())
    msg.properties[Prop.UNIQ_KEY] = uniq
    msg.born_timestamp = born_ms
    return msg


def test_an_old_unknown_id_is_fenced_so_a_late_commit_loses(tmp_path: Path) -> None:
    clock = ManualClock(ms=100_000)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'f.db'}")
    orders.metadata.create_all(engine)
    tx = SqlTransactions(engine, pending_ms=30_000, clock=clock)
    late = _msg("late", born_ms=100_000)
    assert tx.check(late) is TransactionState.UNKNOWN  # may still be running: ask again
    clock.advance(31)
    assert tx.check(late) is TransactionState.ROLLBACK  # fenced
    assert tx.run(record_order, late, "order-late") is TransactionState.ROLLBACK
    with engine.connect() as conn:
        assert conn.execute(sa.select(orders.c.name)).all() == []  # its work rolled back
    assert tx.check(late) is TransactionState.ROLLBACK  # and the answer stays


def test_prune_forgets_only_old_ids(tmp_path: Path) -> None:
    clock = ManualClock(ms=1_000)
    tx = SqlTransactions(sa.create_engine(f"sqlite:///{tmp_path / 'p.db'}"), clock=clock)
    for name in ("a", "b"):
        assert tx.run(lambda conn, m, arg: None, _msg(name, 0), None) is (
            TransactionState.COMMIT)
        clock.advance(0.5)
    assert tx.prune(1_200) == 1
    assert tx.check(_msg("b", 0)) is TransactionState.COMMIT
    assert tx.recorded("a") is None
