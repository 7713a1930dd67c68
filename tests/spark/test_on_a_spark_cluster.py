"""The connector on a Spark standalone cluster (tests/spark/standalone.py), not ``local[2]``:
a master and two workers as separate JVMs, whose executors and Python workers reach the evq
cluster's name servers themselves.  A worker is killed in the middle of a streaming
micro-batch; the query finishes on the other worker and goes on from its checkpoint with
every message once.  Offline reads are run where the driver and the executors see different
directories.

The tests run in file order; the last one kills a worker.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from tests import waiting
from tests.cluster import Cluster
from tests.processes import running_evq, wait_registered
from tests.spark.conftest import spark_session
from tests.spark.standalone import Standalone, running_standalone
from tests.spark.test_on_a_cluster import read_whole_and_write_to_both, spread_topic
from tests.spark.test_spark_connector import produce, read

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="a Spark standalone cluster needs Java 17 on PATH")

WAIT_S = 120.0
wait_for = functools.partial(waiting.wait_for, within=WAIT_S, every=0.1)
"""Deadline of each wait below; on two shared cores a micro-batch takes a few seconds."""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    with running_standalone(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark(standalone: Standalone, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SparkSession]:
    """This module's session (in place of conftest's local[2]): one executor of one core on
    each worker, both registered before the first test."""
    with spark_session(standalone.url, tmp_path_factory.mktemp("spark-driver"),
                       **{"spark.executor.memory": "512m", "spark.executor.cores": "1",
                          "spark.cores.max": "2", "spark.driver.host": "127.0.0.1",
                          "spark.driver.bindAddress": "127.0.0.1"}) as session:
        assert session.sparkContext.master == standalone.url, session.sparkContext.master
        context = session.sparkContext._jsc.sc()
        wait_for("both executors to register with the driver",  # a snapshot per call:
                 lambda: context.getExecutorMemoryStatus().size() == 3)  # + the driver's
        yield session


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped broker's store directory holding 30 messages of SpOffline."""
    data = tmp_path_factory.mktemp("offline") / "data"
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(data), servers=2) as running:
        wait_registered(running.addresses["namesrv"], running.addresses["broker"])
        produce(running.addresses["namesrv"], "SpOffline", 30)
        assert running.stop() == 0
    return data


def test_executors_read_a_topic_of_both_groups_and_write_to_both(
        spark: SparkSession, cluster: Cluster) -> None:
    read_whole_and_write_to_both(spark, cluster)


def test_an_offline_relative_path_is_the_driver_s_directory(
        spark: SparkSession, store: Path) -> None:
    """Each executor runs in a scratch directory of its own: a relative path read there named
    nothing (the driver planned 30 messages, the tasks found no store)."""
    rows = read(spark, path=os.path.relpath(store), topic="SpOffline")
    assert sorted(int(bytes(r.body)) for r in rows) == list(range(30))


def test_an_offline_read_executors_cannot_see_fails_saying_what_they_need(
        spark: SparkSession, standalone: Standalone, store: Path) -> None:
    if standalone.hidden is None:
        pytest.skip("this kernel gives no mount namespace to hide a directory from executors")
    hidden = standalone.hidden / "data"
    shutil.copytree(store, hidden)  # the driver sees it; the workers see an empty tmpfs there
    with pytest.raises(Exception, match="every machine that runs Spark tasks") as failed:
        read(spark, path=str(hidden), topic="SpOffline")
    assert f"no evq store directory at {hidden}" in str(failed.value)


def caught_up(query: StreamingQuery) -> None:
    """``processAllAvailable`` with a deadline: a query that hangs is stopped and fails the
    test instead of holding it for ever."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            query.processAllAvailable()
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(WAIT_S)
    if worker.is_alive():
        query.stop()
        raise AssertionError(f"the query did not process what is available within {WAIT_S} s")
    if failures:
        raise failures[0]


HELD = 70
"""The message whose task is held until its worker is killed: in the second micro-batch."""


def hold_then_say_where(marker: Path) -> Callable[[str], str]:
    """The UDF: the working directory of the Python worker that saw a message (which names
    its executor and worker); the first to see message HELD says so in ``marker`` and waits
    there, its task in flight, for the test to kill its worker.  The task's retry passes."""

    def where(value: str) -> str:
        cwd = os.getcwd()
        if value == str(HELD) and not marker.exists():
            (marker.parent / "marker.tmp").write_text(cwd)
            os.replace(marker.parent / "marker.tmp", marker)
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:  # a hold, not a wait: SIGKILL ends it
                time.sleep(0.05)
            raise RuntimeError("the test never killed the worker running this task")
        return cwd

    return where


def test_a_worker_killed_mid_batch_loses_nothing_and_the_checkpoint_goes_on(
        spark: SparkSession, standalone: Standalone, cluster: Cluster, tmp_path: Path) -> None:
    spread_topic(cluster, "SpKill")
    sent = produce(cluster.namesrv, "SpKill", 120)
    out, checkpoint, marker = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "held"
    where = F.udf(hold_then_say_where(marker), "string", useArrow=False)  # no pandas here

    def start() -> StreamingQuery:
        return (spark.readStream.format("evq").option("namesrv", cluster.namesrv)
                .option("topic", "SpKill").option("startingOffsets", "earliest")
                .option("maxMessagesPerTrigger", "40").option("bodyAs", "string").load()
                .select("uniqKey", "value", where("value").alias("ranIn"))
                .writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).start())

    query = start()
    try:
        wait_for(f"a task to hold message {HELD}", marker.exists)
        victim = standalone.worker_of(marker.read_text())
        assert victim is not None, f"message {HELD} was not read under a worker"
        victim.kill()
        assert victim.session() == [], "the worker's executor or Python workers outlived it"
        caught_up(query)  # the lost task runs again on the other worker
    finally:
        query.stop()
    sent += produce(cluster.namesrv, "SpKill", 60, start=120)
    query = start()  # from the checkpoint, on the surviving worker
    try:
        caught_up(query)
    finally:
        query.stop()

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(int(r.value) for r in rows) == list(range(180))  # no gap, none twice
    assert sorted(r.uniqKey for r in rows) == sorted(sent)
    ran_on = {r.value: standalone.worker_of(r.ranIn) for r in rows}
    assert None not in ran_on.values(), "a message was read outside the workers' executors"
    assert set(ran_on.values()) == set(standalone.workers)
    survivor = next(w for w in standalone.workers if w is not victim)
    assert ran_on[str(HELD)] is survivor
