"""Pure SQL and command generation for the SQL sources (mssql | postgres | mysql): no IO here.

Everything the SQL source sends to a database, or to `bcp`, is built in this package, so that the
exact text can be asserted in tests (MSSQL has no server on the test machines). The shared modules
validate input and assemble statements; the dialect-specific pieces live in `mssql`, `postgres`
and `mysql` (the `common.DialectText` interface):

- `common`: dialect names, `Table`, `ColumnInfo`; `dialects`: quoting of identifiers and strings;
- `literals`: Python values and stored watermark values as literals; `lookback`: watermark minus
  lookback;
- `column_types`: watermark kinds, Spark target types, read expressions;
- `queries`: the bounded SELECT, MAX/COUNT, catalog and partitioning queries;
- `cdc`: MSSQL CDC and Change Tracking; `bcp`: the bcp export SELECT and command line;
- `mysql`: also the UTC session every MySQL/MariaDB connection gets (`mysql_session_variables`).

This module re-exports their public names (`from dpone_dagster.sources.sql import text as T`).
"""

from dpone_dagster.sources.sql.text.bcp import (
    BCP_BINARY_PREFIX,
    BCP_ESCAPE,
    BCP_FIELD_TERMINATOR,
    BCP_ROW_TERMINATOR,
    BCP_STRING_PREFIX,
    MASK,
    BcpColumn,
    BcpCommand,
    bcp_column,
    bcp_command,
    bcp_select,
)
from dpone_dagster.sources.sql.text.cdc import (
    CDC_DELETE,
    CDC_INSERT,
    CDC_OPERATION,
    CDC_SEQVAL,
    CDC_START_LSN,
    CDC_UPDATE_AFTER,
    CDC_UPDATE_BEFORE,
    CT_OPERATION,
    CT_VERSION,
    ZERO_LSN,
    cdc_increment_lsn_query,
    cdc_max_lsn_query,
    cdc_min_lsn_query,
    cdc_query,
    change_tracking_current_version_query,
    change_tracking_min_valid_version_query,
    change_tracking_query,
    compare_lsn,
    default_capture_instance,
    increment_lsn,
    lsn_bytes,
    normalize_lsn,
)
from dpone_dagster.sources.sql.text.column_types import (
    read_expression,
    select_item,
    target_type,
    watermark_kind,
)
from dpone_dagster.sources.sql.text.common import DIALECTS, ColumnInfo, Dialect, Table, WatermarkKind
from dpone_dagster.sources.sql.text.dialects import qualified_name, quote_ident, string_literal
from dpone_dagster.sources.sql.text.literals import iso_timestamp, literal, render_bound, watermark_literal
from dpone_dagster.sources.sql.text.lookback import apply_lookback, parse_duration, parse_timestamp
from dpone_dagster.sources.sql.text.mysql import SESSION_ZONE_QUERY as MYSQL_SESSION_ZONE_QUERY
from dpone_dagster.sources.sql.text.mysql import UTC_SESSION as MYSQL_UTC_SESSION
from dpone_dagster.sources.sql.text.mysql import UTC_ZONE_NAMES as MYSQL_UTC_ZONE_NAMES
from dpone_dagster.sources.sql.text.mysql import is_utc_session as mysql_is_utc_session
from dpone_dagster.sources.sql.text.mysql import session_variables as mysql_session_variables
from dpone_dagster.sources.sql.text.mysql import utc_from_zone_query as mysql_utc_from_zone_query
from dpone_dagster.sources.sql.text.queries import (
    active_rowversion_query,
    and_predicates,
    bounds_query,
    columns_query,
    count_query,
    hash_predicate,
    hash_predicates,
    max_query,
    rendered_max,
    select_query,
    where_conditions,
    window_count_query,
)

__all__ = [
    "BCP_BINARY_PREFIX",
    "BCP_ESCAPE",
    "BCP_FIELD_TERMINATOR",
    "BCP_ROW_TERMINATOR",
    "BCP_STRING_PREFIX",
    "CDC_DELETE",
    "CDC_INSERT",
    "CDC_OPERATION",
    "CDC_SEQVAL",
    "CDC_START_LSN",
    "CDC_UPDATE_AFTER",
    "CDC_UPDATE_BEFORE",
    "CT_OPERATION",
    "CT_VERSION",
    "DIALECTS",
    "MASK",
    "MYSQL_SESSION_ZONE_QUERY",
    "MYSQL_UTC_SESSION",
    "MYSQL_UTC_ZONE_NAMES",
    "mysql_is_utc_session",
    "ZERO_LSN",
    "BcpColumn",
    "BcpCommand",
    "ColumnInfo",
    "Dialect",
    "Table",
    "WatermarkKind",
    "active_rowversion_query",
    "and_predicates",
    "apply_lookback",
    "bcp_column",
    "bcp_command",
    "bcp_select",
    "bounds_query",
    "cdc_increment_lsn_query",
    "cdc_max_lsn_query",
    "cdc_min_lsn_query",
    "cdc_query",
    "change_tracking_current_version_query",
    "change_tracking_min_valid_version_query",
    "change_tracking_query",
    "columns_query",
    "compare_lsn",
    "count_query",
    "default_capture_instance",
    "hash_predicate",
    "hash_predicates",
    "increment_lsn",
    "iso_timestamp",
    "literal",
    "lsn_bytes",
    "max_query",
    "mysql_session_variables",
    "mysql_utc_from_zone_query",
    "normalize_lsn",
    "parse_duration",
    "parse_timestamp",
    "qualified_name",
    "quote_ident",
    "read_expression",
    "render_bound",
    "rendered_max",
    "select_item",
    "select_query",
    "string_literal",
    "target_type",
    "watermark_kind",
    "watermark_literal",
    "where_conditions",
    "window_count_query",
]
