"""The Spark benchmark: how fast the ``evq`` format reads a live topic, against how fast the
broker serves the same messages to a plain pulling client.

One run, against one ``evq serve`` child (a name server and a broker in one process, as a
first-day user starts it) with its store in a scratch directory:

* **fill**: ``messages`` small JSON bodies (``{"id": i, "kind": "k<i % 10>", "amount": ...}``)
  sent with ``send_batch`` in batches of ``batch`` to one topic;
* **pull floor**: every queue of the topic read from its first offset to its end by raw
  PULL_MESSAGE requests from this process, one pull in flight per queue, records counted but
  not decoded: the rate the broker serves, which no reader of the topic can beat;
* **count**: ``spark.read.format("evq")...load().count()`` on ``local[2]`` (after one untimed
  run of the same query, so the JVM, the Python workers and the broker's page cache are warm);
* **Spark floor**: the same ``count()`` over :mod:`evq.bench.spark_floor`, a source that
  yields one batch the ``evq`` format made from the topic, over and over: Spark's own cost
  per row of a Python source, which the ``evq`` format pays as well;
* **groupBy**: ``bodyAs=json`` with a three-field ``bodySchema``, grouped by one JSON field;
* **write**: ``messages`` rows (``body`` a JSON string) written with ``df.write.format("evq")``
  to a second topic, the rows read back and counted; its floor is the fill's rate (the same
  batch sends, from one plain client).

Each Spark figure is rows per second of wall-clock time for the whole query (planning
included), and is reported with its ratio to its floor.  PySpark is the ``spark``
extra; the Spark workers run this interpreter with this checkout first on their path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs

from evq import logs
from evq.admin.operations import Admin, AdminError
from evq.bench.net import count_records
from evq.bench.scaffold import scratch
from evq.bench.store import BenchError
from evq.client.blocking import SyncProducer
from evq.client.pulling import Subscription, pull_request
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.message import new_message
from evq.domain.queues import MessageQueue
from evq.net.headers.pull import PullResponse

log = logs.get_logger(__name__)

READ_TOPIC: Final = "BenchSparkRead"
WRITE_TOPIC: Final = "BenchSparkWrite"
PRODUCER_GROUP: Final = "BenchSparkProducer"
PULL_GROUP: Final = "BenchSparkFloor"
FLOOR_PULL_BATCH: Final = 256
KINDS: Final = 10
BODY_SCHEMA: Final = "id BIGINT, kind STRING, amount DOUBLE"
LISTENING: Final = re.compile(r"evq (namesrv|broker) listening on (\S+)")
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
REGISTRATION_TIMEOUT_S: Final = 30.0


@attrs.frozen(kw_only=True)
class SparkBenchOptions:
    messages: int = 200_000
    batch: int = 32
    master: str = "local[2]"
    data: Path | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("messages", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


@attrs.frozen(kw_only=True)
class SparkBenchResult:
    """One run's figures; attribute names are the JSON keys."""

    messages: int
    batch: int
    master: str
    pyspark: str
    fill_msgs_per_s: float
    pull_floor_msgs_per_s: float
    count_rows_per_s: float
    spark_floor_rows_per_s: float
    groupby_rows_per_s: float
    write_rows_per_s: float

    @property
    def count_floor_ratio(self) -> float:
        return self.count_rows_per_s / self.pull_floor_msgs_per_s

    @property
    def count_spark_floor_ratio(self) -> float:
        return self.count_rows_per_s / self.spark_floor_rows_per_s

    @property
    def groupby_floor_ratio(self) -> float:
        return self.groupby_rows_per_s / self.pull_floor_msgs_per_s

    @property
    def write_fill_ratio(self) -> float:
        """The Spark write against the fill: the same batch sends from one plain client."""
        return self.write_rows_per_s / self.fill_msgs_per_s

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "count_floor_ratio": round(self.count_floor_ratio, 3),
                "count_spark_floor_ratio": round(self.count_spark_floor_ratio, 3),
                "groupby_floor_ratio": round(self.groupby_floor_ratio, 3),
                "write_fill_ratio": round(self.write_fill_ratio, 3)}


