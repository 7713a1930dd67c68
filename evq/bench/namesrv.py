"""How long a large broker registration holds the name server's event loop.

Anyone who reaches a name server without an ACL may register a broker, with a topic table up
to the name server's bound (``maxTopicQueues``, a million), so what one registration costs the
loop is what every other client of the name server may be made to wait.  For each size:

* **table**: :meth:`~evq.net.routes.RouteTable.register` of a broker with that many topics
  into a fresh table, then the same broker's changed table (every queue count moved), each
  applied whole in one call: the CPU an apply costs, wherever it runs;
* **socket**: a :class:`~evq.net.namesrv.NameServer` on 127.0.0.1 with a
  :class:`~evq.net.loop_lag.LoopLag` watching its loop, one connection asking a topic's
  route again and again, and a broker connection sending that table as one compressed
  REGISTER_BROKER (as a Java broker sends a large one): first as it is, then changed, then
  the changed one again (a heartbeat, which the name server tells by the body's digest and
  answers without decoding it): the loop's longest stall while the registrations run, the
  slowest route lookup meanwhile, and each registration's round trip; then the broker's
  connection closed: how long its table took to go, and the loop's longest stall meanwhile.

The bodies are encoded before anything is timed.  The clients share the name server's loop
(their work is small: one request at a time), so the stall is an upper bound.

    python -m evq.bench.namesrv --topics 300000,1000000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Sequence

import attrs

from evq import logs
from evq.domain.codes import ResponseCode
from evq.domain.topics import TopicConfig
from evq.net.codes import RequestCode
from evq.net.headers.namesrv import GetRouteInfoRequest
from evq.net.loop_lag import LoopLag
from evq.net.namesrv import NameServer
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import BrokerIdentity, DataVersion, RegisterBrokerBody
from evq.net.routes import RouteTable
from evq.net.transport import RemotingClient

HOST = "127.0.0.1"
BROKER = BrokerIdentity(cluster="C", broker_name="bench-broker", broker_id=0,
                        broker_addr="127.0.0.1:10911")
LOOKED_UP = "topic-0"
TIMEOUT_S = 120.0


@attrs.frozen(kw_only=True)
class SizeResult:
    topics: int
    first_apply_s: float
    changed_apply_s: float
    first_round_trip_s: float
    changed_round_trip_s: float
    heartbeat_round_trip_s: float
    max_stall_s: float
    slowest_lookup_s: float
    lookups: int
    drop_s: float
    drop_max_stall_s: float


def tables(n: int) -> tuple[list[TopicConfig], list[TopicConfig]]:
    """A table of ``n`` topics and the same names with other queue counts."""
    names = [f"topic-{i}" for i in range(n)]
    return ([TopicConfig(topic_name=t, read_queue_nums=8, write_queue_nums=8) for t in names],
            [TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4) for t in names])


def time_table(first: list[TopicConfig], changed: list[TopicConfig]) -> tuple[float, float]:
    rt = RouteTable()
    took = []
    for table in (first, changed):
        start = time.perf_counter()
        rt.register(cluster=BROKER.cluster, broker_name=BROKER.broker_name,
                    broker_addr=BROKER.broker_addr, broker_id=BROKER.broker_id,
                    ha_server_addr="", topics=table, now_ms=0)
        took.append(time.perf_counter() - start)
    return took[0], took[1]


@attrs.frozen(kw_only=True)
class SocketTimes:
    """What :func:`time_socket` measured (the stall and lookup figures are the registrations';
    the ``drop_`` ones the close's)."""

    trips: list[float]
    max_stall_s: float
    slowest_lookup_s: float
    lookups: int
    drop_s: float
    drop_max_stall_s: float


async def time_socket(bodies: Sequence[bytes]) -> SocketTimes:
    """Round trips of each body registered in turn; the longest stall and slowest lookup
    seen while they ran; lookups answered; then, the broker's connection closed, how long its
    table took to go and the longest stall meanwhile."""
    lag = LoopLag(interval=0.002)
    slowest = 0.0
    lookups = 0
    done = False

    async def look_up(client: RemotingClient) -> None:
        nonlocal slowest, lookups
        request = GetRouteInfoRequest.write(topic=LOOKED_UP)
        while not done:
            start = time.perf_counter()  # the pause counts: a stall may fall in it
            await asyncio.sleep(0.001)
            answer = await client.invoke(
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, request), TIMEOUT_S)
            slowest = max(slowest, time.perf_counter() - start)
            lookups += answer.code in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST)

    async with NameServer(HOST, 0) as server, RemotingClient(HOST, server.port) as client:
        broker = RemotingClient(HOST, server.port)
        watcher = asyncio.create_task(lag.run())
        looker = asyncio.create_task(look_up(client))
        trips = []
        for body in bodies:
            start = time.perf_counter()
            answer = await broker.invoke(RemotingCommand.request(
                RequestCode.REGISTER_BROKER, BROKER.register_fields(compressed=True), body),
                TIMEOUT_S)
            trips.append(time.perf_counter() - start)
            if answer.code != ResponseCode.SUCCESS:
                raise SystemExit(f"registration refused: {answer.remark}")
        registering_stall, lag.max_stall = lag.max_stall, 0.0
        start = time.perf_counter()
        await broker.close()
        routes = server.routes
        while BROKER.broker_addr in routes.live or routes.leaving:  # the close, then the drop
            await asyncio.sleep(0.001)
        drop_s = time.perf_counter() - start
        done = True
        await looker
        watcher.cancel()
    return SocketTimes(trips=trips, max_stall_s=registering_stall, slowest_lookup_s=slowest,
                       lookups=lookups, drop_s=drop_s, drop_max_stall_s=lag.max_stall)


