"""The quality checks a direct-path run leaves to Spark SQL: Great Expectations, `unique` other
than on the message key, and any row-level check the tasks' tallies do not settle exactly (a
type whose comparison may differ, more offending rows than a task keeps; quality/arrow_checks.py).

quality/gates.py judges them, as on the Spark SQL path, on the batch's decoded rows as a Spark
DataFrame, with the columns that path's decoder gives. The frame exists only while a stage that
needs it is judged, before anything is produced: a Kafka batch's rows come from the files the
scan kept them in (or are read again where a task finds none: direct/rows.py) and are kept for
the checks' jobs, read under the scan's time bound; a SQL batch is the read itself (JDBC, or a
bcp / pyodbc export), kept before the scan so that the checks and the messages come from the
same rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from dpone_dagster.direct import rows, task
from dpone_dagster.direct.row_form import rows_schema
from dpone_dagster.engine.direct_attempt import ToSparkSql
from dpone_dagster.quality.arrow_checks import RowCheck
from dpone_dagster.quality.gates import PRE_PUBLISH_TYPES, Measured, check_stage
from dpone_dagster.spark.jobs import BoundedJobs
from dpone_dagster.spark.keep import keep_batch, release_batch

ROW_LEVEL = tuple(t for t in PRE_PUBLISH_TYPES if t != "min_rows")


def row_level(checks: Sequence[Any]) -> bool:
    """Whether any check judges rows (min_rows and source_target_count count them only)."""
    return any(c.type in ROW_LEVEL for c in checks)


def keeps_rows(checks: Sequence[Any], measured_in_tasks: Sequence[RowCheck]) -> bool:
    """Whether the scan keeps the decoded rows (direct/rows.py): a row-level check is declared that
    the tasks do not measure (one they find they cannot settle reads the slices again)."""
    measured = {c.index for c in measured_in_tasks}
    return any(c.type in ROW_LEVEL and i not in measured for i, c in enumerate(checks))


def left_to_spark(checks: Sequence[Any], stage: str, measured: Measured) -> bool:
    """Whether a row-level check of `stage` is not among those the tasks `measured`."""
    return any(c.type in ROW_LEVEL and check_stage(c) == stage and i not in measured.checks for i, c in enumerate(checks))


def kafka_rows(
    spark: SparkSession,
    jobs: BoundedJobs,
    settings: task.DirectSettings,
    groups: list[list[task.Slice]],
    seconds: float,
    left_out: dict[int, np.ndarray],
    skip_deletes: bool,
    expected: int,
) -> DataFrame:
    """The decoded rows of the scan's `groups` (one task each) without `left_out` (per partition)
    and, when they are skipped, the deletes; kept (spark/keep.py: release it with release_batch).
    Read again, the batch must hold the `expected` rows the scan counted: a topic compacted or
    truncated since holds fewer, and the batch goes to the Spark SQL path (ToSparkSql), which
    reads it once for both its checks and its messages."""
    schema = from_arrow_schema(rows_schema(settings.schema))

    def read(batches: Any) -> Any:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from rows.judged_rows(settings, groups[index], left_out, skip_deletes)

    frame = keep_batch(spark.range(len(groups), numPartitions=max(1, len(groups))).mapInArrow(read, schema))
    try:
        found = jobs.run(frame.count, seconds, "the read of the batch's rows for the checks Spark SQL judges")
        if found != expected:
            raise ToSparkSql(f"the batch read again for its checks holds {found} record(s), not the {expected} the scan read")
    except BaseException:
        release_batch(frame)
        raise
    return frame
