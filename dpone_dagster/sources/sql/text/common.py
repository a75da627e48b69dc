"""What every piece of SQL text shares: dialect names, table and column descriptions, and the
interface each dialect module (`mssql`, `postgres`, `mysql`) provides."""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

Dialect = Literal["mssql", "postgres", "mysql"]
DIALECTS: tuple[str, ...] = ("mssql", "postgres", "mysql")

# Watermark kinds: how a stored watermark value is typed, rendered and compared.
WatermarkKind = Literal[
    "integer", "decimal", "float", "timestamp", "timestamp_tz", "date", "string", "rowversion"
]

def iso_literal(text: str, utc: bool) -> str:
    """An ISO 8601 timestamp literal: with `+00:00` for an instant (UTC), as written for a
    wall-clock time. MSSQL and PostgreSQL read both forms as is."""
    return f"'{text}+00:00'" if utc else f"'{text}'"


INTEGER_TYPES = {"tinyint", "smallint", "int", "integer", "bigint", "mediumint", "serial", "bigserial"}


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


def check_dialect(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")


def decimal_type(col: ColumnInfo) -> str | None:
    """decimal(p,s) when Spark can hold the precision (p <= 38), else None (keep the read type)."""
    if col.precision is None or not 0 < col.precision <= 38:
        return None
    return f"decimal({col.precision},{col.scale or 0})"


class DialectText(Protocol):
    """The dialect-specific pieces of SQL text; the shared modules validate input and assemble them."""

    CURRENT_SCHEMA: str  # the schema/database an unqualified table lives in
    COUNT: str  # COUNT or COUNT_BIG
    COLUMN_TYPE: str  # the INFORMATION_SCHEMA expression read as column_type

    def quote(self, name: str) -> str: ...

    def string(self, value: str) -> str: ...

    def boolean(self, value: bool) -> str: ...

    def binary(self, hexed: str) -> str: ...

    def timestamp(self, text: str, utc: bool) -> str: ...

    def watermark_timestamp(self, text: str, zoned: bool) -> str: ...

    def target_type(self, col: ColumnInfo) -> str | None: ...

    def read_expression(self, quoted: str, data_type: str) -> str | None: ...

    def rendered_max(self, max_sql: str, kind: str) -> str | None: ...

    def hash_partition(self, quoted: str, num_partitions: int, index: int) -> str: ...
