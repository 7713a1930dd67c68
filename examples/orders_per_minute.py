"""Structured Streaming: order totals per minute, from evq back into evq.

Reads the ``orders`` topic as a stream (JSON bodies decoded by the connector), sums the
amounts per one-minute window of order time, and writes each closed window as a JSON message
to ``orders-per-minute``.  Stop it with Ctrl-C; run it again and it goes on from its
checkpoint.  With ``--until-caught-up`` it stops by itself once it has processed everything
the topic holds and written every window that closes (a batch with no new data runs when the
watermark has passed a window, and emits it).

    python examples/orders_per_minute.py -n 127.0.0.1:9876 --checkpoint /tmp/opm-checkpoint
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
    parser.add_argument("-n", "--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--source", default="orders")
    parser.add_argument("--sink", default="orders-per-minute")
    parser.add_argument("--checkpoint", default="./evq-checkpoints/orders-per-minute",
                        help="where the query keeps its progress (beside ./evq-data: a "
                             "store wiped means this goes too)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--seconds", type=float, default=None,
                      help="stop after this long (default: run until interrupted)")
    stop.add_argument("--until-caught-up", action="store_true",
                      help="stop once every order the topic holds is aggregated and every "
                           "closed window written")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("orders-per-minute")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    evq.spark.register(spark)

    orders = (spark.readStream.format("evq").option("namesrv", args.namesrv)
              .option("topic", args.source).option("startingOffsets", "earliest")
              .option("bodyAs", "json")
              .option("bodySchema", "id BIGINT, customer STRING, amount DOUBLE, ts BIGINT")
              .option("maxMessagesPerTrigger", "10000").load()
              .select(F.col("value.*"))
              .where(F.col("ts").isNotNull())  # messages that are not orders are left out
              .withColumn("orderTime", F.timestamp_millis("ts")))
    per_minute = (orders.withWatermark("orderTime", "1 minute")
                  .groupBy(F.window("orderTime", "1 minute"))
                  .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total")))
    out = per_minute.select(
        F.lit(args.sink).alias("topic"),
        F.to_json(F.struct(F.col("window.start").alias("minute"), "orders", "total"))
        .alias("body"))
    query = (out.writeStream.format("evq").option("namesrv", args.namesrv)
             .option("checkpointLocation", args.checkpoint).outputMode("append").start())
    try:
        if args.until_caught_up:
            query.processAllAvailable()
        else:
            query.awaitTermination(args.seconds)
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    main()
