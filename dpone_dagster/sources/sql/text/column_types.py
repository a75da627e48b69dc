"""Column types: which can carry a watermark, which Spark type each ends up as, and the read
expressions for types a driver or Spark cannot map faithfully (the tables live in the dialect
modules)."""

from __future__ import annotations

from collections.abc import Mapping

from dpone_dagster.sources.sql.text import mssql, mysql
from dpone_dagster.sources.sql.text.common import DIALECTS, INTEGER_TYPES, ColumnInfo
from dpone_dagster.sources.sql.text.dialects import dialect_text, quote_ident

_DECIMAL_TYPES = {"decimal", "numeric", "money", "smallmoney"}
_FLOAT_TYPES = {"float", "real", "double", "double precision"}


def watermark_kind(dialect: str, data_type: str) -> str | None:
    """The watermark kind of a column type, or None when it cannot be an incremental column."""
    t = data_type.lower()
    if dialect == "mssql" and t in ("timestamp", "rowversion"):
        return "rowversion"  # MSSQL `timestamp` is rowversion, not a date/time
    if dialect == "mysql" and t == "timestamp":
        return "timestamp_tz"  # an instant, read in the UTC session (text.mysql)
    if t in INTEGER_TYPES:
        return "integer"
    if t in _DECIMAL_TYPES:
        return "decimal"
    if t in _FLOAT_TYPES:
        return "float"
    if t == "date":
        return "date"
    if t in ("timestamp with time zone", "datetimeoffset"):
        return "timestamp_tz"
    if t in mssql.TIMESTAMP_TYPES or t in ("timestamp", "timestamp without time zone"):
        return "timestamp"
    if t in mssql.STRING_TYPES or t in ("character varying", "character", "uniqueidentifier", "enum"):
        return "string"
    return None


def target_type(dialect: str, col: ColumnInfo) -> str | None:
    """The Spark SQL type a column must end up as, or None to keep what the JDBC read gives.

    Applied after the read (a cast only where the driver delivered something else, e.g. jTDS
    delivers datetime2 as text).
    """
    # Not validated: any other dialect name gets the MySQL / MariaDB mapping.
    text = dialect_text(dialect) if dialect in DIALECTS else mysql
    return text.target_type(col)


def read_expression(dialect: str, col: ColumnInfo) -> str | None:
    """An SQL expression that normalises a column for the JDBC read (aliased by the caller), or None.

    Only types a driver or Spark cannot map faithfully are rewritten.
    """
    q = quote_ident(dialect, col.name)
    return dialect_text(dialect).read_expression(q, col.data_type.lower())


def select_item(dialect: str, name: str, expressions: Mapping[str, str] | None = None) -> str:
    quoted = quote_ident(dialect, name)
    expression = (expressions or {}).get(name)
    return f"{expression} AS {quoted}" if expression else quoted
