"""One local[2] Spark session per test module, running the project's Python in its workers,
and a real ``evq serve`` for the live tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the 'spark' extra")

from pyspark.sql import SparkSession  # noqa: E402

import evq.spark  # noqa: E402
from tests.client.conftest import Served  # noqa: E402
from tests.processes import running_evq, wait_registered  # noqa: E402


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """Spark's workers are new Python processes: they run this interpreter with this checkout
    first on their path (the environment is put back once the module is done)."""
    path = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
        session = (SparkSession.builder.master("local[2]").appName("evq-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
                   .config("spark.driver.memory", "1g")
                   .getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        evq.spark.register(session)
        yield session
        session.stop()


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
