"""Batch job over a store directory, without a running broker: revenue per customer.

    python examples/offline_report.py --path ./evq-data --backend mmap
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import evq.spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="./evq-data", help="the broker's data directory")
    parser.add_argument("--backend", default="mmap")
    parser.add_argument("--topic", default="orders")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master("local[2]").appName("offline-report").getOrCreate()
    evq.spark.register(spark)
    messages = (spark.read.format("evq").option("path", args.path)
                .option("backend", args.backend).option("topic", args.topic)
                .option("bodyAs", "json")
                .option("bodySchema", "id BIGINT, customer STRING, amount DOUBLE, ts BIGINT")
                .load())
    # A topic may hold messages that are not orders (the README's first examples send text):
    # they are counted and left out rather than failing the report.
    orders = messages.select("value.*").where(F.col("customer").isNotNull())
    skipped = messages.count() - orders.count()
    if skipped:
        print(f"skipped {skipped} messages whose body is not an order", file=sys.stderr)
    report = (orders.groupBy("customer")
              .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
              .orderBy(F.desc("revenue")))
    for row in report.collect():
        print(f"{row.customer:<10} {row.orders:>6} {row.revenue:>12.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
