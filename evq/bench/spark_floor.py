"""The Spark floor of ``evq bench spark``: a Python data source whose tasks hand Spark one
prepared Arrow batch of the ``evq`` schema over and over and read nothing.

What Spark does with each row a Python source yields (taking the Arrow batches in, turning
them into its rows, running the query) costs the ``evq`` format just as much, so a read of a
topic can at best match this source's rate on the same machine; the benchmark reports the
``count()`` as a share of it.  Imported only where PySpark is installed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from evq.spark.options import BodyAs
from evq.spark.schema import schema_ddl

FORMAT: Final = "evq-bench-floor"


def save_batch(batch: pa.RecordBatch, path: Path) -> None:
    """Where the source's tasks read the batch from (an Arrow IPC file)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


class FloorSource(DataSource):
    """Options: ``path`` (the batch, :func:`save_batch`), ``rows`` in all, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return schema_ddl(BodyAs.BINARY, None)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorReader(self.options["path"], int(self.options["rows"]),
                           int(self.options["partitions"]))


class FloorReader(DataSourceReader):
    def __init__(self, path: str, rows: int, partitions: int) -> None:
        self.path, self.rows, self.parts = path, rows, partitions

    def partitions(self) -> Sequence[InputPartition]:
        share, extra = divmod(self.rows, self.parts)
        return [InputPartition(share + (i < extra)) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(self.path) as source:
            batch = pa.ipc.open_file(source).get_batch(0)
        left: int = partition.value
        while left > 0:
            piece = batch.slice(0, min(left, batch.num_rows))
            left -= piece.num_rows
            yield piece
