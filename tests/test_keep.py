"""Keeping a batch for the passes of a run, on the shared local Spark session."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import functions as F

from dpone_dagster.spark.keep import keep_batch, keeps_rows, release_batch


def _persistent_rdds(spark) -> int:
    return spark.sparkContext._jsc.getPersistentRDDs().size()


def test_local_mode_keeps_rows_computed_once_and_released(spark):
    computed = spark.sparkContext.accumulator(0)

    def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            computed.add(batch.num_rows)  # how many rows the source produced, over all passes
            yield batch

    source = spark.range(0, 5_000, 1, 4).mapInArrow(rows, "id long").select("id", (F.col("id") % 7).alias("k"))
    before = _persistent_rdds(spark)
    assert keeps_rows(source)
    kept = keep_batch(source)
    try:
        assert kept.groupBy("k").count().count() == 7
        assert kept.agg(F.sum("id")).first()[0] == sum(range(5_000))
        assert kept.where("k = 3").count() == len(range(3, 5_000, 7))
        assert computed.value == 5_000  # three passes, the source computed once
        assert _persistent_rdds(spark) == before + 1
    finally:
        release_batch(kept)
    assert _persistent_rdds(spark) == before
