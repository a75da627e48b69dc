"""PostgreSQL text: `"x"` identifiers, '' strings (standard_conforming_strings), the type mapping
and server-side renderings."""

from __future__ import annotations

from dpone_dagster.sources.sql.text.common import ColumnInfo, decimal_type, iso_literal

CURRENT_SCHEMA = "current_schema()"
COUNT = "COUNT"
COLUMN_TYPE = "CAST(NULL AS VARCHAR(1))"

_TARGET_TYPES = {
    "boolean": "boolean",
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "money": "decimal(19,4)",
    "date": "date",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamp",
    "time without time zone": "string",
    "time with time zone": "string",
    "interval": "string",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
    "xml": "string",
    "inet": "string",
    "cidr": "string",
    "macaddr": "string",
    "user-defined": "string",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "bytea": "binary",
}
# Read as text: types Spark's JDBC reader cannot map.
_TEXT_TYPES = (
    "time without time zone",
    "time with time zone",
    "interval",
    "uuid",
    "json",
    "jsonb",
    "xml",
    "inet",
    "cidr",
    "macaddr",
    "user-defined",
)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def boolean(value: bool) -> str:
    return "TRUE" if value else "FALSE"


def binary(hexed: str) -> str:
    return f"'\\x{hexed}'::bytea"


# A bound, or a stored watermark (offset when the column is zoned): the same ISO literal.
timestamp = watermark_timestamp = iso_literal


def target_type(col: ColumnInfo) -> str | None:
    t = col.data_type.lower()
    if t == "numeric":
        return decimal_type(col)
    return _TARGET_TYPES.get(t)


def read_expression(quoted: str, data_type: str) -> str | None:
    if data_type == "money":
        return f"CAST({quoted} AS NUMERIC(19,4))"
    if data_type in _TEXT_TYPES:
        return f"CAST({quoted} AS TEXT)"
    return None


def rendered_max(max_sql: str, kind: str) -> str | None:
    m = max_sql
    if kind == "timestamp":
        return f"to_char({m}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
    if kind == "timestamp_tz":
        return f"to_char({m} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
    if kind == "date":
        return f"to_char({m}, 'YYYY-MM-DD')"
    return None


def hash_partition(quoted: str, num_partitions: int, index: int) -> str:
    return f"abs(hashtext({quoted}::text)::bigint) % {num_partitions} = {index}"
