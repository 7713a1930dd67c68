"""Brokers with RocketMQ's transient store pool, as processes: what a SIGKILL may take, what
replication ships.

The pool's promise (RocketMQ's): a send is acknowledged once its record is in a pool buffer,
and the record survives a crash of the broker process once it is committed to the file (in
the page cache: a SIGKILL does not lose it, a power cut before the flush may).  So a test
reads the master's committed end (GET_BROKER_RUNTIME_INFO's ``commitLogMaxOffset``, which with
the pool stops there) and then kills it: every send acknowledged below that end must be in the
restarted store at its queue offset, and the log must hold no torn record.  A master ships
its slave committed bytes only; a slave configured with the pool runs without it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from evq.client.producer import Producer, SendStatus
from evq.domain.message import new_message
from evq.domain.record import iter_records, parse_offset_msg_id
from tests.ha.group import Group, broker_group, log_end, read_store, until, wait_caught_up
from tests.ha.test_kill_rounds import TOPIC, Ack, check_store, send_continuously
from tests.processes import run_evq, running_evq

POOL_CONF = ("mappedFileSizeCommitLog=16777216\nwarmSegments=false\nslaveReadEnable=true\n"
             "transientStorePoolEnable=true\ntransientStorePoolSize=2\n")
ROUNDS = 4
SENDERS = 4
ACKS_PER_ROUND = 40


def events(log_text: str, event: str) -> list[dict[str, object]]:
    """The JSON log lines of a broker's stderr that record ``event``."""
    found = []
    for line in log_text.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


def start_pooled_master(group: Group) -> None:
    group.start_master("ASYNC_MASTER", "--transient-store-pool", log_level="info")


async def acked_until(acked: list[Ack], count: int, what: str) -> None:
    async def enough() -> bool:
        return len(acked) >= count

    await until(enough, what)


async def committed_past(group: Group, offset: int) -> int:
    """The master's committed end once it lies past ``offset``."""
    ends: list[int] = []

    async def past() -> bool:
        ends.append(await log_end(group.master_addr))
        return ends[-1] > offset

    await until(past, f"the master's commit past {offset}")
    return ends[-1]


async def kill_rounds(group: Group) -> tuple[list[Ack], int]:
    """Senders all along; each round waits for the master to report its first sends
    committed, lets as many more be acknowledged, and kills the master.  Returns the sends
    acknowledged below a committed end read before their broker's kill (which must survive),
    and how many were acknowledged past it (which a kill may take)."""
    safe: list[Ack] = []
    at_risk = 0
    async with Producer("pool-kill", group.namesrv, retries=0) as producer:
        for n in range(ROUNDS):
            acked: list[Ack] = []  # this run of the master's acknowledgements only
            stop = asyncio.Event()
            senders = [asyncio.create_task(send_continuously(producer, stop, acked, f"r{n}s{i}"))
                       for i in range(SENDERS)]
            try:
                await acked_until(acked, ACKS_PER_ROUND, f"round {n}: acknowledged sends")
                committed = await committed_past(
                    group, max(a.physical_offset for a in list(acked)))
                await acked_until(acked, len(acked) + ACKS_PER_ROUND,
                                  f"round {n}: sends acknowledged after the committed end")
                await asyncio.to_thread(group.kill_master)
            finally:
                stop.set()
                await asyncio.gather(*senders)
            safe += [a for a in acked if a.physical_offset < committed]
            at_risk += sum(1 for a in acked if a.physical_offset >= committed)
            await asyncio.to_thread(start_pooled_master, group)
    return safe, at_risk


def test_sigkill_loses_no_send_acknowledged_below_the_committed_end(tmp_path: Path) -> None:
    (tmp_path / "broker.conf").write_text(POOL_CONF)
    with broker_group(tmp_path) as group:
        start_pooled_master(group)
        safe, at_risk = asyncio.run(kill_rounds(group))
        assert group.master is not None and group.master.stop() == 0
        master_log = group.master_log()
    # The flag reached the store at every start (CLI -> settings -> store).
    assert len(events(master_log, "transient_store_pool_enabled")) == ROUNDS + 1
    assert len(events(master_log, "store_recovered")) == ROUNDS + 1
    print(f"{len(safe)} sends acknowledged below a committed end, {at_risk} past it, "
          f"over {ROUNDS} kills")
    assert len(safe) >= ROUNDS * ACKS_PER_ROUND  # each round's first sends at least
    contents = read_store(tmp_path / "master", TOPIC)
    check_store(contents.queues, safe)
    # Nothing torn: every record of the recovered log decodes with a good CRC.
    records = list(iter_records(contents.raw, check_crc=True))
    assert sum(1 for m in records if m.topic == TOPIC) == sum(map(len, contents.queues.values()))


