"""Pure SQL and command generation for the SQL sources (mssql | postgres | mysql): no IO here.

Everything the SQL source sends to a database, or to `bcp`, is built by the functions below, so
that the exact text can be asserted in tests (MSSQL has no server on the test machines).

Identifiers are always quoted: `[x]` (mssql, `]` doubled), `"x"` (postgres, `"` doubled),
`` `x` `` (mysql, backtick doubled). Manifest predicates are trusted SQL and are wrapped in
parentheses unchanged.

Literals
--------
`literal()` renders Python values: strings escaped per dialect (mssql `N'..'` with `'` doubled;
postgres `'..'` with `'` doubled — standard_conforming_strings; mysql `'..'` with `'` doubled and
`\\` escaped), `None` as NULL, booleans, numbers, bytes (`0x..` / `'\\x..'::bytea` / `X'..'`),
dates and datetimes as ISO-8601 strings. Aware datetimes are converted to UTC and carry `+00:00`
(mysql has no zone-aware type: the UTC wall clock, in a `CAST(.. AS DATETIME(6))`).

Watermark values (what a run stores and the next run compares against) are NOT Python
datetimes: `max_query` has the *server* render MAX(column) as ISO-8601 text in the column's own
precision (`CONVERT(VARCHAR(27), .., 126)`, `to_char(.., 'YYYY-MM-DD"T"HH24:MI:SS.US')`,
`DATE_FORMAT(.., '%Y-%m-%dT%H:%i:%s.%f')`), and `watermark_literal()` sends that text back as an
*untyped* string literal, so the server converts it to the column's own type before comparing.
This keeps the bounds exact: no JVM/Python time-zone conversion, no precision loss (datetime2 has
7 fractional digits, Python 6), and no MSSQL datetime -> datetime2 promotion (`.003` becomes
`.0033333` when a datetime column is compared with a datetime2 value, which would drop the row at
the upper bound). Zone-aware columns (timestamptz, datetimeoffset) are rendered in UTC and compared
with an explicit `+00:00`. MSSQL timestamps keep the `T` separator (language-independent for
datetime); mysql gets a space.

Partitioned reads
-----------------
`bounds_query` gives MIN/MAX of a numeric/date partition column (Spark's partitionColumn /
lowerBound / upperBound / numPartitions). For other keys, `hash_predicate` builds one predicate per
partition index: mssql `ABS(CAST(CHECKSUM(col) AS BIGINT)) % n = i` (the BIGINT cast avoids the
overflow of ABS(-2147483648)), postgres `abs(hashtext(col::text)::bigint) % n = i`, mysql
`CRC32(col) % n = i`. Partition 0 also takes `col IS NULL` (NULL hashes to NULL), so every row
lands in exactly one partition.

MSSQL CDC and Change Tracking
-----------------------------
`cdc_query` reads `cdc.fn_cdc_get_all_changes_<capture_instance>(from, to, N'all')`: operation 1
delete, 2 insert, 4 update (after image); 3 (update before image) is not returned by N'all' and is
filtered out anyway. LSNs travel as 10-byte hex strings `0x` + 20 hex digits (`normalize_lsn`
validates them) and are inlined as binary literals: Spark wraps a JDBC `query` in a sub-select, so
DECLARE/@variables are not possible there. The stored LSN is the last `to_lsn` that was published;
the next run starts at `sys.fn_cdc_increment_lsn(stored)` (`cdc_increment_lsn_query`) and ends at
`sys.fn_cdc_get_max_lsn()` fixed at plan time. `change_tracking_query` is the Change Tracking
alternative (`CHANGETABLE(CHANGES t, @last_sync_version)` up to
`CHANGE_TRACKING_CURRENT_VERSION()` fixed at plan time).

bcp export and its escaping scheme
----------------------------------
bcp has no quoting. `bcp_select()` therefore *escapes* (it does not strip) in the SELECT it
exports, so that Spark's CSV reader reads the file back losslessly, in splittable line mode:

- field terminator `\\x1f` (unit separator), row terminator `\\x1e` (record separator);
- string columns are emitted CSV-quoted with a one-character prefix: `"~<value>"` with `"` doubled
  (Spark: quote `"`, escape `"`), so the field terminator, quotes and newlines inside values are
  safe; the row terminator `\\x1e` inside a value is escaped as ESC `r` and ESC itself as ESC ESC
  (ESC = `\\x1b`), because Spark splits the file at `\\x1e` before parsing quotes;
- NULL: bcp -c writes an empty field for NULL and a NUL byte (`\\0`) for an empty string. With the
  prefix no non-NULL string is ever empty (`''` is exported as `"~"`), so an empty field is always
  NULL and `\\0` never appears;
- binary columns are exported as `x` + hex (`x` alone is an empty binary), decoded with unhex;
- other columns are exported as plain text in unambiguous forms (ISO-8601 style 126 for
  datetimes, datetimeoffset converted to UTC, style 3 for float/real so they round-trip, bit as
  0/1, money as DECIMAL(19,4)) and cast to their Spark type after reading.

`bcp_command()` never puts the password into argv: argv runs
`sh -c 'exec "$@" -P "$VAR"' sh bcp ...` and the password travels in the environment mapping under
`password_env_var`; `BcpCommand.redacted()` (and repr) mask it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, NamedTuple

Dialect = Literal["mssql", "postgres", "mysql"]
DIALECTS: tuple[str, ...] = ("mssql", "postgres", "mysql")

# Watermark kinds: how a stored watermark value is typed, rendered and compared.
WatermarkKind = Literal[
    "integer", "decimal", "float", "timestamp", "timestamp_tz", "date", "string", "rowversion"
]

MASK = "**********"


class Table(NamedTuple):
    """A table; schema None means the connection's current schema/database."""

    schema: str | None
    name: str


