"""MSSQL Change Data Capture and Change Tracking queries.

`cdc_query` reads `cdc.fn_cdc_get_all_changes_<capture_instance>(from, to, N'all')`: operation 1
delete, 2 insert, 4 update (after image); 3 (update before image) is not returned by N'all' and is
filtered out anyway. LSNs travel as 10-byte hex strings `0x` + 20 hex digits (`normalize_lsn`
validates them) and are inlined as binary literals: Spark wraps a JDBC `query` in a sub-select, so
DECLARE/@variables are not possible there. The stored LSN is the last `to_lsn` that was published;
the next run starts at `sys.fn_cdc_increment_lsn(stored)` (`cdc_increment_lsn_query`) and ends at
`sys.fn_cdc_get_max_lsn()` fixed at plan time. `change_tracking_query` is the Change Tracking
alternative (`CHANGETABLE(CHANGES t, @last_sync_version)` up to
`CHANGE_TRACKING_CURRENT_VERSION()` fixed at plan time).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from dpone_dagster.sources.sql.text.column_types import select_item
from dpone_dagster.sources.sql.text.common import Table
from dpone_dagster.sources.sql.text.dialects import qualified_name, quote_ident, string_literal

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
