"""MySQL / MariaDB text: `` `x` `` identifiers, '' strings with `\\` escaped, the type mapping and
server-side renderings.

MySQL has no zone-aware type: aware values are sent as their UTC wall clock, timestamps with a
space separator.
"""

from __future__ import annotations

from dpone_dagster.sources.sql.text.common import ColumnInfo, decimal_type

CURRENT_SCHEMA = "DATABASE()"
COUNT = "COUNT"
COLUMN_TYPE = "COLUMN_TYPE"

_TARGET_TYPES = {
    "date": "date",
    "datetime": "timestamp",
    "timestamp": "timestamp",
    "time": "string",
    "json": "string",
    "char": "string",
    "varchar": "string",
    "tinytext": "string",
    "text": "string",
    "mediumtext": "string",
    "longtext": "string",
    "enum": "string",
    "set": "string",
    "binary": "binary",
    "varbinary": "binary",
    "tinyblob": "binary",
    "blob": "binary",
    "mediumblob": "binary",
    "longblob": "binary",
    "float": "float",
    "double": "double",
}


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def boolean(value: bool) -> str:
    return "TRUE" if value else "FALSE"


def binary(hexed: str) -> str:
    return f"X'{hexed}'"


def timestamp(text: str, utc: bool) -> str:
    if utc:
        return f"CAST('{text.replace('T', ' ')}' AS DATETIME(6))"
    return f"'{text.replace('T', ' ')}'"


def watermark_timestamp(text: str, zoned: bool) -> str:
    return f"'{text.replace('T', ' ')}'"


def target_type(col: ColumnInfo) -> str | None:
    t = col.data_type.lower()
    if t == "decimal":
        return decimal_type(col)
    return _TARGET_TYPES.get(t)


def read_expression(quoted: str, data_type: str) -> str | None:
    if data_type in ("time", "json"):
        return f"CAST({quoted} AS CHAR)"
    return None


def rendered_max(max_sql: str, kind: str) -> str | None:
    if kind in ("timestamp", "timestamp_tz"):
        return f"DATE_FORMAT({max_sql}, '%Y-%m-%dT%H:%i:%s.%f')"
    if kind == "date":
        return f"DATE_FORMAT({max_sql}, '%Y-%m-%d')"
    return None


def hash_partition(quoted: str, num_partitions: int, index: int) -> str:
    return f"CRC32({quoted}) % {num_partitions} = {index}"