def format_report(r: SparkBenchResult) -> str:
    rows = [
        ("fill (send_batch)", r.fill_msgs_per_s, None),
        ("broker pull floor", r.pull_floor_msgs_per_s, None),
        ("spark count()", r.count_rows_per_s, r.count_floor_ratio),
        ("spark floor count()", r.spark_floor_rows_per_s, None),
        ("spark JSON groupBy", r.groupby_rows_per_s, r.groupby_floor_ratio),
        ("spark write", r.write_rows_per_s, r.write_fill_ratio),
    ]
    lines = [f"evq bench spark: {r.messages} messages, {r.master}, pyspark {r.pyspark}",
             f"{'phase':<22}{'rows/s':>12}{'of floor':>10}"]
    for name, rate, ratio in rows:
        share = "" if ratio is None else f"{ratio:.2f}"
        lines.append(f"{name:<22}{rate:>12,.0f}{share:>10}")
    lines.append("floor: the broker's pull rate for reads, the fill's send rate for the write")
    lines.append(f"spark count() is {r.count_spark_floor_ratio:.2f} of the Spark floor (a "
                 "Python source yielding one prepared batch)")
    return "\n".join(lines)


def run_spark_bench(opts: SparkBenchOptions) -> SparkBenchResult:
    try:
        import pyspark
    except ImportError:
        raise BenchError("evq bench spark needs PySpark: pip install 'evq[spark]'") from None
    with scratch(opts.data, prefix="evq-bench-spark-") as root, \
            _serving(root / "data") as (namesrv, broker):
        _wait_registered(namesrv, broker)
        fill = _fill(namesrv, opts)
        floor = asyncio.run(_pull_floor(namesrv, opts.messages))
        with _session(opts.master, root / "spark") as spark:
            reader = (spark.read.format("evq").option("namesrv", namesrv)
                      .option("topic", READ_TOPIC))
            count = _rows_per_s(opts.messages, lambda: reader.load().count())
            spark_floor = _spark_floor(spark, namesrv, reader.load().schema, root,
                                       opts.messages)
            grouped = reader.option("bodyAs", "json").option("bodySchema", BODY_SCHEMA)
            groupby = _rows_per_s(opts.messages, lambda: sum(
                r["count"] for r in grouped.load().groupBy("value.kind").count().collect()))
            write = _write(spark, namesrv, opts.messages)
    return SparkBenchResult(
        messages=opts.messages, batch=opts.batch, master=opts.master,
        pyspark=pyspark.__version__, fill_msgs_per_s=fill, pull_floor_msgs_per_s=floor,
        count_rows_per_s=count, spark_floor_rows_per_s=spark_floor,
        groupby_rows_per_s=groupby, write_rows_per_s=write)


def _body(i: int) -> bytes:
    return b'{"id": %d, "kind": "k%d", "amount": %d.5}' % (i, i % KINDS, i)


def _fill(namesrv: str, opts: SparkBenchOptions) -> float:
    started = time.perf_counter()
    with SyncProducer(PRODUCER_GROUP, namesrv) as producer:
        for lo in range(0, opts.messages, opts.batch):
            batch = [new_message(READ_TOPIC, _body(i))
                     for i in range(lo, min(lo + opts.batch, opts.messages))]
            producer.send_batch(batch)
    return opts.messages / (time.perf_counter() - started)


async def _pull_floor(namesrv: str, expected: int) -> float:
    """Every queue of the read topic pulled to its end, records counted by their sizes."""
    sub = Subscription(READ_TOPIC)
    async with Admin(namesrv) as admin:
        route = await admin.topic_route(READ_TOPIC)
        queues = route.subscribe_queues()

        async def drain(mq: MessageQueue) -> int:
            addr = route.master(mq.broker_name)
            assert addr is not None
            offset = got = 0
            while True:
                cmd = pull_request(PULL_GROUP, mq, offset, sub, max_nums=FLOOR_PULL_BATCH,
                                   suspend_ms=0)
                answer = await admin.pool.invoke(addr, cmd)
                if answer.code != ResponseCode.SUCCESS:
                    return got
                got += count_records(answer.body)
                offset = PullResponse.read(answer.ext_fields).next_begin_offset

        started = time.perf_counter()
        pulled = sum(await asyncio.gather(*(drain(q) for q in queues)))
        elapsed = time.perf_counter() - started
    if pulled != expected:
        raise BenchError(f"the pull floor read {pulled} messages, expected {expected}")
    return pulled / elapsed


