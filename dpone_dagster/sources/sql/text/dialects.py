"""The dialect modules by name, and the quoting every statement is built from.

Identifiers are always quoted: `[x]` (mssql, `]` doubled), `"x"` (postgres, `"` doubled),
`` `x` `` (mysql, backtick doubled).
"""

from __future__ import annotations

from dpone_dagster.sources.sql.text import mssql, mysql, postgres
from dpone_dagster.sources.sql.text.common import DialectText, Table, check_dialect

_TEXTS: dict[str, DialectText] = {"mssql": mssql, "postgres": postgres, "mysql": mysql}


def dialect_text(dialect: str) -> DialectText:
    """The dialect's text module; ValueError for an unknown dialect."""
    check_dialect(dialect)
    return _TEXTS[dialect]


def quote_ident(dialect: str, name: str) -> str:
    text = dialect_text(dialect)
    if not name or "\x00" in name:
        raise ValueError(f"invalid SQL identifier {name!r}")
    return text.quote(name)


def qualified_name(dialect: str, table: Table | tuple[str | None, str]) -> str:
    schema, name = table
    if schema:
        return f"{quote_ident(dialect, schema)}.{quote_ident(dialect, name)}"
    return quote_ident(dialect, name)


def string_literal(dialect: str, value: str) -> str:
    text = dialect_text(dialect)
    if "\x00" in value:
        raise ValueError("a NUL character cannot be sent in an SQL string literal")
    return text.string(value)
