"""bcp (MSSQL bulk export) queries and command lines.

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
from typing import Literal, NamedTuple

from dpone_dagster.sources.sql.text import mssql
from dpone_dagster.sources.sql.text.column_types import target_type
from dpone_dagster.sources.sql.text.common import INTEGER_TYPES, ColumnInfo, Table
from dpone_dagster.sources.sql.text.dialects import qualified_name, quote_ident
from dpone_dagster.sources.sql.text.queries import where_clause

MASK = "**********"

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
    if t in mssql.BINARY_TYPES:
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
    if t in INTEGER_TYPES or t in ("decimal", "numeric"):
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
        f"{where_clause(conditions)}"
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
