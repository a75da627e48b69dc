"""Python values and stored watermark values as SQL literals.

`literal()` renders Python values: strings escaped per dialect (mssql `N'..'` with `'` doubled;
postgres `'..'` with `'` doubled — standard_conforming_strings; mysql `'..'` with `'` doubled and
`\\` escaped), `None` as NULL, booleans, numbers, bytes (`0x..` / `'\\x..'::bytea` / `X'..'`),
dates and datetimes as ISO-8601 strings. Aware datetimes are converted to UTC and carry `+00:00`
(mysql has no zone-aware type: the UTC wall clock, in a `CAST(.. AS DATETIME(6))`).

Watermark values (what a run stores and the next run compares against) are NOT Python
datetimes: `queries.max_query` has the *server* render MAX(column) as ISO-8601 text in the
column's own precision (`CONVERT(VARCHAR(27), .., 126)`, `to_char(.., 'YYYY-MM-DD"T"HH24:MI:SS.US')`,
`DATE_FORMAT(.., '%Y-%m-%dT%H:%i:%s.%f')`), and `watermark_literal()` sends that text back as an
*untyped* string literal, so the server converts it to the column's own type before comparing.
This keeps the bounds exact: no JVM/Python time-zone conversion, no precision loss (datetime2 has
7 fractional digits, Python 6), and no MSSQL datetime -> datetime2 promotion (`.003` becomes
`.0033333` when a datetime column is compared with a datetime2 value, which would drop the row at
the upper bound). Zone-aware columns (timestamptz, datetimeoffset) are rendered in UTC and compared
with an explicit `+00:00`. MSSQL timestamps keep the `T` separator (language-independent for
datetime); mysql gets a space.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from dpone_dagster.sources.sql.text.dialects import dialect_text, string_literal

ISO_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?))?$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_HEX = re.compile(r"^0[xX][0-9A-Fa-f]+$")


def iso_timestamp(value: datetime) -> str:
    """ISO-8601 without zone, with 0, 3 or 6 fractional digits (MSSQL datetime takes at most 3)."""
    if value.microsecond == 0:
        return value.isoformat(timespec="seconds")
    if value.microsecond % 1000 == 0:
        return value.isoformat(timespec="milliseconds")
    return value.isoformat(timespec="microseconds")


def literal(dialect: str, value: Any) -> str:
    """A Python value as an SQL literal of the dialect."""
    text = dialect_text(dialect)
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return text.boolean(value)
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
            return text.timestamp(iso_timestamp(utc), True)
        return text.timestamp(iso_timestamp(value), False)
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    if isinstance(value, bytes | bytearray | memoryview):
        return text.binary(bytes(value).hex().upper())
    if isinstance(value, str):
        return string_literal(dialect, value)
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def watermark_literal(dialect: str, kind: str, value: Any) -> str:
    """A stored watermark value (JSON: int or text) as the literal compared with its column.

    Temporal kinds are validated ISO-8601 text sent as untyped string literals (the server converts
    them to the column's type; see the module docstring).
    """
    dialect_module = dialect_text(dialect)
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
        if not ISO_TS.match(text):
            raise ValueError(f"{kind} watermark {value!r} is not an ISO-8601 timestamp")
        return dialect_module.watermark_timestamp(text.replace(" ", "T"), kind == "timestamp_tz")
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