class ColumnInfo(NamedTuple):
    """One column as INFORMATION_SCHEMA.COLUMNS describes it (data_type lower-cased)."""

    name: str
    data_type: str
    precision: int | None = None
    scale: int | None = None
    column_type: str | None = None  # mysql COLUMN_TYPE, e.g. "tinyint(1) unsigned"


def _check_dialect(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")


# --------------------------------------------------------------------------- identifiers


def quote_ident(dialect: str, name: str) -> str:
    _check_dialect(dialect)
    if not name or "\x00" in name:
        raise ValueError(f"invalid SQL identifier {name!r}")
    if dialect == "mssql":
        return "[" + name.replace("]", "]]") + "]"
    if dialect == "postgres":
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"


def qualified_name(dialect: str, table: Table | tuple[str | None, str]) -> str:
    schema, name = table
    if schema:
        return f"{quote_ident(dialect, schema)}.{quote_ident(dialect, name)}"
    return quote_ident(dialect, name)


# --------------------------------------------------------------------------- literals


def string_literal(dialect: str, value: str) -> str:
    _check_dialect(dialect)
    if "\x00" in value:
        raise ValueError("a NUL character cannot be sent in an SQL string literal")
    if dialect == "mssql":
        return "N'" + value.replace("'", "''") + "'"
    if dialect == "postgres":
        return "'" + value.replace("'", "''") + "'"
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def iso_timestamp(value: datetime) -> str:
    """ISO-8601 without zone, with 0, 3 or 6 fractional digits (MSSQL datetime takes at most 3)."""
    if value.microsecond == 0:
        return value.isoformat(timespec="seconds")
    if value.microsecond % 1000 == 0:
        return value.isoformat(timespec="milliseconds")
    return value.isoformat(timespec="microseconds")


def literal(dialect: str, value: Any) -> str:
    """A Python value as an SQL literal of the dialect."""
    _check_dialect(dialect)
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        if dialect == "mssql":
            return "1" if value else "0"
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} has no SQL literal")
        return repr(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value!r} has no SQL literal")
        return format(value, "f")
    if isinstance(value, datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            utc = value.astimezone(UTC).replace(tzinfo=None)
            if dialect == "mysql":
                return f"CAST('{iso_timestamp(utc).replace('T', ' ')}' AS DATETIME(6))"
            return f"'{iso_timestamp(utc)}+00:00'"
        text = iso_timestamp(value)
        return f"'{text.replace('T', ' ')}'" if dialect == "mysql" else f"'{text}'"
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    if isinstance(value, bytes | bytearray | memoryview):
        hexed = bytes(value).hex().upper()
        if dialect == "mssql":
            return f"0x{hexed}"
        if dialect == "postgres":
            return f"'\\x{hexed}'::bytea"
        return f"X'{hexed}'"
    if isinstance(value, str):
        return string_literal(dialect, value)
    raise TypeError(f"no SQL literal for {type(value).__name__}")


_ISO_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?))?$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_HEX = re.compile(r"^0[xX][0-9A-Fa-f]+$")


