"""MSSQL CDC plans and the change columns of a CDC read.

`cdc.fn_cdc_get_all_changes_<capture_instance>` is read between the LSN after the stored one
(`sys.fn_cdc_increment_lsn`) and `sys.fn_cdc_get_max_lsn()` fixed at plan time; operation 1 becomes
`__dpone__op = delete`. LSNs are stored as `0x` + 20 hex digits.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.jdbc import JdbcTable


def plan_cdc(
    source: JdbcTable, spark: SparkSession, payload: list[T.ColumnInfo], stored: dict[str, Any] | None
) -> SqlBoundary:
    """Fix the LSN range: from the LSN after the stored one (or the oldest available) to the max LSN now."""
    if source.dialect != "mssql":
        raise ConfigError("sink.strategy.mode: cdc is only available for source.type: mssql")
    capture = source.options.capture_instance or T.default_capture_instance(source.table)
    min_rows = source.run_query(spark, T.cdc_min_lsn_query(capture), "read the CDC minimum LSN")
    min_lsn = min_rows[0][0] if min_rows else None
    if not min_lsn or T.normalize_lsn(min_lsn) == T.ZERO_LSN:
        raise ConfigError(
            f"CDC capture instance '{capture}' does not exist for {T.qualified_name('mssql', source.table)}. Fix: "
            "enable CDC (sys.sp_cdc_enable_db; sys.sp_cdc_enable_table) or set source.options.capture_instance."
        )
    max_rows = source.run_query(spark, T.cdc_max_lsn_query(), "read the CDC maximum LSN")
    to_lsn = T.normalize_lsn(max_rows[0][0]) if max_rows and max_rows[0][0] else None
    stored_lsn = None
    if stored:
        if stored.get("type") != "lsn":
            raise ConfigError(
                f"the stored watermark has type {stored.get('type')}, not an LSN (was the pipeline incremental "
                "before?). Fix: reset the pipeline's stored watermark and run a full_refresh first."
            )
        try:
            stored_lsn = T.normalize_lsn(stored["value"])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"the stored CDC watermark is invalid: {exc}. Fix: reset it.") from None
    if stored_lsn is None:
        from_lsn = T.normalize_lsn(min_lsn)
    else:
        rows = source.run_query(spark, T.cdc_increment_lsn_query(stored_lsn), "increment the stored LSN")
        from_lsn = T.normalize_lsn(rows[0][0])
        if T.compare_lsn(from_lsn, min_lsn) < 0:
            raise RunFailed(
                f"CDC changes after the stored LSN {stored_lsn} were removed by the CDC cleanup job (the oldest "
                f"available LSN of '{capture}' is {T.normalize_lsn(min_lsn)}). Run a full_refresh to resynchronise, "
                "then resume cdc; lengthen the cleanup retention to avoid this."
            )
    names = [c.name for c in payload]
    expressions = source.expressions(payload)
    empty = to_lsn is None or T.compare_lsn(from_lsn, to_lsn) > 0
    if empty:
        edge = to_lsn or from_lsn
        query = T.cdc_query(capture, edge, edge, names, expressions=expressions, empty=True)
    else:
        assert to_lsn is not None
        query = T.cdc_query(capture, from_lsn, to_lsn, names, expressions=expressions)
    new_value = to_lsn if to_lsn is not None and not empty else stored_lsn
    new_watermark = (
        {"column": "__$start_lsn", "value": new_value, "type": "lsn", "capture_instance": capture}
        if new_value
        else None
    )
    return SqlBoundary(
        method="cdc",
        table=T.qualified_name("mssql", source.table),
        column="__$start_lsn",
        lower=from_lsn,
        lower_inclusive=True,
        upper=to_lsn,
        query=query,
        total=None,
        new_watermark=new_watermark,
        dialect=source.dialect,
        kind="lsn",
        stored_watermark=dict(stored) if stored else None,
        empty=empty,
        columns=tuple(payload),
        notes=(
            f"cdc from {from_lsn} to {to_lsn} (max LSN at plan time) of capture instance '{capture}'"
            + (" (the LSN after the stored one)" if stored_lsn else " (the oldest available LSN)"),
            "operation 1 -> delete, 2 insert and 4 update (after image) -> upsert; ordered by (start_lsn, seqval, operation)",
        ),
    )


def change_columns(raw: DataFrame) -> tuple[DataFrame, Column, Column]:
    """The CDC read with its change columns present, and each row's __dpone__op and __dpone__order."""
    df = raw
    names = list(raw.columns)
    for name in (T.CDC_START_LSN, T.CDC_SEQVAL, T.CDC_OPERATION):
        if name not in names:
            df = df.withColumn(name, F.lit(None).cast("string" if name != T.CDC_OPERATION else "int"))
    op = F.when(F.col(T.CDC_OPERATION) == T.CDC_DELETE, F.lit(C.DELETE)).otherwise(F.lit(C.UPSERT))
    # Two changes of one statement may share (lsn, seqval): a delete then an insert (an update of
    # a unique key), so the operation breaks the tie, the same on every path.
    order = F.struct(F.col(T.CDC_START_LSN).alias("lsn"), F.col(T.CDC_SEQVAL).alias("seq"), F.col(T.CDC_OPERATION).alias("op"))
    return df, op, order
