"""The Spark source and sink through two name servers and two master/slave broker groups:
every queue of both groups is read, and rows written land on both."""

from __future__ import annotations

from pyspark.sql import SparkSession

from tests.cluster import GROUPS, Cluster
from tests.processes import run_evq
from tests.spark.test_spark_connector import produce, read


def spread_topic(cluster: Cluster, topic: str) -> None:
    """Create ``topic`` with two queues on each broker group."""
    out = run_evq("admin", "updateTopic", "-n", cluster.namesrv, "-t", topic,
                  "-c", "DefaultCluster", "-r", "2", "-w", "2")
    assert out.returncode == 0, out.stderr


def test_a_topic_spread_over_both_groups_is_read_whole_and_written_to_both(
        spark: SparkSession, cluster: Cluster) -> None:
    read_whole_and_write_to_both(spark, cluster)


def read_whole_and_write_to_both(spark: SparkSession, cluster: Cluster) -> None:
    """Read a topic of both groups, write one to both (test_on_a_spark_cluster.py runs this on
    the executors of a standalone Spark cluster)."""
    for topic in ("SpCluster", "SpClusterOut"):
        spread_topic(cluster, topic)
    keys = produce(cluster.namesrv, "SpCluster", 40)
    rows = read(spark, namesrv=cluster.namesrv, topic="SpCluster")
    assert sorted(r.uniqKey for r in rows) == sorted(keys)
    assert {r.brokerName for r in rows} == set(GROUPS)
    (spark.createDataFrame([(f"row {i}",) for i in range(20)], "body STRING")
     .write.format("evq").option("namesrv", cluster.namesrv).option("topic", "SpClusterOut")
     .option("batchSize", "1")  # one send a row: the producer spreads them over every queue
     .mode("append").save())
    written = read(spark, namesrv=cluster.namesrv, topic="SpClusterOut")
    assert sorted(bytes(r.body).decode() for r in written) == sorted(
        f"row {i}" for i in range(20))
    assert {r.brokerName for r in written} == set(GROUPS)