def run_size(n: int) -> SizeResult:
    first, changed = tables(n)
    first_s, changed_s = time_table(first, changed)
    bodies = [RegisterBrokerBody(topics=tuple(t), data_version=DataVersion(0, v)).encode(True)
              for v, t in enumerate((first, changed), 1)]
    del first, changed
    gc.collect()
    times = asyncio.run(time_socket([*bodies, bodies[-1]]))
    return SizeResult(topics=n, first_apply_s=first_s, changed_apply_s=changed_s,
                      first_round_trip_s=times.trips[0], changed_round_trip_s=times.trips[1],
                      heartbeat_round_trip_s=times.trips[2], max_stall_s=times.max_stall_s,
                      slowest_lookup_s=times.slowest_lookup_s, lookups=times.lookups,
                      drop_s=times.drop_s, drop_max_stall_s=times.drop_max_stall_s)


def format_result(r: SizeResult) -> str:
    return (f"{r.topics:>9,} topics  table apply: first {r.first_apply_s:.2f} s, "
            f"changed {r.changed_apply_s:.2f} s ({r.first_apply_s / r.topics * 1e6:.2f} us a "
            f"topic)\n{'':>17}socket: round trip first {r.first_round_trip_s:.2f} s, changed "
            f"{r.changed_round_trip_s:.2f} s, heartbeat {r.heartbeat_round_trip_s * 1000:.1f} ms; "
            f"longest loop stall {r.max_stall_s * 1000:.0f} ms,"
            f" slowest lookup {r.slowest_lookup_s * 1000:.0f} ms, 1 ms pause included "
            f"({r.lookups} lookups)\n{'':>17}closed: table dropped in {r.drop_s:.2f} s, "
            f"longest loop stall {r.drop_max_stall_s * 1000:.0f} ms")


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m evq.bench.namesrv", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", default="300000,1000000",
                   help="comma-separated table sizes (default: 300000,1000000)")
    args = p.parse_args(argv)
    logs.configure("warning")
    for n in (int(s) for s in args.topics.split(",")):
        print(format_result(run_size(n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
