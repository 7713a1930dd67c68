"""A master with an ACL admits only slaves that prove an admin account, before any log byte.

The refused cases speak the protocol by hand on a raw socket, so that the test sees every
byte a stranger gets (exactly one DENIED answer, then the end of the connection); the admitted
case runs evq's own slave against the master over real stores.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evq.acl.accounts import parse_acl
from evq.acl.signature import Credentials
from evq.backends.registry import open_log
from evq.domain.clock import ManualClock
from evq.domain.log import MessageLog
from evq.ha.auth import prove
from evq.ha.frames import (
    ANSWER,
    GREETING,
    Answer,
    AnswerKind,
    Greeting,
    Hello,
    Proof,
    decode_proof,
    proof_rest_size,
)
from evq.ha.master import HAMaster
from evq.ha.slave import Backoff, HASlave
from evq.net.transport import split_address
from tests.conftest import SMALL
from tests.ha.test_replication import WAIT_S, fill, in_loop, raw, until

ACCOUNTS = parse_acl("""accounts:
  - accessKey: replicator
    secretKey: replicator-secret
    admin: true
  - accessKey: reader01
    secretKey: reader-secret
    defaultTopicPerm: SUB
""")
ADMIN = Credentials("replicator", "replicator-secret")
EMPTY_HELLO = Hello(0, 0, 0, 0).encode()


@contextlib.asynccontextmanager
async def master_with_acl(tmp_path: Path) -> AsyncIterator[tuple[HAMaster, MessageLog]]:
    log = open_log("memory", tmp_path / "m", SMALL, clock=ManualClock(), background=False)
    fill(log, 50, b"s")
    master = HAMaster(log, "127.0.0.1", 0, accounts=lambda: ACCOUNTS)
    await master.start()
    try:
        yield master, log
    finally:
        await master.shutdown()
        log.close()


async def everything_after(master: HAMaster, who: Credentials | bytes | None
                           ) -> tuple[Greeting, bytes]:
    """Connect as a slave would, send a proof (``who``'s for this connection's nonce, or
    recorded bytes, or none) and an empty log's HELLO, and read all the master sends until it
    closes the connection."""
    reader, writer = await asyncio.open_connection(*split_address(master.address))
    try:
        async with asyncio.timeout(WAIT_S):  # waits for the master to close the connection
            greeting = Greeting.decode(await reader.readexactly(GREETING.size))
            proof = (prove(who, greeting.nonce).encode() if isinstance(who, Credentials)
                     else who or b"")
            writer.write(proof + EMPTY_HELLO)
            return greeting, await reader.read()
    finally:
        writer.close()


DENIED = Answer(AnswerKind.DENIED, 0).encode()


@pytest.mark.parametrize("who", [None, Credentials("replicator", "not-the-secret"),
                                 Credentials("reader01", "reader-secret"),
                                 Credentials("stranger", "replicator-secret")])
@in_loop
async def test_a_slave_without_an_admin_proof_gets_no_byte_of_the_log(
        tmp_path: Path, who: Credentials | None) -> None:
    async with master_with_acl(tmp_path) as (master, _log):
        greeting, rest = await everything_after(master, who)
        assert greeting.auth and len(greeting.nonce) == 16
        assert rest == DENIED


@in_loop
async def test_a_proof_recorded_on_one_connection_is_refused_on_the_next(tmp_path: Path
                                                                         ) -> None:
    async with master_with_acl(tmp_path) as (master, _log):
        reader, writer = await asyncio.open_connection(*split_address(master.address))
        async with asyncio.timeout(WAIT_S):  # waits for the admitted handshake's answer
            first = Greeting.decode(await reader.readexactly(GREETING.size))
            recorded = prove(ADMIN, first.nonce).encode()
            writer.write(recorded + EMPTY_HELLO)
            answer = Answer.decode(await reader.readexactly(ANSWER.size))
        writer.close()
        assert answer.kind is not AnswerKind.DENIED  # admitted: the handshake goes on
        greeting, rest = await everything_after(master, recorded)
        assert greeting.nonce != first.nonce
        assert rest == DENIED


@in_loop
async def test_an_admin_slave_replicates(tmp_path: Path) -> None:
    async with master_with_acl(tmp_path) as (master, master_log):
        slave_log = open_log("memory", tmp_path / "s", SMALL, clock=ManualClock(),
                             background=False)
        slave = HASlave(slave_log, lambda: master.address, credentials=ADMIN,
                        backoff=Backoff(first=0.01))
        slave.start()
        try:
            await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
            assert raw(slave_log) == raw(master_log)
        finally:
            await slave.shutdown()
            slave_log.close()


@in_loop
async def test_a_master_without_acl_takes_a_slave_with_credentials(tmp_path: Path) -> None:
    master_log = open_log("memory", tmp_path / "m", SMALL, clock=ManualClock(),
                          background=False)
    slave_log = open_log("memory", tmp_path / "s", SMALL, clock=ManualClock(), background=False)
    fill(master_log, 20, b"o")
    master = HAMaster(master_log, "127.0.0.1", 0)
    await master.start()
    slave = HASlave(slave_log, lambda: master.address, credentials=ADMIN)
    slave.start()
    try:
        await until(lambda: slave_log.max_physical_offset == master_log.max_physical_offset)
    finally:
        await slave.shutdown()
        await master.shutdown()
        slave_log.close()
        master_log.close()


def test_a_proof_round_trips() -> None:
    proof = prove(ADMIN, bytes(range(16)))
    data = proof.encode()
    assert decode_proof(data[6:6 + proof_rest_size(data[:6])]) == proof
    assert Proof("é", bytes(20)).encode()[4:6] == b"\x00\x02"


@in_loop
async def test_the_port_closes_a_connection_past_its_bound_before_a_byte(tmp_path: Path) -> None:
    """At ``max_connections`` one more connection gets nothing, not even the greeting, and is
    closed; a place freed is taken again."""
    log = open_log("memory", tmp_path / "m", SMALL, clock=ManualClock(), background=False)
    master = HAMaster(log, "127.0.0.1", 0, max_connections=1)
    await master.start()
    try:
        first = await asyncio.open_connection(*split_address(master.address))
        async with asyncio.timeout(WAIT_S):
            assert Greeting.decode(await first[0].readexactly(GREETING.size)).auth is False
            for _ in range(2):
                reader, writer = await asyncio.open_connection(*split_address(master.address))
                assert await reader.read() == b""  # closed, never greeted
                writer.close()
        assert master.refusals.count == 2
        first[1].close()
        async with asyncio.timeout(WAIT_S):
            while True:  # the first's session ends once the master reads its close
                reader, writer = await asyncio.open_connection(*split_address(master.address))
                got = await reader.read(GREETING.size)
                writer.close()
                if got:
                    break
                await asyncio.sleep(0.01)
        assert Greeting.decode(got).auth is False
    finally:
        await master.shutdown()
        log.close()
