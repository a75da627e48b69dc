"""The SELECTs a plan and an extract send: the bounded read, its upper bound and row count, the
catalog lookup, and the partitioning queries.

Partitioned reads
-----------------
`bounds_query` gives MIN/MAX of a numeric/date partition column (Spark's partitionColumn /
lowerBound / upperBound / numPartitions). For other keys, `hash_predicate` builds one predicate per
partition index: mssql `ABS(CAST(CHECKSUM(col) AS BIGINT)) % n = i` (the BIGINT cast avoids the
overflow of ABS(-2147483648)), postgres `abs(hashtext(col::text)::bigint) % n = i`, mysql
`CRC32(col) % n = i`. Partition 0 also takes `col IS NULL` (NULL hashes to NULL), so every row
lands in exactly one partition.

Manifest predicates are trusted SQL and are wrapped in parentheses unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpone_dagster.sources.sql.text.column_types import select_item
from dpone_dagster.sources.sql.text.common import Table, check_dialect
from dpone_dagster.sources.sql.text.dialects import dialect_text, qualified_name, quote_ident, string_literal
from dpone_dagster.sources.sql.text.literals import render_bound


def and_predicates(*predicates: str | None) -> str | None:
    parts = [p for p in predicates if p]
    return " AND ".join(parts) if parts else None


def where_conditions(
    dialect: str,
    predicate: str | None = None,
    incremental_column: str | None = None,
    lower: Any = None,
    lower_inclusive: bool = True,
    upper: Any = None,
    *,
    kind: str | None = None,
    upper_inclusive: bool = True,
) -> list[str]:
    conditions = [f"({predicate})"] if predicate and predicate.strip() else []
    if incremental_column is not None:
        column = quote_ident(dialect, incremental_column)
        if lower is not None:
            conditions.append(
                f"{column} {'>=' if lower_inclusive else '>'} {render_bound(dialect, lower, kind)}"
            )
        if upper is not None:
            conditions.append(
                f"{column} {'<=' if upper_inclusive else '<'} {render_bound(dialect, upper, kind)}"
            )
    elif lower is not None or upper is not None:
        raise ValueError("bounds need an incremental_column")
    return conditions


def where_clause(conditions: Sequence[str]) -> str:
    return f" WHERE {' AND '.join(conditions)}" if conditions else ""


def select_query(
    dialect: str,
    table: Table | tuple[str | None, str],
    columns: Sequence[str] | None = None,
    predicate: str | None = None,
    incremental_column: str | None = None,
    lower: Any = None,
    lower_inclusive: bool = True,
    upper: Any = None,
    *,
    kind: str | None = None,
    expressions: Mapping[str, str] | None = None,
    upper_inclusive: bool = True,
) -> str:
    """The bounded extract: SELECT <cols> FROM <t> WHERE (<predicate>) AND col >=|> lower AND col <=|< upper.

    `kind` set: lower/upper are stored watermark values (`watermark_literal`); otherwise Python values
    (`literal`). `expressions` replace a column's plain identifier (aliased back to its name).
    """
    check_dialect(dialect)
    items = ", ".join(select_item(dialect, c, expressions) for c in columns) if columns else "*"
    conditions = where_conditions(
        dialect,
        predicate,
        incremental_column,
        lower,
        lower_inclusive,
        upper,
        kind=kind,
        upper_inclusive=upper_inclusive,
    )
    return f"SELECT {items} FROM {qualified_name(dialect, table)}{where_clause(conditions)}"


def rendered_max(dialect: str, column: str, kind: str | None) -> str:
    """MAX(column), rendered by the server as watermark text for temporal/rowversion kinds."""
    m = f"MAX({quote_ident(dialect, column)})"
    if kind in ("timestamp", "timestamp_tz", "date", "rowversion"):
        rendered = dialect_text(dialect).rendered_max(m, kind)
        if rendered is None:
            raise ValueError(f"{kind} watermarks are not available for {dialect}")
        return rendered
    return m


def max_query(
    dialect: str,
    table: Table | tuple[str | None, str],
    column: str,
    predicate: str | None = None,
    *,
    kind: str | None = None,
    lower: Any = None,
    lower_inclusive: bool = True,
    with_count: bool = False,
) -> str:
    """The upper bound, fixed before reading: `max_value` (and `row_count` of the window when asked)."""
    check_dialect(dialect)
    items = [f"{rendered_max(dialect, column, kind)} AS {quote_ident(dialect, 'max_value')}"]
    if with_count:
        count = dialect_text(dialect).COUNT
        items.append(f"{count}({quote_ident(dialect, column)}) AS {quote_ident(dialect, 'row_count')}")
    conditions = where_conditions(dialect, predicate, column, lower, lower_inclusive, None, kind=kind)
    return f"SELECT {', '.join(items)} FROM {qualified_name(dialect, table)}{where_clause(conditions)}"


def active_rowversion_query() -> str:
    """MSSQL: the exclusive upper bound of a rowversion window, MIN_ACTIVE_ROWVERSION() (see
    `watermark`), rendered as `0x` + 16 hex digits."""
    return f"SELECT CONVERT(VARCHAR(18), MIN_ACTIVE_ROWVERSION(), 1) AS {quote_ident('mssql', 'upper_value')}"


def window_count_query(
    dialect: str,
    table: Table | tuple[str | None, str],
    column: str,
    predicate: str | None = None,
    *,
    kind: str,
    lower: Any = None,
    upper: Any,
    upper_inclusive: bool,
) -> str:
    """The rows of a window whose upper bound was fixed by an earlier query (watermark values)."""
    count = dialect_text(dialect).COUNT
    conditions = where_conditions(
        dialect, predicate, column, lower, True, upper, kind=kind, upper_inclusive=upper_inclusive
    )
    return (
        f"SELECT {count}({quote_ident(dialect, column)}) AS {quote_ident(dialect, 'row_count')} "
        f"FROM {qualified_name(dialect, table)}{where_clause(conditions)}"
    )


def count_query(dialect: str, table: Table | tuple[str | None, str], predicate: str | None = None) -> str:
    count = f"{dialect_text(dialect).COUNT}(*)"
    return (
        f"SELECT {count} AS {quote_ident(dialect, 'row_count')} FROM {qualified_name(dialect, table)}"
        f"{where_clause(where_conditions(dialect, predicate))}"
    )


def bounds_query(
    dialect: str, table: Table | tuple[str | None, str], column: str, predicate: str | None = None
) -> str:
    """MIN/MAX of a partition column within the extract's conditions (`predicate`)."""
    check_dialect(dialect)
    q = quote_ident(dialect, column)
    return (
        f"SELECT MIN({q}) AS {quote_ident(dialect, 'lower_value')}, MAX({q}) AS {quote_ident(dialect, 'upper_value')} "
        f"FROM {qualified_name(dialect, table)}{where_clause(where_conditions(dialect, predicate))}"
    )