def watermark_literal(dialect: str, kind: str, value: Any) -> str:
    """A stored watermark value (JSON: int or text) as the literal compared with its column.

    Temporal kinds are validated ISO-8601 text sent as untyped string literals (the server converts
    them to the column's type; see the module docstring).
    """
    _check_dialect(dialect)
    if kind == "integer":
        if (
            isinstance(value, bool)
            or not isinstance(value, int | str)
            or not re.fullmatch(r"[+-]?\d+", str(value))
        ):
            raise ValueError(f"integer watermark {value!r} is not an integer")
        return str(int(value))
    if kind in ("decimal", "float"):
        text = str(value)
        if not _DECIMAL.match(text):
            raise ValueError(f"{kind} watermark {value!r} is not a number")
        return text
    if kind in ("timestamp", "timestamp_tz"):
        text = str(value)
        if kind == "timestamp_tz":
            text = re.sub(r"(?:Z|[+-]00:?00)$", "", text)
        if not _ISO_TS.match(text):
            raise ValueError(f"{kind} watermark {value!r} is not an ISO-8601 timestamp")
        text = text.replace(" ", "T")
        if dialect == "mysql":
            return f"'{text.replace('T', ' ')}'"
        if kind == "timestamp_tz":
            return f"'{text}+00:00'"
        return f"'{text}'"
    if kind == "date":
        text = str(value)
        if not _ISO_DATE.match(text):
            raise ValueError(f"date watermark {value!r} is not an ISO-8601 date")
        return f"'{text}'"
    if kind == "rowversion":
        text = str(value)
        if not _HEX.match(text):
            raise ValueError(f"rowversion watermark {value!r} is not a 0x hex value")
        return "0x" + text[2:].upper()
    if kind == "string":
        return string_literal(dialect, str(value))
    raise ValueError(f"unknown watermark kind {kind!r}")


def render_bound(dialect: str, value: Any, kind: str | None) -> str:
    return literal(dialect, value) if kind is None else watermark_literal(dialect, kind, value)


# --------------------------------------------------------------------------- lookback


_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: str | int | float) -> timedelta:
    """Seconds (number or numeric text) or an ISO-8601 duration without years/months (PT15M, P1DT2H)."""
    if isinstance(value, bool):
        raise ValueError("a lookback duration cannot be a boolean")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    text = value.strip().upper()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    match = _DURATION.match(text)
    if not match or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(
            f"lookback {value!r} is not a number of seconds or an ISO-8601 duration such as PT15M, "
            "PT1H or P1D (years and months are ambiguous and not accepted)"
        )
    parts = {name: float(part) for name, part in match.groupdict().items() if part}
    return timedelta(**parts)


def parse_timestamp(text: str) -> datetime:
    """A stored ISO timestamp as a naive datetime (fraction truncated to microseconds)."""
    text = re.sub(r"(?:Z|[+-]00:?00)$", "", str(text)).replace(" ", "T")
    match = _ISO_TS.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an ISO-8601 timestamp")
    head, _, fraction = text.partition(".")
    if fraction:
        head += "." + (fraction + "000000")[:6]
    return datetime.fromisoformat(head)


def apply_lookback(kind: str, value: Any, lookback: str | int | float | None) -> Any:
    """The lower bound `value - lookback` in the watermark's own representation."""
    if lookback is None or value is None:
        return value
    if kind == "integer":
        if isinstance(lookback, bool) or not re.fullmatch(r"\d+", str(lookback).strip()):
            raise ValueError(f"lookback {lookback!r} must be a whole number for an integer column")
        return int(value) - int(str(lookback).strip())
    if kind in ("decimal", "float"):
        try:
            amount = Decimal(str(lookback).strip())
        except InvalidOperation:
            raise ValueError(f"lookback {lookback!r} must be a number for a numeric column") from None
        return format(Decimal(str(value)) - amount, "f")
    if kind in ("timestamp", "timestamp_tz"):
        return iso_timestamp(parse_timestamp(str(value)) - parse_duration(lookback))
    if kind == "date":
        delta = parse_duration(lookback)
        start = datetime.fromisoformat(str(value)) - delta
        return start.date().isoformat()  # floor: a wider window, never a narrower one
    raise ValueError(f"lookback is not supported for a {kind} watermark column")


# --------------------------------------------------------------------------- column types


_MSSQL_STRING = {"char", "varchar", "nchar", "nvarchar", "text", "ntext", "sysname"}
_MSSQL_BINARY = {"binary", "varbinary", "image", "timestamp", "rowversion"}
_MSSQL_TIMESTAMP = {"datetime", "datetime2", "smalldatetime"}
_INTEGER_TYPES = {"tinyint", "smallint", "int", "integer", "bigint", "mediumint", "serial", "bigserial"}
_DECIMAL_TYPES = {"decimal", "numeric", "money", "smallmoney"}
_FLOAT_TYPES = {"float", "real", "double", "double precision"}


def watermark_kind(dialect: str, data_type: str) -> str | None:
    """The watermark kind of a column type, or None when it cannot be an incremental column."""
    t = data_type.lower()
    if dialect == "mssql" and t in ("timestamp", "rowversion"):
        return "rowversion"  # MSSQL `timestamp` is rowversion, not a date/time
    if t in _INTEGER_TYPES:
        return "integer"
    if t in _DECIMAL_TYPES:
        return "decimal"
    if t in _FLOAT_TYPES:
        return "float"
    if t == "date":
        return "date"
    if t in ("timestamp with time zone", "datetimeoffset"):
        return "timestamp_tz"
    if t in _MSSQL_TIMESTAMP or t in ("timestamp", "timestamp without time zone"):
        return "timestamp"
    if t in _MSSQL_STRING or t in ("character varying", "character", "uniqueidentifier", "enum"):
        return "string"
    return None


