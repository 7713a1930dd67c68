"""evq as a Spark 4 data source: ``evq.spark.register(spark)``, then ``format("evq")``.

Reads (batch and streaming) take ``namesrv`` (a live cluster) or ``path`` + ``backend`` (a
store directory, offline); writes take ``namesrv``.  PySpark is an optional dependency
(``pip install 'evq[spark]'``), imported only here.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``spark.read.format("evq")`` and friends available in this session."""
    from evq.spark.source import EvqDataSource

    spark.dataSource.register(EvqDataSource)


__all__ = ["register"]
