"""Keeping a batch for the passes of a run, on the shared local Spark session."""

from __future__ import annotations

from pyspark.sql import functions as F

from dpone_dagster.spark.keep import keep_batch, keeps_rows, release_batch


def _cached_rdds(spark) -> int:
    return sum(1 for info in spark.sparkContext._jsc.sc().getRDDStorageInfo() if info.numCachedPartitions() > 0)


def test_local_mode_keeps_rows_computed_once_and_released(spark):
    source = spark.range(0, 5_000, 1, 4).select(F.col("id"), (F.col("id") % 7).alias("k"))
    before = _cached_rdds(spark)
    assert keeps_rows(source)
    kept = keep_batch(source)
    try:
        assert kept.groupBy("k").count().count() == 7  # the first pass computes and keeps it
        assert _cached_rdds(spark) == before + 1
        plan = kept._jdf.queryExecution().optimizedPlan().toString()
        assert "Range" not in plan  # later passes read the kept rows, not the source
        assert kept.agg(F.sum("id")).first()[0] == sum(range(5_000))
    finally:
        release_batch(kept)
    assert _cached_rdds(spark) == before