def _decimal_type(col: ColumnInfo) -> str | None:
    if col.precision is None or not 0 < col.precision <= 38:
        return None
    return f"decimal({col.precision},{col.scale or 0})"


def target_type(dialect: str, col: ColumnInfo) -> str | None:
    """The Spark SQL type a column must end up as, or None to keep what the JDBC read gives.

    Applied after the read (a cast only where the driver delivered something else, e.g. jTDS
    delivers datetime2 as text).
    """
    t = col.data_type.lower()
    if dialect == "mssql":
        mapping = {
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
        if t in mapping:
            return mapping[t]
        if t in ("decimal", "numeric"):
            return _decimal_type(col)
        if t in _MSSQL_STRING:
            return "string"
        if t in _MSSQL_BINARY:
            return "binary"
        return None
    if dialect == "postgres":
        mapping = {
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
        if t == "numeric":
            return _decimal_type(col)
        return mapping.get(t)
    # mysql / mariadb
    mapping = {
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
    if t == "decimal":
        return _decimal_type(col)
    return mapping.get(t)


def read_expression(dialect: str, col: ColumnInfo) -> str | None:
    """An SQL expression that normalises a column for the JDBC read (aliased by the caller), or None.

    Only types a driver or Spark cannot map faithfully are rewritten.
    """
    q = quote_ident(dialect, col.name)
    t = col.data_type.lower()
    if dialect == "mssql":
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
        }.get(t)
    if dialect == "postgres":
        if t == "money":
            return f"CAST({q} AS NUMERIC(19,4))"
        if t in (
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
        ):
            return f"CAST({q} AS TEXT)"
        return None
    if t in ("time", "json"):
        return f"CAST({q} AS CHAR)"
    return None


def select_item(dialect: str, name: str, expressions: Mapping[str, str] | None = None) -> str:
    quoted = quote_ident(dialect, name)
    expression = (expressions or {}).get(name)
    return f"{expression} AS {quoted}" if expression else quoted


# --------------------------------------------------------------------------- queries


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
) -> list[str]:
    conditions = [f"({predicate})"] if predicate and predicate.strip() else []
    if incremental_column is not None:
        column = quote_ident(dialect, incremental_column)
        if lower is not None:
            conditions.append(
                f"{column} {'>=' if lower_inclusive else '>'} {render_bound(dialect, lower, kind)}"
            )
        if upper is not None:
            conditions.append(f"{column} <= {render_bound(dialect, upper, kind)}")
    elif lower is not None or upper is not None:
        raise ValueError("bounds need an incremental_column")
    return conditions


def _where(conditions: Sequence[str]) -> str:
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
) -> str:
    """The bounded extract: SELECT <cols> FROM <t> WHERE (<predicate>) AND col >=|> lower AND col <= upper.

    `kind` set: lower/upper are stored watermark values (`watermark_literal`); otherwise Python values
    (`literal`). `expressions` replace a column's plain identifier (aliased back to its name).
    """
    _check_dialect(dialect)
    items = ", ".join(select_item(dialect, c, expressions) for c in columns) if columns else "*"
    conditions = where_conditions(
        dialect, predicate, incremental_column, lower, lower_inclusive, upper, kind=kind
    )
    return f"SELECT {items} FROM {qualified_name(dialect, table)}{_where(conditions)}"


def rendered_max(dialect: str, column: str, kind: str | None) -> str:
    """MAX(column), rendered by the server as watermark text for temporal/rowversion kinds."""
    m = f"MAX({quote_ident(dialect, column)})"
    if kind in ("timestamp", "timestamp_tz", "date", "rowversion"):
        if dialect == "mssql":
            if kind == "timestamp":
                return f"CONVERT(VARCHAR(27), {m}, 126)"
            if kind == "timestamp_tz":
                return f"CONVERT(VARCHAR(27), CONVERT(DATETIME2(7), SWITCHOFFSET({m}, '+00:00')), 126)"
            if kind == "date":
                return f"CONVERT(VARCHAR(10), {m}, 23)"
            return f"CONVERT(VARCHAR(18), {m}, 1)"
        if dialect == "postgres":
            if kind == "timestamp":
                return f"to_char({m}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
            if kind == "timestamp_tz":
                return f"to_char({m} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
            if kind == "date":
                return f"to_char({m}, 'YYYY-MM-DD')"
        if dialect == "mysql":
            if kind in ("timestamp", "timestamp_tz"):
                return f"DATE_FORMAT({m}, '%Y-%m-%dT%H:%i:%s.%f')"
            if kind == "date":
                return f"DATE_FORMAT({m}, '%Y-%m-%d')"
        raise ValueError(f"{kind} watermarks are not available for {dialect}")
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
    _check_dialect(dialect)
    items = [f"{rendered_max(dialect, column, kind)} AS {quote_ident(dialect, 'max_value')}"]
    if with_count:
        count = "COUNT_BIG" if dialect == "mssql" else "COUNT"
        items.append(f"{count}({quote_ident(dialect, column)}) AS {quote_ident(dialect, 'row_count')}")
    conditions = where_conditions(dialect, predicate, column, lower, lower_inclusive, None, kind=kind)
    return f"SELECT {', '.join(items)} FROM {qualified_name(dialect, table)}{_where(conditions)}"


