"""MySQL / MariaDB text: `` `x` `` identifiers, '' strings with `\\` escaped, the type mapping and
server-side renderings, and the session settings every connection gets.

Time zones: a TIMESTAMP column holds an instant (stored in UTC) that the server shows in the
session's `time_zone`, which starts as the server's global zone; DATETIME holds a wall clock that
no zone touches. Every connection therefore sets `time_zone='+00:00'` (`session_variables`), so
TIMESTAMP values, their MAX and the bound literals compared with them are all UTC, whatever the
server's zone. Aware values are sent as their UTC wall clock, timestamps with a space separator.
"""

from __future__ import annotations

import re

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


# --------------------------------------------------------------------------- session time zone

UTC_ZONE = "+00:00"
UTC_SESSION = f"time_zone='{UTC_ZONE}'"
# The spellings of UTC a session's time_zone (or, for SYSTEM, the server's system zone) may show.
UTC_ZONE_NAMES = ("+00:00", "-00:00", "+0:00", "UTC", "Etc/UTC", "GMT", "Etc/GMT", "Universal", "Etc/Universal", "Zulu", "Z", "Coordinated Universal Time")
SESSION_ZONE_QUERY = "SELECT @@SESSION.time_zone AS `time_zone`, @@system_time_zone AS `system_zone`"


def is_utc_session(zone: str | None, system_zone: str | None) -> bool:
    """Whether a session shows TIMESTAMP values in UTC (pure)."""
    if zone == "SYSTEM":
        return system_zone in UTC_ZONE_NAMES
    return zone in UTC_ZONE_NAMES

# One `name=value` assignment of sessionVariables: commas inside quotes do not separate.
_ASSIGNMENT = re.compile(r"""(?:'[^']*'|"[^"]*"|[^,'"])+""")
_ZONE_NAMES = ("time_zone", "@@time_zone", "@@session.time_zone", "session time_zone")


def _is_zone(assignment: str) -> bool:
    name = assignment.partition("=")[0].strip().lower()
    return " ".join(name.split()) in _ZONE_NAMES


def session_variables(configured: str | None) -> tuple[str, str | None]:
    """The connection's `sessionVariables` with the time zone put on UTC (the others kept, in
    order), and the zone the configured value named (None when it named none)."""
    assignments = [a.strip() for a in _ASSIGNMENT.findall(configured or "") if a.strip()]
    zones = [a for a in assignments if _is_zone(a)]
    named = zones[-1].partition("=")[2].strip().strip("'\"") if zones else None
    kept = [a for a in assignments if not _is_zone(a)]
    return ",".join([*kept, UTC_SESSION]), named


def utc_from_zone_query(literal: str, zone: str | None) -> str:
    """The wall clock `literal` (a validated watermark literal) read in `zone` and rendered in UTC,
    with the zone used; `zone` None means the server's global zone, where a session starts.
    The value is NULL when the server does not know the zone (named zones need its zone tables)."""
    zone_sql = string(zone) if zone else "@@GLOBAL.time_zone"
    converted = f"CONVERT_TZ(CAST({literal} AS DATETIME(6)), {zone_sql}, '{UTC_ZONE}')"
    return (
        f"SELECT DATE_FORMAT({converted}, '%Y-%m-%dT%H:%i:%s.%f') AS `utc_value`, {zone_sql} AS `time_zone`"
    )
