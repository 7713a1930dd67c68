"""One local[2] Spark session per test module, running the project's Python in its workers,
a real ``evq serve`` for the live tests, and a two-group evq cluster for the cluster tests."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the 'spark' extra")

from pyspark.sql import SparkSession  # noqa: E402

import evq.spark  # noqa: E402
from tests.client.conftest import Served  # noqa: E402
from tests.cluster import Cluster, running_cluster  # noqa: E402
from tests.processes import running_evq, wait_registered  # noqa: E402


@contextlib.contextmanager
def spark_session(master: str, local_dir: Path, **conf: str) -> Iterator[SparkSession]:
    """A session on ``master`` with the ``evq`` format registered.  Spark's workers are new
    Python processes: they run this interpreter with this checkout first on their path (the
    environment is put back once the session is stopped)."""
    path = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
        builder = (SparkSession.builder.master(master).appName("evq-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.local.dir", str(local_dir))
                   .config("spark.driver.memory", "1g"))
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        evq.spark.register(session)
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] session per test module."""
    with spark_session("local[2]", tmp_path_factory.mktemp("spark-local")) as session:
        yield session


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("evq-live")
    with running_evq("--log-level", "warning", "serve", "--port", "0", "--namesrv-port", "0",
                     "--data", str(data), servers=2) as running:
        served = Served(running.addresses["namesrv"], running.addresses["broker"],
                        running.proc)
        wait_registered(served.namesrv, served.broker)
        yield served
        assert running.stop() == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two name servers and two master/slave broker groups (tests/cluster.py)."""
    with running_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c