def count_query(dialect: str, table: Table | tuple[str | None, str], predicate: str | None = None) -> str:
    _check_dialect(dialect)
    count = "COUNT_BIG(*)" if dialect == "mssql" else "COUNT(*)"
    return (
        f"SELECT {count} AS {quote_ident(dialect, 'row_count')} FROM {qualified_name(dialect, table)}"
        f"{_where(where_conditions(dialect, predicate))}"
    )


def bounds_query(
    dialect: str, table: Table | tuple[str | None, str], column: str, predicate: str | None = None
) -> str:
    """MIN/MAX of a partition column within the extract's conditions (`predicate`)."""
    _check_dialect(dialect)
    q = quote_ident(dialect, column)
    return (
        f"SELECT MIN({q}) AS {quote_ident(dialect, 'lower_value')}, MAX({q}) AS {quote_ident(dialect, 'upper_value')} "
        f"FROM {qualified_name(dialect, table)}{_where(where_conditions(dialect, predicate))}"
    )


def hash_predicate(dialect: str, column: str, num_partitions: int, index: int) -> str:
    """Rows of partition `index` of `num_partitions` by a hash of `column` (NULLs go to partition 0)."""
    _check_dialect(dialect)
    if num_partitions < 1 or not 0 <= index < num_partitions:
        raise ValueError(f"partition index {index} out of range for {num_partitions} partitions")
    q = quote_ident(dialect, column)
    if dialect == "mssql":
        expr = f"ABS(CAST(CHECKSUM({q}) AS BIGINT)) % {num_partitions} = {index}"
    elif dialect == "postgres":
        expr = f"abs(hashtext({q}::text)::bigint) % {num_partitions} = {index}"
    else:
        expr = f"CRC32({q}) % {num_partitions} = {index}"
    return f"({expr} OR {q} IS NULL)" if index == 0 else expr


def hash_predicates(dialect: str, column: str, num_partitions: int) -> list[str]:
    return [hash_predicate(dialect, column, num_partitions, i) for i in range(num_partitions)]


def columns_query(dialect: str, table: Table | tuple[str | None, str]) -> str:
    """The table's columns in order (INFORMATION_SCHEMA); no rows means the table does not exist."""
    _check_dialect(dialect)
    schema, name = table
    current = {"mssql": "SCHEMA_NAME()", "postgres": "current_schema()", "mysql": "DATABASE()"}[dialect]
    schema_sql = string_literal(dialect, schema) if schema else current
    column_type = "COLUMN_TYPE" if dialect == "mysql" else "CAST(NULL AS VARCHAR(1))"
    return (
        "SELECT COLUMN_NAME AS column_name, DATA_TYPE AS data_type, NUMERIC_PRECISION AS numeric_precision, "
        f"NUMERIC_SCALE AS numeric_scale, {column_type} AS column_type "
        "FROM INFORMATION_SCHEMA.COLUMNS "
        f"WHERE TABLE_SCHEMA = {schema_sql} AND TABLE_NAME = {string_literal(dialect, name)} "
        "ORDER BY ORDINAL_POSITION"
    )


# --------------------------------------------------------------------------- MSSQL CDC

_LSN = re.compile(r"^0x[0-9A-Fa-f]{20}$")
ZERO_LSN = "0x" + "0" * 20


def normalize_lsn(value: str | bytes | bytearray) -> str:
    """An LSN as `0x` + 20 upper-case hex digits (10 bytes); anything else raises ValueError."""
    if isinstance(value, bytes | bytearray):
        if len(value) != 10:
            raise ValueError(f"an LSN has 10 bytes, got {len(value)}")
        return "0x" + bytes(value).hex().upper()
    text = str(value).strip()
    if not _LSN.match(text):
        raise ValueError(f"LSN {value!r} is not 0x followed by 20 hex digits (binary(10))")
    return "0x" + text[2:].upper()


def lsn_bytes(value: str) -> bytes:
    return bytes.fromhex(normalize_lsn(value)[2:])


def compare_lsn(a: str, b: str) -> int:
    left, right = lsn_bytes(a), lsn_bytes(b)
    return (left > right) - (left < right)