def hash_predicate(dialect: str, column: str, num_partitions: int, index: int) -> str:
    """Rows of partition `index` of `num_partitions` by a hash of `column` (NULLs go to partition 0)."""
    text = dialect_text(dialect)
    if num_partitions < 1 or not 0 <= index < num_partitions:
        raise ValueError(f"partition index {index} out of range for {num_partitions} partitions")
    q = quote_ident(dialect, column)
    expr = text.hash_partition(q, num_partitions, index)
    return f"({expr} OR {q} IS NULL)" if index == 0 else expr


def hash_predicates(dialect: str, column: str, num_partitions: int) -> list[str]:
    return [hash_predicate(dialect, column, num_partitions, i) for i in range(num_partitions)]


def columns_query(dialect: str, table: Table | tuple[str | None, str]) -> str:
    """The table's columns in order (INFORMATION_SCHEMA); no rows means the table does not exist."""
    text = dialect_text(dialect)
    schema, name = table
    schema_sql = string_literal(dialect, schema) if schema else text.CURRENT_SCHEMA
    return (
        "SELECT COLUMN_NAME AS column_name, DATA_TYPE AS data_type, NUMERIC_PRECISION AS numeric_precision, "
        f"NUMERIC_SCALE AS numeric_scale, {text.COLUMN_TYPE} AS column_type "
        "FROM INFORMATION_SCHEMA.COLUMNS "
        f"WHERE TABLE_SCHEMA = {schema_sql} AND TABLE_NAME = {string_literal(dialect, name)} "
        "ORDER BY ORDINAL_POSITION"
    )