def _rows_per_s(expected: int, query: Callable[[], int]) -> float:
    """The query's rate on its second run (the first warms the JVM, the Python workers and
    the broker's page cache); both runs must see ``expected`` rows."""
    elapsed = 0.0
    for _ in range(2):
        started = time.perf_counter()
        got = query()
        elapsed = time.perf_counter() - started
        if got != expected:
            raise BenchError(f"a Spark query counted {got} rows, expected {expected}")
    return expected / elapsed


def _spark_floor(spark: Any, namesrv: str, schema: Any, root: Path, rows: int) -> float:
    from evq.bench.spark_floor import FORMAT, FloorSource, save_batch
    from evq.spark.access import LiveAccess
    from evq.spark.columns import BatchMaker
    from evq.spark.options import parse_source

    opts = parse_source({"namesrv": namesrv, "topic": READ_TOPIC}, streaming=False)
    access = LiveAccess(namesrv)
    try:
        queues = access.queues(opts)
        queue = queues[0]
        lo, hi = access.bounds(queue)
        block = next(access.read_blocks(queue, lo, hi))
    finally:
        access.close()
    path = root / "floor.arrow"
    save_batch(BatchMaker.of(opts, schema, queue[1]).batch(block, hi), path)
    spark.dataSource.register(FloorSource)
    floor = (spark.read.format(FORMAT).option("path", str(path)).option("rows", str(rows))
             .option("partitions", str(len(queues))))
    return _rows_per_s(rows, lambda: floor.load().count())


def _write(spark: Any, namesrv: str, n: int) -> float:
    df = spark.range(n).selectExpr(
        f"to_json(named_struct('id', id, 'kind', concat('k', id % {KINDS}), "
        "'amount', id + 0.5)) AS body").cache()
    df.count()  # the rows exist before the clock starts
    started = time.perf_counter()
    (df.write.format("evq").option("namesrv", namesrv).option("topic", WRITE_TOPIC)
     .mode("append").save())
    elapsed = time.perf_counter() - started
    back = (spark.read.format("evq").option("namesrv", namesrv).option("topic", WRITE_TOPIC)
            .load().count())
    if back != n:
        raise BenchError(f"the Spark write sent {back} rows, expected {n}")
    return n / elapsed


@contextlib.contextmanager
def _serving(data: Path) -> Iterator[tuple[str, str]]:
    """``evq serve`` in a child process: the name server's and the broker's addresses."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "evq.cli", "--log-level", "warning", "serve", "--port", "0",
         "--namesrv-port", "0", "--data", str(data)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": _checkout()})
    assert proc.stdout is not None
    try:
        addresses: dict[str, str] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(addresses) < 2:
            line = proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise BenchError("evq serve stopped or did not listen within "
                                 f"{START_TIMEOUT_S:g} s")
            if m := LISTENING.search(line):
                addresses[m[1]] = m[2]
        yield addresses["namesrv"], addresses["broker"]
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_registered(namesrv: str, broker: str) -> None:
    """A broker prints where it listens before its first registration reaches the name
    server; a producer asking in between is told no topic exists."""
    async def routed() -> bool:
        async with Admin(namesrv) as admin:
            try:
                route = await admin.topic_route(tp.AUTO_CREATE_TOPIC)
            except AdminError:
                return False
        return any(route.master(name) == broker for name in route.brokers)

    deadline = time.monotonic() + REGISTRATION_TIMEOUT_S
    while not asyncio.run(routed()):
        if time.monotonic() > deadline:
            raise BenchError(f"the broker at {broker} never registered with {namesrv}")
        time.sleep(0.05)


def _checkout() -> str:
    """The directory evq is imported from, first on the Spark workers' path."""
    return os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
                                       os.environ.get("PYTHONPATH", "")) if p)


@contextlib.contextmanager
def _session(master: str, local_dir: Path) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    import evq.spark

    os.environ.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      PYTHONPATH=_checkout())
    session = (SparkSession.builder.master(master).appName("evq-bench-spark")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.local.dir", str(local_dir))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    evq.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


__all__ = ["SparkBenchOptions", "SparkBenchResult", "format_report", "run_spark_bench"]