def increment_lsn(value: str) -> str:
    """The smallest LSN greater than `value` (the bound sys.fn_cdc_increment_lsn computes server-side)."""
    number = int.from_bytes(lsn_bytes(value), "big") + 1
    if number >= 1 << 80:
        raise ValueError(f"LSN {value} cannot be incremented")
    return "0x" + number.to_bytes(10, "big").hex().upper()


def default_capture_instance(table: Table | tuple[str | None, str]) -> str:
    schema, name = table
    return f"{schema or 'dbo'}_{name}"


def _capture_function(capture_instance: str) -> str:
    if not capture_instance or "\x00" in capture_instance:
        raise ValueError(f"invalid capture instance {capture_instance!r}")
    return "[cdc].[fn_cdc_get_all_changes_" + capture_instance.replace("]", "]]") + "]"


CDC_START_LSN = "__dpone__cdc_start_lsn"
CDC_SEQVAL = "__dpone__cdc_seqval"
CDC_OPERATION = "__dpone__cdc_operation"
CDC_DELETE = 1
CDC_INSERT = 2
CDC_UPDATE_BEFORE = 3
CDC_UPDATE_AFTER = 4


def cdc_query(
    capture_instance: str,
    from_lsn_hex: str,
    to_lsn_hex: str,
    columns: Sequence[str],
    *,
    expressions: Mapping[str, str] | None = None,
    empty: bool = False,
) -> str:
    """Every change in [from_lsn, to_lsn] (row filter N'all': 1 delete, 2 insert, 4 update after image).

    The LSNs come out as `0x..` text (`__dpone__cdc_start_lsn`, `__dpone__cdc_seqval`) whose
    string order is the LSN order, and `__dpone__cdc_operation`. `empty` keeps the shape with no
    rows (TOP 0) for runs with nothing to read.
    """
    from_lsn, to_lsn = normalize_lsn(from_lsn_hex), normalize_lsn(to_lsn_hex)
    if compare_lsn(from_lsn, to_lsn) > 0:
        raise ValueError(f"from_lsn {from_lsn} is after to_lsn {to_lsn}")
    if not columns:
        raise ValueError("cdc_query needs the captured column names")
    items = [
        f"CONVERT(VARCHAR(22), [__$start_lsn], 1) AS [{CDC_START_LSN}]",
        f"CONVERT(VARCHAR(22), [__$seqval], 1) AS [{CDC_SEQVAL}]",
        f"[__$operation] AS [{CDC_OPERATION}]",
        *(select_item("mssql", c, expressions) for c in columns),
    ]
    top = "TOP 0 " if empty else ""
    return (
        f"SELECT {top}{', '.join(items)} FROM {_capture_function(capture_instance)}({from_lsn}, {to_lsn}, N'all') "
        f"WHERE [__$operation] <> {CDC_UPDATE_BEFORE}"
    )


def cdc_max_lsn_query() -> str:
    return "SELECT CONVERT(VARCHAR(22), sys.fn_cdc_get_max_lsn(), 1) AS [max_lsn]"


def cdc_min_lsn_query(capture_instance: str) -> str:
    """0x000.. comes back when the capture instance does not exist (CDC not enabled for the table)."""
    return (
        f"SELECT CONVERT(VARCHAR(22), sys.fn_cdc_get_min_lsn({string_literal('mssql', capture_instance)}), 1) "
        "AS [min_lsn]"
    )


def cdc_increment_lsn_query(lsn_hex: str) -> str:
    """The next run's from_lsn: the LSN after the stored (last published) to_lsn."""
    return f"SELECT CONVERT(VARCHAR(22), sys.fn_cdc_increment_lsn({normalize_lsn(lsn_hex)}), 1) AS [next_lsn]"


# --------------------------------------------------------------------------- MSSQL Change Tracking

CT_VERSION = "__dpone__ct_version"
CT_OPERATION = "__dpone__ct_operation"