# Commits wait for 64 pages (256 KiB) and never run on time alone, nor does the flusher's
# thorough round (which commits first): a few small sends stay in the master's pool buffer.
# (Metadata events are committed as they are written: the first sends' topic is.)
HA_POOL_CONF = POOL_CONF + ("commitCommitLogLeastPages=64\n"
                            "commitCommitLogThoroughInterval=3600000\n"
                            "flushCommitLogThoroughInterval=3600000\n")


async def send_numbered(namesrv: str, prefix: str, n: int, size: int) -> list[int]:
    """Send ``n`` messages of ``size`` bytes; every one acknowledged; their log offsets."""
    offsets = []
    async with Producer(f"pool-ha-{prefix}", namesrv) as producer:
        for i in range(n):
            r = await producer.send(new_message(TOPIC, f"{prefix}{i}".encode().ljust(size)))
            assert r.status is SendStatus.SEND_OK
            offsets.append(parse_offset_msg_id(r.offset_msg_id)[1])
    return offsets


def test_a_pooled_master_ships_committed_bytes_only_and_a_pooled_slave_runs_without(
    tmp_path: Path,
) -> None:
    (tmp_path / "broker.conf").write_text(HA_POOL_CONF)
    with broker_group(tmp_path) as group:
        start_pooled_master(group)
        group.start_slave()
        ignored = events(group.slave_log(), "transient_store_pool_ignored")
        assert len(ignored) == 1 and "SLAVE" in str(ignored[0]["reason"]), group.slave_log()
        few = asyncio.run(send_numbered(group.namesrv, "few", 5, 100))
        # Acknowledged, in the master's buffer, not committed: neither readable there nor
        # shipped.  (The slave is streaming all along: it holds what the master commits.)
        committed = asyncio.run(log_end(group.master_addr))
        assert committed <= min(few)
        assert wait_caught_up(group) == committed
        many = asyncio.run(send_numbered(group.namesrv, "many", 400, 1024))
        asyncio.run(committed_past(group, max(few)))
        caught_up = wait_caught_up(group)
        assert caught_up > max(few)
        assert group.slave is not None and group.slave.stop() == 0, group.slave_log()
        assert group.master is not None and group.master.stop() == 0
    master = read_store(tmp_path / "master", TOPIC)
    slave = read_store(tmp_path / "slave", TOPIC)
    assert len(slave.raw) >= caught_up and master.raw.startswith(slave.raw)
    assert len(master.raw) > max(many)  # the master's close committed the rest
    received = [m.body.rstrip() for m in iter_records(slave.raw, check_crc=True)
                if m.topic == TOPIC]
    assert received[:5] == [f"few{i}".encode() for i in range(5)]



def test_evq_serve_with_the_pool_serves_what_it_acknowledged(tmp_path: Path) -> None:
    """``evq serve --transient-store-pool``: the flag reaches the store, and a consumer reads
    every acknowledged message once committed (its long poll woken by the commit)."""
    with (
        (tmp_path / "serve.log").open("w") as err,
        running_evq("--log-level", "info", "serve", "--port", "0", "--namesrv-port", "0",
                    "--data", str(tmp_path / "data"), "--transient-store-pool",
                    servers=2, stderr=err) as served,
    ):
        namesrv = served.addresses["namesrv"]
        lines = "".join(f"pooled {i}\n" for i in range(20))
        sent = run_evq("produce", "-n", namesrv, "-t", "Pooled", stdin=lines)
        assert sent.returncode == 0 and sent.stdout.count("SEND_OK") == 20, sent.stderr
        got = run_evq("consume", "-n", namesrv, "-t", "Pooled", "-g", "G", "--from-beginning",
                      "--count", "20")
        assert got.returncode == 0, got.stderr
        assert sorted(got.stdout.splitlines()) == sorted(lines.splitlines())
        assert served.stop() == 0
    assert len(events((tmp_path / "serve.log").read_text(), "transient_store_pool_enabled")) == 1
