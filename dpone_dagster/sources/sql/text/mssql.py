"""SQL Server text: `[x]` identifiers, N'' strings, the type mapping and server-side renderings.

MSSQL timestamps keep the `T` separator (language-independent for datetime). `timestamp` and
`rowversion` columns are row versions, not dates.
"""

from __future__ import annotations

from dpone_dagster.sources.sql.text.common import ColumnInfo, decimal_type, iso_literal

CURRENT_SCHEMA = "SCHEMA_NAME()"
COUNT = "COUNT_BIG"
COLUMN_TYPE = "CAST(NULL AS VARCHAR(1))"

STRING_TYPES = {"char", "varchar", "nchar", "nvarchar", "text", "ntext", "sysname"}
BINARY_TYPES = {"binary", "varbinary", "image", "timestamp", "rowversion"}
TIMESTAMP_TYPES = {"datetime", "datetime2", "smalldatetime"}

_TARGET_TYPES = {
    "bit": "boolean",
    "tinyint": "smallint",  # 0..255 does not fit Spark's signed byte
    "smallint": "smallint",
    "int": "int",
    "bigint": "bigint",
    "money": "decimal(19,4)",
    "smallmoney": "decimal(10,4)",
    "float": "double",
    "real": "float",
    "date": "date",
    "datetime": "timestamp",
    "datetime2": "timestamp",
    "smalldatetime": "timestamp",
    "datetimeoffset": "timestamp",
    "uniqueidentifier": "string",
    "time": "string",
    "xml": "string",
    "sql_variant": "string",
    "hierarchyid": "string",
    "geography": "string",
    "geometry": "string",
}


def quote(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


def string(value: str) -> str:
    return "N'" + value.replace("'", "''") + "'"


def boolean(value: bool) -> str:
    return "1" if value else "0"


def binary(hexed: str) -> str:
    return f"0x{hexed}"


# A bound, or a stored watermark (offset when the column is zoned): the same ISO literal.
timestamp = watermark_timestamp = iso_literal


def target_type(col: ColumnInfo) -> str | None:
    t = col.data_type.lower()
    if t in _TARGET_TYPES:
        return _TARGET_TYPES[t]
    if t in ("decimal", "numeric"):
        return decimal_type(col)
    if t in STRING_TYPES:
        return "string"
    if t in BINARY_TYPES:
        return "binary"
    return None


def read_expression(quoted: str, data_type: str) -> str | None:
    q = quoted
    return {
        "tinyint": f"CAST({q} AS SMALLINT)",
        "money": f"CAST({q} AS DECIMAL(19,4))",
        "smallmoney": f"CAST({q} AS DECIMAL(10,4))",
        "uniqueidentifier": f"CONVERT(CHAR(36), {q})",
        "datetimeoffset": f"CONVERT(DATETIME2(7), SWITCHOFFSET({q}, '+00:00'))",
        "time": f"CONVERT(VARCHAR(16), {q})",
        "xml": f"CONVERT(NVARCHAR(MAX), {q})",
        "sql_variant": f"CONVERT(NVARCHAR(MAX), {q})",
        "hierarchyid": f"CONVERT(NVARCHAR(4000), {q})",
        "geography": f"{q}.STAsText()",
        "geometry": f"{q}.STAsText()",
    }.get(data_type)


def rendered_max(max_sql: str, kind: str) -> str | None:
    m = max_sql
    if kind == "timestamp":
        return f"CONVERT(VARCHAR(27), {m}, 126)"
    if kind == "timestamp_tz":
        return f"CONVERT(VARCHAR(27), CONVERT(DATETIME2(7), SWITCHOFFSET({m}, '+00:00')), 126)"
    if kind == "date":
        return f"CONVERT(VARCHAR(10), {m}, 23)"
    return f"CONVERT(VARCHAR(18), {m}, 1)"


def hash_partition(quoted: str, num_partitions: int, index: int) -> str:
    # The BIGINT cast avoids the overflow of ABS(-2147483648).
    return f"ABS(CAST(CHECKSUM({quoted}) AS BIGINT)) % {num_partitions} = {index}"