def change_tracking_query(
    table: Table | tuple[str | None, str],
    key_columns: Sequence[str],
    columns: Sequence[str],
    last_sync_version: int,
    upper_version: int | None = None,
) -> str:
    """Rows changed after `last_sync_version` (SYS_CHANGE_OPERATION I/U/D), up to `upper_version`.

    Keys come from CHANGETABLE (they survive a delete); the other columns from the current row
    (NULL for deletes). Check `change_tracking_min_valid_version_query` first: a last sync version
    below it means the history was cleaned up and the table must be reloaded.
    """
    if not key_columns:
        raise ValueError("change tracking needs the primary key columns")
    if isinstance(last_sync_version, bool) or int(last_sync_version) < 0:
        raise ValueError("last_sync_version must be a non-negative integer")
    name = qualified_name("mssql", table)
    keys = list(key_columns)
    items = [
        f"[ct].[SYS_CHANGE_VERSION] AS [{CT_VERSION}]",
        f"[ct].[SYS_CHANGE_OPERATION] AS [{CT_OPERATION}]",
        *(f"[ct].{quote_ident('mssql', k)}" for k in keys),
        *(f"[t].{quote_ident('mssql', c)}" for c in columns if c not in keys),
    ]
    join = " AND ".join(f"[t].{quote_ident('mssql', k)} = [ct].{quote_ident('mssql', k)}" for k in keys)
    where = f" WHERE [ct].[SYS_CHANGE_VERSION] <= {int(upper_version)}" if upper_version is not None else ""
    return (
        f"SELECT {', '.join(items)} FROM CHANGETABLE(CHANGES {name}, {int(last_sync_version)}) AS [ct] "
        f"LEFT OUTER JOIN {name} AS [t] ON {join}{where}"
    )


def change_tracking_current_version_query() -> str:
    return "SELECT CHANGE_TRACKING_CURRENT_VERSION() AS [current_version]"


def change_tracking_min_valid_version_query(table: Table | tuple[str | None, str]) -> str:
    schema, name = table
    object_name = f"{schema}.{name}" if schema else name
    return (
        f"SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID({string_literal('mssql', object_name)})) "
        "AS [min_valid_version]"
    )


# --------------------------------------------------------------------------- bcp

BCP_FIELD_TERMINATOR = "\x1f"  # unit separator
BCP_ROW_TERMINATOR = "\x1e"  # record separator
BCP_ESCAPE = "\x1b"  # escapes the row terminator inside string values
BCP_STRING_PREFIX = "~"  # makes every non-NULL string non-empty (bcp writes '' as \0)
BCP_BINARY_PREFIX = "x"


class BcpColumn(NamedTuple):
    """How one exported column is encoded in the file and decoded after reading.

    encoding: "text" (quoted, prefixed, row terminator escaped), "hex" (prefix + hex digits), or
    "plain" (unambiguous text cast to `target`).
    """

    name: str
    encoding: Literal["text", "hex", "plain"]
    target: str


def bcp_column(col: ColumnInfo, row_terminator: str = BCP_ROW_TERMINATOR) -> tuple[str, BcpColumn]:
    """The SELECT expression (aliased) that exports one MSSQL column, and how to decode it."""
    _check_terminators(BCP_FIELD_TERMINATOR, row_terminator)
    q = quote_ident("mssql", col.name)
    t = col.data_type.lower()
    target = target_type("mssql", col) or "string"
    if t in _MSSQL_BINARY:
        expr = f"'{BCP_BINARY_PREFIX}' + CONVERT(VARCHAR(MAX), CAST({q} AS VARBINARY(MAX)), 2)"
        return f"{expr} AS {q}", BcpColumn(col.name, "hex", "binary")
    plain = {
        "datetime": f"CONVERT(VARCHAR(27), {q}, 126)",
        "datetime2": f"CONVERT(VARCHAR(27), {q}, 126)",
        "smalldatetime": f"CONVERT(VARCHAR(27), {q}, 126)",
        "datetimeoffset": f"CONVERT(VARCHAR(27), CONVERT(DATETIME2(7), SWITCHOFFSET({q}, '+00:00')), 126)",
        "date": f"CONVERT(VARCHAR(10), {q}, 23)",
        "bit": f"CAST({q} AS TINYINT)",
        "money": f"CAST({q} AS DECIMAL(19,4))",
        "smallmoney": f"CAST({q} AS DECIMAL(10,4))",
        "float": f"CONVERT(VARCHAR(32), {q}, 3)",
        "real": f"CONVERT(VARCHAR(32), {q}, 3)",
        "uniqueidentifier": f"CONVERT(CHAR(36), {q})",
        "time": f"CONVERT(VARCHAR(16), {q})",
    }
    if t in plain:
        return f"{plain[t]} AS {q}", BcpColumn(col.name, "plain", target)
    if t in _INTEGER_TYPES or t in ("decimal", "numeric"):
        return q, BcpColumn(col.name, "plain", target)
    # Strings and everything else rendered as text (xml, sql_variant, hierarchyid, geography...).
    source = f"{q}.STAsText()" if t in ("geography", "geometry") else f"CAST({q} AS NVARCHAR(MAX))"
    escaped = (
        f"REPLACE(REPLACE(REPLACE({source} COLLATE Latin1_General_BIN2, "
        f"NCHAR({ord(BCP_ESCAPE)}), NCHAR({ord(BCP_ESCAPE)}) + NCHAR({ord(BCP_ESCAPE)})), "
        f"NCHAR({ord(row_terminator)}), NCHAR({ord(BCP_ESCAPE)}) + N'r'), N'\"', N'\"\"')"
    )
    expr = f"N'\"{BCP_STRING_PREFIX}' + {escaped} + N'\"'"
    return f"{expr} AS {q}", BcpColumn(col.name, "text", "string")


