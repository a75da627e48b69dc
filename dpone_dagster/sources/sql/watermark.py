"""Incremental plans: the window `column >= lower AND column <= upper` (rowversion: `< upper`) and
the watermark stored after sink success, `{"column", "value", "type"}` with the upper bound of this
run.

THE TIE RULE
------------
An incremental run reads `column >= lower AND column <= upper`.

- `upper` is MAX(column) queried BEFORE reading. Rows committed during the run with larger values
  belong to the next run; this run's stored watermark is `upper`.
- `lower` is the stored watermark and it is INCLUSIVE. Reading `column > stored` would lose every
  row committed later with the same value as the stored watermark (two transactions stamping the
  same `updated_at`, coarse timestamp precision, equal ids from concurrent inserts): the next run
  would start strictly after it. With `>=`, rows sitting exactly on the boundary value are read
  again by the next run: delivery is at-least-once on the boundary. With `sink.strategy.unique_key`
  (duplicate_policy keep_last) duplicates within a batch collapse by key, and consumers upsert by
  key, so the re-read is harmless.
- `lookback` widens the window to `column >= stored - lookback`, for late commits: rows that
  become visible after a run with a value *below* the stored watermark (a long transaction that
  stamped `updated_at` when it started). A number for numeric columns; seconds or an ISO-8601
  duration (PT15M, P1D) for datetime columns; a duration floored to whole days for dates.
- rowversion (MSSQL) is the exception: its upper bound is MIN_ACTIVE_ROWVERSION() and EXCLUSIVE,
  `column >= lower AND column < upper` (see `_active_rowversion_window`): windows meet without
  overlap, so no row is read twice and none below an open transaction is skipped.
- Not covered by a watermark: rows whose column is NULL (never read by incremental runs), rows
  arriving with a value below `stored - lookback`, updates that do not change the column, and
  hard deletes (use cdc, or a `__dpone__op` column in the table: values `delete`/`d` become
  deletes).
- Watermark values are rendered by the server as ISO text in the column's own precision and sent
  back as untyped literals (see `text.literals`): the bounds do not depend on JVM/Python time zones.
  MySQL/MariaDB TIMESTAMP columns are instants (`timestamp_tz`), rendered and compared in the UTC
  session every connection gets (`text.mysql`); a `timestamp` watermark an earlier version stored
  for one was read in the session's default zone and is converted once (`_stored_in_utc`).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from pyspark.sql import SparkSession

from dpone_dagster.errors import ConfigError
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.jdbc import JdbcTable


def plan_incremental(
    source: JdbcTable,
    spark: SparkSession,
    catalog: Sequence[T.ColumnInfo],
    payload: list[T.ColumnInfo],
    stored: dict[str, Any] | None,
) -> SqlBoundary:
    """Fix the window: the upper bound (MAX(column); rowversion: MIN_ACTIVE_ROWVERSION()) and the row
    count from the stored watermark (minus lookback)."""
    column = source.options.incremental_column
    assert column is not None
    info = source.find_column(catalog, column, "source.options.incremental_column")
    kind = T.watermark_kind(source.dialect, info.data_type)
    if kind is None:
        raise ConfigError(
            f"source.options.incremental_column '{column}' has type {info.data_type}, which cannot order "
            "rows for a watermark. Fix: use a numeric, date/time or rowversion column (e.g. updated_at or an "
            "identity id), or strategy full_refresh."
        )
    stored, converted = _stored_in_utc(source, spark, stored, column, kind)
    stored_value = _stored_value(source, stored, column, kind)
    lookback = source.options.lookback
    try:
        lower = T.apply_lookback(kind, stored_value, lookback) if stored_value is not None else None
    except ValueError as exc:
        raise ConfigError(f"source.options.lookback: {exc}. Fix: correct lookback.") from None
    predicate = source.options.predicate
    if kind == "rowversion":
        upper, count, upper_inclusive = _active_rowversion_window(source, spark, column, lower)
    else:
        upper, count, upper_inclusive = _max_window(source, spark, column, kind, lower)
    empty = upper is None or not count
    extras = source.extra_columns(catalog, payload, column)
    if empty:
        read_predicate = T.and_predicates(f"({predicate})" if predicate else None, "1 = 0")
        query = source.select_sql(payload + extras, read_predicate)
        conditions = T.where_conditions(source.dialect, read_predicate)
    else:
        query = source.select_sql(payload + extras, predicate, column, lower, upper, kind, upper_inclusive)
        conditions = T.where_conditions(
            source.dialect, predicate, column, lower, True, upper, kind=kind, upper_inclusive=upper_inclusive
        )
    notes = [_window_note(source, column, lower, upper, stored_value, kind)]
    if converted:
        notes.append(converted)
    if empty:
        notes.append(_empty_note(column, lower, upper, upper_inclusive))
    notes.append(f"rows with NULL {column} are never read by incremental runs")
    new_watermark = None
    if not empty:
        new_watermark = {"column": column, "value": upper, "type": kind}
    elif stored:
        new_watermark = dict(stored)
    return SqlBoundary(
        method="incremental",
        table=T.qualified_name(source.dialect, source.table),
        column=column,
        lower=lower,
        lower_inclusive=True,
        upper=upper,
        query=query,
        total=int(count or 0),
        new_watermark=new_watermark,
        dialect=source.dialect,
        kind=kind,
        stored_watermark=dict(stored) if stored else None,
        empty=empty,
        columns=tuple(payload),
        extra_columns=tuple(extras),
        conditions=tuple(conditions),
        notes=tuple(notes),
        upper_inclusive=upper_inclusive,
    )


def _max_window(
    source: JdbcTable, spark: SparkSession, column: str, kind: str, lower: Any
) -> tuple[Any, int, bool]:
    """The inclusive upper bound MAX(column) and the rows from `lower`, in one query."""
    sql = T.max_query(
        source.dialect,
        source.table,
        column,
        source.options.predicate,
        kind=kind,
        lower=lower,
        with_count=True,
    )
    rows = source.run_query(spark, sql, "fix the upper bound")
    raw_upper, count = (rows[0][0], rows[0][1]) if rows else (None, 0)
    return watermark_value(kind, raw_upper), int(count or 0), True


def _active_rowversion_window(
    source: JdbcTable, spark: SparkSession, column: str, lower: Any
) -> tuple[Any, int, bool]:
    """The exclusive upper bound MIN_ACTIVE_ROWVERSION() and the rows in [lower, bound).

    Why not MAX(rowversion): a row gets its rowversion when written, not when committed. Under read
    committed snapshot a reader skips an open transaction's row (stamped 0x10) and sees a later
    committed one (0x11); a window ending at MAX = 0x11 stores 0x11 and the open row, committed
    after, is below every later window. MIN_ACTIVE_ROWVERSION() is the lowest rowversion of a
    transaction still open in the database (@@DBTS + 1 when none is): every row below it is
    committed, so `column < bound` reads nothing that can still appear later, and the next run's
    `column >= bound` starts where this one ended (a row rewritten since this plan has a new
    rowversion at or above the bound, so it is read by the next run, never lost). The bound is
    fixed by its own query, so the count and the read compare with the same value."""
    rows = source.run_query(spark, T.active_rowversion_query(), "fix the upper bound")
    upper = watermark_value("rowversion", rows[0][0]) if rows else None
    if upper is None:
        return None, 0, False
    sql = T.window_count_query(
        source.dialect,
        source.table,
        column,
        source.options.predicate,
        kind="rowversion",
        lower=lower,
        upper=upper,
        upper_inclusive=False,
    )
    counted = source.run_query(spark, sql, "count the rows of the window")
    return upper, int(counted[0][0] or 0) if counted else 0, False


def _window_note(source: JdbcTable, column: str, lower: Any, upper: Any, stored: Any, kind: str) -> str:
    if kind == "rowversion":
        start = f"{column} >= {lower} AND " if lower is not None else ""
        return (
            f"rowversion window {start}{column} < {upper}: the upper bound is MIN_ACTIVE_ROWVERSION() at plan "
            "time, exclusive (every row below it is committed); the next run starts at it, so no row is read "
            "twice or skipped"
        )
    if lower is None:
        return f"first incremental run: {column} <= {upper} (upper bound fixed before reading)"
    widened = (
        f" (stored {stored} minus lookback {source.options.lookback})" if source.options.lookback else ""
    )
    return (
        f"incremental window {column} >= {lower}{widened} AND {column} <= {upper}: the lower bound is inclusive, "
        "so rows at the stored watermark are read again (at-least-once on the boundary; unique_key + keep_last "
        "collapses them and consumers upsert by key); the upper bound is the maximum at plan time"
    )


def _empty_note(column: str, lower: Any, upper: Any, upper_inclusive: bool) -> str:
    window = f"{column} >= {lower}" if lower is not None else f"any {column}"
    if not upper_inclusive and upper is not None:
        window += f" below {upper}"
    return f"no rows with {window}: nothing to read; the stored watermark is kept"


def _stored_in_utc(
    source: JdbcTable, spark: SparkSession, stored: dict[str, Any] | None, column: str, kind: str
) -> tuple[dict[str, Any] | None, str | None]:
    """A MySQL/MariaDB TIMESTAMP watermark stored as `timestamp` by a version that read it in the
    session's default zone, converted to the UTC the session now uses (`timestamp_tz`); otherwise
    `stored` as it is. Taken at its word, a watermark written at +02:00 would skip two hours of rows.
    Returns the watermark and a note when it was converted."""
    if not (
        source.dialect == "mysql"
        and kind == "timestamp_tz"
        and isinstance(stored, dict)
        and stored.get("type") == "timestamp"
        and stored.get("column") in (None, column)
        and stored.get("value") is not None
    ):
        return stored, None
    try:
        literal = T.watermark_literal(source.dialect, "timestamp", stored["value"])
    except ValueError as exc:
        raise ConfigError(
            f"the stored watermark is invalid: {exc}. Fix: reset the pipeline's stored watermark."
        ) from None
    zone = source.configured_time_zone()
    rows = source.run_query(
        spark, T.mysql_utc_from_zone_query(literal, zone), "convert the stored watermark to UTC"
    )
    utc, used = (rows[0][0], rows[0][1]) if rows else (None, zone)
    if utc is None:
        raise ConfigError(
            f"the stored watermark {stored['value']} of TIMESTAMP column '{column}' was read in the session "
            f"time zone {used}, which the server cannot convert to UTC (named zones need its time zone "
            "tables). Fix: load them (mysql_tzinfo_to_sql), or reset the pipeline's stored watermark."
        )
    value = watermark_value("timestamp_tz", utc)
    note = (
        f"stored watermark {stored['value']} of TIMESTAMP column {column} was read in the session time zone "
        f"{used} by an earlier version: converted to {value} UTC"
    )
    return {**stored, "value": value, "type": "timestamp_tz"}, note


def _stored_value(source: JdbcTable, stored: dict[str, Any] | None, column: str, kind: str) -> Any:
    if not stored:
        return None
    if not isinstance(stored, dict) or "value" not in stored:
        raise ConfigError(
            "the stored watermark is not a {column, value, type} mapping. Fix: reset the pipeline's stored "
            "watermark so that the next run starts from scratch."
        )
    if stored.get("column") not in (None, column):
        raise ConfigError(
            f"the stored watermark is for column '{stored.get('column')}' but source.options.incremental_column "
            f"is '{column}'. Fix: restore incremental_column, or reset the pipeline's stored watermark (the next "
            "run then reads the whole table)."
        )
    if stored.get("type") not in (None, kind):
        raise ConfigError(
            f"the stored watermark has type {stored.get('type')} but column '{column}' is now {kind}. Fix: reset "
            "the pipeline's stored watermark."
        )
    value = stored["value"]
    if value is None:
        return None
    try:
        T.watermark_literal(source.dialect, kind, value)
    except ValueError as exc:
        raise ConfigError(
            f"the stored watermark is invalid: {exc}. Fix: reset the pipeline's stored watermark."
        ) from None
    return value


def watermark_value(kind: str, raw: Any) -> Any:
    """The MAX read back, as the JSON value stored in the watermark."""
    if raw is None:
        return None
    if kind == "integer":
        return int(raw)
    if kind in ("decimal", "float"):
        return format(Decimal(str(raw)), "f") if not isinstance(raw, float) else repr(raw)
    if kind in ("timestamp", "timestamp_tz"):
        text = str(raw).strip()
        head, dot, fraction = text.partition(".")
        fraction = fraction.rstrip("0")
        return head.replace(" ", "T") + (f".{fraction}" if fraction else "")
    if kind == "rowversion":
        return "0x" + str(raw)[2:].upper()
    return str(raw)