def bcp_select(
    table: Table | tuple[str | None, str],
    columns: Sequence[ColumnInfo],
    conditions: Sequence[str] = (),
    row_terminator: str = BCP_ROW_TERMINATOR,
) -> tuple[str, list[BcpColumn]]:
    """The queryout SELECT with the escaping scheme of the module docstring, and the decode plan."""
    if not columns:
        raise ValueError("bcp_select needs the table's columns (a SELECT * cannot be escaped)")
    exported = [bcp_column(c, row_terminator) for c in columns]
    query = (
        f"SELECT {', '.join(expr for expr, _ in exported)} FROM {qualified_name('mssql', table)}"
        f"{_where(conditions)}"
    )
    return query, [spec for _, spec in exported]


@dataclass(frozen=True)
class BcpCommand:
    """A bcp invocation: `argv` holds no secret; the password is in `env` (masked in repr/redacted)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()

    def redacted(self) -> str:
        """A loggable rendering: control characters escaped, secret environment values masked."""
        env = " ".join(
            f"{name}={MASK if name in self.secret_env else shlex.quote(value)}"
            for name, value in self.env.items()
        )
        shown = " ".join(shlex.quote(_printable(arg)) for arg in self.argv)
        return f"{env} {shown}" if env else shown

    def __repr__(self) -> str:
        return f"BcpCommand({self.redacted()!r})"

    __str__ = redacted


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


# Characters that occur in the plain (unquoted) values or in the encoding itself.
_TERMINATOR_FORBIDDEN = set('"~\x00\x1b .:-+_') | set("0123456789abcdefABCDEFxXTZ")


def _check_terminators(field_terminator: str, row_terminator: str) -> None:
    """Terminators must never occur in an encoded value and Spark reads a one-character row separator."""
    if not field_terminator or set(field_terminator) & _TERMINATOR_FORBIDDEN:
        raise ValueError(
            f"field terminator {field_terminator!r} is empty or contains characters of encoded values"
        )
    if len(row_terminator) != 1 or row_terminator in _TERMINATOR_FORBIDDEN:
        raise ValueError(
            f"row terminator {row_terminator!r} must be one character that encoded values cannot contain "
            "(Spark's CSV reader splits lines at a single character)"
        )
    if row_terminator in field_terminator:
        raise ValueError("the row terminator must not occur in the field terminator")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bcp_command(
    table_or_query: str,
    out_path: str,
    server: str,
    database: str | None,
    user: str | None,
    password_env_var: str = "DPONE_BCP_PASSWORD",
    field_terminator: str = BCP_FIELD_TERMINATOR,
    row_terminator: str = BCP_ROW_TERMINATOR,
    batch_size: int | None = None,
    *,
    password: str | None = None,
    port: int | None = None,
    trust_server_certificate: bool = False,
    packet_size: int | None = None,
    executable: str = "bcp",
) -> BcpCommand:
    """`bcp "<query>" queryout <file> -c -t <ft> -r <rt> -S <server> -d <db> -U <user> -P <from env>`.

    A text starting with SELECT/WITH is exported with queryout, anything else is a table name
    exported with out. The password is read by `sh` from `password_env_var` at exec time, so it is
    never part of a logged command line; `password` (when given) fills that variable in `env`.
    Without `user` the login is integrated (-T). `batch_size` is accepted for symmetry with the
    JDBC fetch size but not passed: bcp's -b applies to imports only. Terminators are passed as
    the raw characters (the file is read back with the same characters).
    """
    if not _ENV_NAME.match(password_env_var):
        raise ValueError(f"invalid environment variable name {password_env_var!r}")
    _check_terminators(field_terminator, row_terminator)
    del batch_size  # documented above: -b is an import option
    text = table_or_query.strip()
    mode = "queryout" if re.match(r"(?is)^(select|with)\b", text) else "out"
    target = f"tcp:{server},{port}" if port else server
    bcp = [executable, text, mode, out_path, "-c", "-t", field_terminator, "-r", row_terminator, "-S", target]
    if database:
        bcp += ["-d", database]
    if trust_server_certificate:
        bcp.append("-u")
    if packet_size:
        bcp += ["-a", str(int(packet_size))]
    env: dict[str, str] = {"LC_ALL": "C.UTF-8"}
    if user:
        bcp += ["-U", user]
        argv = ["sh", "-c", f'exec "$@" -P "${password_env_var}"', "sh", *bcp]
        if password is not None:
            env[password_env_var] = password
        secret = (password_env_var,)
    else:
        argv = [*bcp, "-T"]
        secret = ()
    return BcpCommand(tuple(argv), env, secret)
