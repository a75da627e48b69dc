"""SQL sources (type: mssql | postgres | mysql): plan a bounded extract, then read it on Spark.

`SqlBatchSource.plan()` fixes the boundary before anything is read and `extract()` reads exactly
that boundary (Spark JDBC by default; `bcp` or `pyodbc` for MSSQL exports). The SQL text itself is
built in `sql_text` (pure, asserted in tests).

Methods
-------
- full (strategy full_refresh / replace / snapshot_reconciliation, or no incremental_column): the
  whole table (within `predicate`); no watermark is stored.
- incremental (incremental_append / incremental_merge with `incremental_column`): the window
  described by THE TIE RULE below; the watermark stored after sink success is
  `{"column", "value", "type"}` with the upper bound of this run.
- cdc (mssql only): `cdc.fn_cdc_get_all_changes_<capture_instance>` between the LSN after the
  stored one (`sys.fn_cdc_increment_lsn`) and `sys.fn_cdc_get_max_lsn()` fixed at plan time;
  operation 1 becomes `__dpone__op = delete`. LSNs are stored as `0x` + 20 hex digits.

THE TIE RULE
------------
An incremental run reads `column >= lower AND column <= upper`.

- `upper` is MAX(column) queried BEFORE reading. Rows committed during the run with larger values
  belong to the next run; this run's stored watermark is `upper`.
- `lower` is the stored watermark and it is INCLUSIVE. Reading `column > stored` would lose every
  row committed later with the same value as the stored watermark (two transactions stamping the
  same `updated_at`, coarse timestamp precision, equal ids from concurrent inserts): the next run
  would start strictly after it. With `>=`, rows sitting exactly on the boundary value are read
  again by the next run: delivery is at-least-once on the boundary. With `sink.strategy.unique_key`
  (duplicate_policy keep_last) duplicates within a batch collapse by key, and consumers upsert by
  key, so the re-read is harmless.
- `lookback` widens the window to `column >= stored - lookback`, for late commits: rows that
  become visible after a run with a value *below* the stored watermark (a long transaction that
  stamped `updated_at` when it started). A number for numeric columns; seconds or an ISO-8601
  duration (PT15M, P1D) for datetime columns; a duration floored to whole days for dates.
- Not covered by a watermark: rows whose column is NULL (never read by incremental runs), rows
  arriving with a value below `stored - lookback`, updates that do not change the column, and
  hard deletes (use cdc, or a `__dpone__op` column in the table: values `delete`/`d` become
  deletes).
- Watermark values are rendered by the server as ISO text in the column's own precision and sent
  back as untyped literals (see `sql_text`): the bounds do not depend on JVM/Python time zones.

Type mapping (payload columns; a cast after the read where a driver delivers something else)
-------------------------------------------------------------------------------------------
decimal/numeric(p,s) -> decimal(p,s) (p <= 38); money -> decimal(19,4), smallmoney ->
decimal(10,4); datetime/datetime2/smalldatetime, timestamp, DATETIME/TIMESTAMP -> timestamp (UTC
session; jTDS delivers datetime2 as text, cast back); datetimeoffset -> timestamp (converted to UTC
in SQL), timestamptz -> timestamp; date -> date; binary/varbinary/image/rowversion, bytea, BLOB/
VARBINARY -> binary; uniqueidentifier, uuid -> string; bit/boolean -> boolean (mysql tinyint(1)
too); tinyint (mssql, 0..255) -> smallint; time, interval, json, xml, sql_variant, hierarchyid,
geography/geometry (WKT) -> string; float -> double, real -> float.

Time zones: Spark converts JDBC timestamps through the JVM default zone; the engine's session is
UTC, and the JVMs should run with `-Duser.timezone=UTC` so wall-clock types arrive unchanged.

Export modes
------------
- jdbc (default): `spark.read.format("jdbc")` with `query` (or a `dbtable` sub-select for
  partitioned reads: partitionColumn/lowerBound/upperBound/numPartitions for numeric/date columns,
  hash predicates per partition for others), `fetchsize` = batch_size.
- bcp (mssql): `bcp "<select>" queryout` to a local file, read with Spark's CSV reader using the
  escaping scheme documented in `sql_text` (lossless, NULL vs empty string kept). The file lives on
  the driver's filesystem (DPONE_BCP_DIR): with a cluster master it must be a shared path.
- pyodbc: a cursor on the Spark DRIVER fetches batch_size rows at a time into Arrow and builds the
  DataFrame from them: meant for small tables.

The extract DataFrame is lazy; the engine persists it, so the source is read once per run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from math import ceil, floor
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dpone_dagster import columns as C
from dpone_dagster.connections import JdbcConnection
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest.models import Manifest, SqlSource
from dpone_dagster.redact import redact_text
from dpone_dagster.sources import sql_text as T
from dpone_dagster.sources.kafka import ExtractResult

Log = Callable[[str], None]

DEFAULT_DRIVERS = {
    "mssql": "net.sourceforge.jtds.jdbc.Driver",
    "postgres": "org.postgresql.Driver",
    "mysql": "org.mariadb.jdbc.Driver",
}
MSSQL_MICROSOFT_DRIVER = "com.microsoft.sqlserver.jdbc.SQLServerDriver"
DEFAULT_PORTS = {"mssql": 1433, "postgres": 5432, "mysql": 3306}
DEBIAN_JARS = {
    "net.sourceforge.jtds.jdbc.Driver": ("/usr/share/java/jtds.jar", "libjtds-java"),
    "org.postgresql.Driver": ("/usr/share/java/postgresql.jar", "libpostgresql-jdbc-java"),
    "org.mariadb.jdbc.Driver": ("/usr/share/java/mariadb-java-client.jar", "libmariadb-java"),
}
ODBC_DRIVERS = {
    "mssql": "ODBC Driver 18 for SQL Server",
    "postgres": "PostgreSQL Unicode",
    "mysql": "MariaDB ODBC 3.1 Driver",
}
# Metadata columns read beside the payload and dropped after use.
_SOURCE_OP_DELETE_VALUES = ("delete", "d")
_INCREMENTAL_MODES = ("incremental_append", "incremental_merge")
_RANGE_PARTITION_KINDS = ("integer", "decimal", "float", "date", "timestamp", "timestamp_tz")


@dataclass(frozen=True)
class SqlBoundary:
    """What one run reads, fixed before reading (retries read the same window)."""

    method: str  # full | incremental | cdc
    table: str
    column: str | None
    lower: Any
    lower_inclusive: bool
    upper: Any
    query: str
    total: int | None
    new_watermark: dict[str, Any] | None
    dialect: str = ""
    kind: str | None = None  # watermark kind (sql_text.WatermarkKind) or "lsn"
    stored_watermark: dict[str, Any] | None = None
    empty: bool = False  # nothing to read (the query returns no rows)
    columns: tuple[T.ColumnInfo, ...] = ()  # payload columns as the catalog describes them
    extra_columns: tuple[T.ColumnInfo, ...] = ()  # read for ordering/partitioning, then dropped
    conditions: tuple[str, ...] = ()  # the WHERE conditions of `query` (partitioned/bcp reads reuse them)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["columns"] = [{"name": c.name, "type": c.data_type} for c in self.columns]
        data["extra_columns"] = [c.name for c in self.extra_columns]
        data["conditions"] = list(self.conditions)
        data["notes"] = list(self.notes)
        data["lower"] = _json_safe(self.lower)
        data["upper"] = _json_safe(self.upper)
        return data


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class SqlBatchSource:
    """A bounded batch over one table of an SQL database."""

    def __init__(self, manifest: Manifest, connection: JdbcConnection):
        if not isinstance(manifest.source, SqlSource):
            raise ConfigError(f"SqlBatchSource needs an SQL source, got source.type: {manifest.source.type}")
        self.manifest = manifest
        self.source: SqlSource = manifest.source
        self.options = manifest.source.options
        self.dialect: str = manifest.source.type
        self.connection = connection
        self.strategy = manifest.sink.strategy
        self.table = _table_of(self.source)
        self._catalog: tuple[T.ColumnInfo, ...] | None = None

    # ----------------------------------------------------------------------- connection

    def driver_class(self) -> str:
        return self.options.jdbc_driver or self.connection.driver or DEFAULT_DRIVERS[self.dialect]

    def jdbc_url(self) -> str:
        if self.connection.jdbc_url:
            return self.connection.jdbc_url
        host = self.connection.host or ""
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        port = self.connection.port or DEFAULT_PORTS[self.dialect]
        database = self.connection.database or ""
        driver = self.driver_class()
        if self.dialect == "mssql":
            if driver == MSSQL_MICROSOFT_DRIVER:
                return f"jdbc:sqlserver://{host}:{port}" + (f";databaseName={database}" if database else "")
            return f"jdbc:jtds:sqlserver://{host}:{port}/{database}"
        if self.dialect == "postgres":
            return f"jdbc:postgresql://{host}:{port}/{database}"
        # Spark applies its MySQL dialect (backtick quoting, type mapping) to jdbc:mysql URLs only;
        # MariaDB Connector/J 3 accepts that scheme with permitMysqlScheme (2.x ignores the flag).
        url = f"jdbc:mysql://{host}:{port}/{database}"
        return url + "?permitMysqlScheme" if driver == DEFAULT_DRIVERS["mysql"] else url

    def properties(self) -> dict[str, str]:
        """JDBC connection properties, including the password: never log this (see describe())."""
        props = {k: v for k, v in self.connection.properties.items() if k != "odbc_driver"}
        if self.connection.user:
            props["user"] = self.connection.user
        if self.connection.password is not None:
            props["password"] = self.connection.password.get_secret_value()
        props["fetchsize"] = str(self.options.batch_size)
        return props

    def describe(self) -> dict[str, Any]:
        """Safe for plans, logs and artifacts: secrets masked."""
        connection = self.connection.describe()
        return {
            "type": self.dialect,
            "table": T.qualified_name(self.dialect, self.table),
            "url": redact_text(self.jdbc_url()),
            "driver": self.driver_class(),
            "user": connection.get("user"),
            "password": connection.get("password"),
            "properties": connection.get("properties", {}),
            "export_mode": self.options.export_mode,
            "fetchsize": self.options.batch_size,
            "incremental_column": self.options.incremental_column,
            "partition_column": self.options.partition_column,
            "num_partitions": self.options.num_partitions,
        }

    # ----------------------------------------------------------------------- plan

    def plan(self, spark: SparkSession, stored_watermark: dict[str, Any] | None = None) -> SqlBoundary:
        """Fix the boundary: catalog check, then MAX/COUNT (or the LSN range) before anything is read."""
        if self.strategy.mode == "cdc" and self.dialect != "mssql":
            raise ConfigError("sink.strategy.mode: cdc is only available for source.type: mssql")
        self.check_driver(spark)
        catalog = self.catalog(spark)
        payload = self._payload_columns(catalog)
        mode = self.strategy.mode
        if mode == "cdc":
            return self._plan_cdc(spark, payload, stored_watermark)
        if mode == "kafka_offsets":
            raise ConfigError(
                "sink.strategy.mode: kafka_offsets needs a Kafka source; use incremental_append"
            )
        column = self.options.incremental_column
        if mode in _INCREMENTAL_MODES and column:
            return self._plan_incremental(spark, catalog, payload, stored_watermark)
        notes = []
        if mode in _INCREMENTAL_MODES:
            notes.append(
                f"{mode} without source.options.incremental_column: every run reads the whole table "
                "(set incremental_column to read only new and changed rows)"
            )
        return self._plan_full(spark, catalog, payload, notes)

    def _plan_full(
        self,
        spark: SparkSession,
        catalog: Sequence[T.ColumnInfo],
        payload: list[T.ColumnInfo],
        notes: list[str],
    ) -> SqlBoundary:
        extras = self._extra_columns(catalog, payload, None)
        conditions = T.where_conditions(self.dialect, self.options.predicate)
        query = self._select(payload + extras, self.options.predicate)
        rows = self.run_query(
            spark, T.count_query(self.dialect, self.table, self.options.predicate), "count the rows"
        )
        total = int(rows[0][0]) if rows and rows[0][0] is not None else None
        return SqlBoundary(
            method="full",
            table=T.qualified_name(self.dialect, self.table),
            column=None,
            lower=None,
            lower_inclusive=True,
            upper=None,
            query=query,
            total=total,
            new_watermark=None,
            dialect=self.dialect,
            empty=total == 0,
            columns=tuple(payload),
            extra_columns=tuple(extras),
            conditions=tuple(conditions),
            notes=tuple([*notes, f"full read of {T.qualified_name(self.dialect, self.table)}"]),
        )

    def _plan_incremental(
        self,
        spark: SparkSession,
        catalog: Sequence[T.ColumnInfo],
        payload: list[T.ColumnInfo],
        stored: dict[str, Any] | None,
    ) -> SqlBoundary:
        column = self.options.incremental_column
        assert column is not None
        info = self._column(catalog, column, "source.options.incremental_column")
        kind = T.watermark_kind(self.dialect, info.data_type)
        if kind is None:
            raise ConfigError(
                f"source.options.incremental_column '{column}' has type {info.data_type}, which cannot order "
                "rows for a watermark. Fix: use a numeric, date/time or rowversion column (e.g. updated_at or an "
                "identity id), or strategy full_refresh."
            )
        stored_value = self._stored_value(stored, column, kind)
        lookback = self.options.lookback
        try:
            lower = T.apply_lookback(kind, stored_value, lookback) if stored_value is not None else None
        except ValueError as exc:
            raise ConfigError(f"source.options.lookback: {exc}. Fix: correct lookback.") from None
        predicate = self.options.predicate
        rows = self.run_query(
            spark,
            T.max_query(self.dialect, self.table, column, predicate, kind=kind, lower=lower, with_count=True),
            "fix the upper bound",
        )
        raw_upper, count = (rows[0][0], rows[0][1]) if rows else (None, 0)
        upper = _watermark_value(kind, raw_upper)
        empty = upper is None
        extras = self._extra_columns(catalog, payload, column)
        if empty:
            read_predicate = T.and_predicates(f"({predicate})" if predicate else None, "1 = 0")
            query = self._select(payload + extras, read_predicate)
            conditions = T.where_conditions(self.dialect, read_predicate)
        else:
            query = self._select(payload + extras, predicate, column, lower, upper, kind)
            conditions = T.where_conditions(self.dialect, predicate, column, lower, True, upper, kind=kind)
        notes = [self._tie_note(column, lower, upper, stored_value, kind)]
        if empty:
            notes.append(f"no rows with {column} >= {lower}: nothing to read; the stored watermark is kept")
        notes.append(f"rows with NULL {column} are never read by incremental runs")
        new_watermark = None
        if upper is not None:
            new_watermark = {"column": column, "value": upper, "type": kind}
        elif stored:
            new_watermark = dict(stored)
        return SqlBoundary(
            method="incremental",
            table=T.qualified_name(self.dialect, self.table),
            column=column,
            lower=lower,
            lower_inclusive=True,
            upper=upper,
            query=query,
            total=int(count or 0),
            new_watermark=new_watermark,
            dialect=self.dialect,
            kind=kind,
            stored_watermark=dict(stored) if stored else None,
            empty=empty,
            columns=tuple(payload),
            extra_columns=tuple(extras),
            conditions=tuple(conditions),
            notes=tuple(notes),
        )

    def _tie_note(self, column: str, lower: Any, upper: Any, stored: Any, kind: str) -> str:
        if lower is None:
            return f"first incremental run: {column} <= {upper} (upper bound fixed before reading)"
        widened = (
            f" (stored {stored} minus lookback {self.options.lookback})" if self.options.lookback else ""
        )
        return (
            f"incremental window {column} >= {lower}{widened} AND {column} <= {upper}: the lower bound is inclusive, "
            "so rows at the stored watermark are read again (at-least-once on the boundary; unique_key + keep_last "
            "collapses them and consumers upsert by key); the upper bound is the maximum at plan time"
        )

    def _stored_value(self, stored: dict[str, Any] | None, column: str, kind: str) -> Any:
        if not stored:
            return None
        if not isinstance(stored, dict) or "value" not in stored:
            raise ConfigError(
                "the stored watermark is not a {column, value, type} mapping. Fix: reset the pipeline's stored "
                "watermark so that the next run starts from scratch."
            )
        if stored.get("column") not in (None, column):
            raise ConfigError(
                f"the stored watermark is for column '{stored.get('column')}' but source.options.incremental_column "
                f"is '{column}'. Fix: restore incremental_column, or reset the pipeline's stored watermark (the next "
                "run then reads the whole table)."
            )
        if stored.get("type") not in (None, kind):
            raise ConfigError(
                f"the stored watermark has type {stored.get('type')} but column '{column}' is now {kind}. Fix: reset "
                "the pipeline's stored watermark."
            )
        value = stored["value"]
        if value is None:
            return None
        try:
            T.watermark_literal(self.dialect, kind, value)
        except ValueError as exc:
            raise ConfigError(
                f"the stored watermark is invalid: {exc}. Fix: reset the pipeline's stored watermark."
            ) from None
        return value

    def _plan_cdc(
        self, spark: SparkSession, payload: list[T.ColumnInfo], stored: dict[str, Any] | None
    ) -> SqlBoundary:
        if self.dialect != "mssql":
            raise ConfigError("sink.strategy.mode: cdc is only available for source.type: mssql")
        capture = self.options.capture_instance or T.default_capture_instance(self.table)
        min_rows = self.run_query(spark, T.cdc_min_lsn_query(capture), "read the CDC minimum LSN")
        min_lsn = min_rows[0][0] if min_rows else None
        if not min_lsn or T.normalize_lsn(min_lsn) == T.ZERO_LSN:
            raise ConfigError(
                f"CDC capture instance '{capture}' does not exist for {T.qualified_name('mssql', self.table)}. Fix: "
                "enable CDC (sys.sp_cdc_enable_db; sys.sp_cdc_enable_table) or set source.options.capture_instance."
            )
        max_rows = self.run_query(spark, T.cdc_max_lsn_query(), "read the CDC maximum LSN")
        to_lsn = T.normalize_lsn(max_rows[0][0]) if max_rows and max_rows[0][0] else None
        stored_lsn = None
        if stored:
            if stored.get("type") != "lsn":
                raise ConfigError(
                    f"the stored watermark has type {stored.get('type')}, not an LSN (was the pipeline incremental "
                    "before?). Fix: reset the pipeline's stored watermark and run a full_refresh first."
                )
            try:
                stored_lsn = T.normalize_lsn(stored["value"])
            except (KeyError, ValueError) as exc:
                raise ConfigError(f"the stored CDC watermark is invalid: {exc}. Fix: reset it.") from None
        if stored_lsn is None:
            from_lsn = T.normalize_lsn(min_lsn)
        else:
            rows = self.run_query(spark, T.cdc_increment_lsn_query(stored_lsn), "increment the stored LSN")
            from_lsn = T.normalize_lsn(rows[0][0])
            if T.compare_lsn(from_lsn, min_lsn) < 0:
                raise RunFailed(
                    f"CDC changes after the stored LSN {stored_lsn} were removed by the CDC cleanup job (the oldest "
                    f"available LSN of '{capture}' is {T.normalize_lsn(min_lsn)}). Run a full_refresh to resynchronise, "
                    "then resume cdc; lengthen the cleanup retention to avoid this."
                )
        names = [c.name for c in payload]
        expressions = self._expressions(payload)
        empty = to_lsn is None or T.compare_lsn(from_lsn, to_lsn) > 0
        if empty:
            edge = to_lsn or from_lsn
            query = T.cdc_query(capture, edge, edge, names, expressions=expressions, empty=True)
        else:
            assert to_lsn is not None
            query = T.cdc_query(capture, from_lsn, to_lsn, names, expressions=expressions)
        new_value = to_lsn if to_lsn is not None and not empty else stored_lsn
        new_watermark = (
            {"column": "__$start_lsn", "value": new_value, "type": "lsn", "capture_instance": capture}
            if new_value
            else None
        )
        return SqlBoundary(
            method="cdc",
            table=T.qualified_name("mssql", self.table),
            column="__$start_lsn",
            lower=from_lsn,
            lower_inclusive=True,
            upper=to_lsn,
            query=query,
            total=None,
            new_watermark=new_watermark,
            dialect=self.dialect,
            kind="lsn",
            stored_watermark=dict(stored) if stored else None,
            empty=empty,
            columns=tuple(payload),
            notes=(
                f"cdc from {from_lsn} to {to_lsn} (max LSN at plan time) of capture instance '{capture}'"
                + (" (the LSN after the stored one)" if stored_lsn else " (the oldest available LSN)"),
                "operation 1 -> delete, 2 insert and 4 update (after image) -> upsert; ordered by (start_lsn, seqval)",
            ),
        )

    # ----------------------------------------------------------------------- extract

    def extract(self, spark: SparkSession, boundary: SqlBoundary, log: Log | None = None) -> ExtractResult:
        log = log or (lambda message: None)
        mode = self.options.export_mode
        notes = list(boundary.notes)
        if mode == "bcp":
            raw = self._read_bcp(spark, boundary, log)
            notes.append(
                "export_mode bcp: queryout file read with Spark's CSV reader (escaping: see sql_text)"
            )
        elif mode == "pyodbc":
            raw = self._read_pyodbc(spark, boundary, log)
            notes.append("export_mode pyodbc: rows fetched on the Spark driver (for small tables)")
        else:
            raw, how = self._read_jdbc(spark, boundary)
            notes.append(how)
        df, schema = self._finish(raw, boundary)
        return ExtractResult(lambda: df, schema=schema, envelope="flat", notes=notes)

    def _read_jdbc(self, spark: SparkSession, boundary: SqlBoundary) -> tuple[DataFrame, str]:
        column, n = self.options.partition_column, self.options.num_partitions
        if column and n > 1 and not boundary.empty and boundary.method != "cdc":
            info = self._column(
                boundary.columns + boundary.extra_columns, column, "source.options.partition_column"
            )
            subquery = f"({boundary.query}) dpone_src"
            kind = T.watermark_kind(self.dialect, info.data_type)
            if kind in _RANGE_PARTITION_KINDS:
                bounds = self._partition_bounds(spark, boundary, column, kind)
                if bounds is not None:
                    lower, upper = bounds
                    reader = (
                        self._reader(spark)
                        .option("dbtable", subquery)
                        .option("partitionColumn", column)
                        .option("lowerBound", lower)
                        .option("upperBound", upper)
                        .option("numPartitions", str(n))
                    )
                    df = self._load(reader, "read the table")
                    return df, f"jdbc read in {n} partitions by range of {column} [{lower}, {upper}]"
            else:
                predicates = T.hash_predicates(self.dialect, column, n)
                props = {**self.properties(), "driver": self.driver_class()}
                try:
                    df = spark.read.jdbc(self.jdbc_url(), subquery, predicates=predicates, properties=props)
                except Exception as exc:  # noqa: BLE001 - classified below
                    raise self._error(exc, "read the table") from None
                return df, f"jdbc read in {n} partitions by hash of {column}"
        reader = self._reader(spark).option("query", boundary.query)
        return self._load(reader, "read the table"), "jdbc read in one partition"

    def _partition_bounds(
        self, spark: SparkSession, boundary: SqlBoundary, column: str, kind: str
    ) -> tuple[str, str] | None:
        lower, upper = self.options.lower_bound, self.options.upper_bound
        if lower is None or upper is None:
            predicate = " AND ".join(boundary.conditions) or None
            sql = T.bounds_query(self.dialect, self.table, column, predicate)
            df = self._load(self._reader(spark).option("query", sql), "read the partition bounds")
            if kind in ("date", "timestamp", "timestamp_tz"):
                # Rendered by Spark in the session zone, the zone Spark parses lowerBound/upperBound in.
                df = df.select([F.col(c).cast("string") for c in df.columns])
            low, high = df.collect()[0]
            if low is None or high is None:
                return None
            if isinstance(low, Decimal | float):
                low, high = floor(low), ceil(high)
            lower = low if lower is None else lower
            upper = high if upper is None else upper
        return str(lower), str(upper)

    def _read_bcp(self, spark: SparkSession, boundary: SqlBoundary, log: Log) -> DataFrame:
        if self.dialect != "mssql":
            raise ConfigError(
                f"source.options.export_mode: bcp exports from SQL Server only, not {self.dialect}. Fix: use "
                "export_mode: jdbc."
            )
        if boundary.method == "cdc":
            raise ConfigError("cdc reads through JDBC. Fix: use export_mode: jdbc with strategy cdc.")
        executable = shutil.which("bcp") or shutil.which("/opt/mssql-tools18/bin/bcp")
        if executable is None:
            raise ConfigError(
                "source.options.export_mode: bcp needs the `bcp` command, which is not on PATH. Fix: install the "
                "Microsoft SQL Server command-line tools (package mssql-tools18 from packages.microsoft.com; "
                "add /opt/mssql-tools18/bin to PATH), or use export_mode: jdbc."
            )
        columns = list(boundary.columns + boundary.extra_columns)
        query, specs = T.bcp_select(self.table, columns, boundary.conditions)
        directory = tempfile.mkdtemp(prefix="dpone_bcp_", dir=os.environ.get("DPONE_BCP_DIR") or None)
        path = os.path.join(directory, f"{uuid.uuid4().hex}.dat")
        command = T.bcp_command(
            query,
            path,
            server=self.connection.host or "",
            database=self.connection.database,
            user=self.connection.user,
            password=self.connection.password.get_secret_value() if self.connection.password else None,
            port=self.connection.port,
            trust_server_certificate=self.connection.properties.get("trustServerCertificate", "").lower()
            == "true",
            executable=executable,
        )
        log(f"extract: {command.redacted()}")
        result = subprocess.run(
            list(command.argv),
            env={**os.environ, **command.env},
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            detail = redact_text((result.stderr or result.stdout or "").strip()[-2000:])
            raise RunFailed(f"bcp exited with {result.returncode}: {detail}")
        return read_bcp_file(spark, path, specs)

    def _read_pyodbc(self, spark: SparkSession, boundary: SqlBoundary, log: Log) -> DataFrame:
        try:
            import pyodbc  # type: ignore[import-not-found]
        except ImportError:
            raise ConfigError(
                "source.options.export_mode: pyodbc needs the pyodbc package and an ODBC driver. Fix: pip install "
                "pyodbc and install the driver (msodbcsql18 for SQL Server, odbc-postgresql, odbc-mariadb), or use "
                "export_mode: jdbc."
            ) from None
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        probe = self._load(self._reader(spark).option("query", boundary.query), "read the result schema")
        schema = probe.schema  # resolved with WHERE 1=0: no data is read here
        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        converters = [_arrow_converter(f.dataType.simpleString()) for f in schema.fields]
        names = schema.fieldNames()
        try:
            connection = pyodbc.connect(self.odbc_connection_string())
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self._error(exc, "connect through ODBC") from None
        batches = []
        try:
            cursor = connection.cursor()
            cursor.execute(boundary.query)
            while True:
                rows = cursor.fetchmany(self.options.batch_size)
                if not rows:
                    break
                columns = [[convert(row[i]) for row in rows] for i, convert in enumerate(converters)]
                batches.append(
                    pa.RecordBatch.from_arrays(
                        [
                            pa.array(values, type=arrow_schema.field(i).type)
                            for i, values in enumerate(columns)
                        ],
                        schema=arrow_schema,
                    )
                )
                log(f"extract: fetched {sum(b.num_rows for b in batches)} rows through pyodbc")
        finally:
            connection.close()
        table = pa.Table.from_batches(batches, schema=arrow_schema)
        return spark.createDataFrame(table).toDF(*names)

    def odbc_connection_string(self) -> str:
        """An ODBC connection string for pyodbc (holds the password: never log it)."""
        c = self.connection
        driver = c.properties.get("odbc_driver") or ODBC_DRIVERS[self.dialect]
        parts = {"DRIVER": driver}
        port = c.port or DEFAULT_PORTS[self.dialect]
        if self.dialect == "mssql":
            parts["SERVER"] = f"tcp:{c.host},{port}"
        else:
            parts["SERVER"] = c.host or ""
            parts["PORT"] = str(port)
        if c.database:
            parts["DATABASE"] = c.database
        if c.user:
            parts["UID"] = c.user
        if c.password is not None:
            parts["PWD"] = c.password.get_secret_value()
        return ";".join(f"{k}={{{v.replace('}', '}}')}}}" for k, v in parts.items())

    def _finish(self, raw: DataFrame, boundary: SqlBoundary) -> tuple[DataFrame, StructType]:
        """Cast to the mapped types, then add __dpone__op / __dpone__order / __dpone__corrupt."""
        types = dict(raw.dtypes)
        cast: dict[str, Column] = {}
        for col in boundary.columns + boundary.extra_columns:
            target = T.target_type(self.dialect, col)
            if col.name not in types:
                continue
            current = types[col.name]
            if target and current != target:
                cast[col.name] = _cast(F.col(_q(col.name)), current, target).alias(col.name)
            else:
                cast[col.name] = F.col(_q(col.name))
        df = raw
        names = list(raw.columns)
        if boundary.method == "cdc":
            for name in (T.CDC_START_LSN, T.CDC_SEQVAL, T.CDC_OPERATION):
                if name not in names:
                    df = df.withColumn(name, F.lit(None).cast("string" if name != T.CDC_OPERATION else "int"))
            op = F.when(F.col(T.CDC_OPERATION) == T.CDC_DELETE, F.lit(C.DELETE)).otherwise(F.lit(C.UPSERT))
            order = F.struct(F.col(T.CDC_START_LSN).alias("lsn"), F.col(T.CDC_SEQVAL).alias("seq"))
        else:
            if C.OP in names:
                text = F.lower(F.trim(F.col(_q(C.OP)).cast("string")))
                op = F.when(text.isin(*_SOURCE_OP_DELETE_VALUES), F.lit(C.DELETE)).otherwise(F.lit(C.UPSERT))
            else:
                op = F.lit(C.UPSERT)
            fields = []
            if boundary.column and boundary.column in cast:
                fields.append(cast[boundary.column].alias("w"))
            payload_names = {c.name for c in boundary.columns}
            for i, key in enumerate(self.strategy.unique_key_columns):
                if key in payload_names and key in cast:
                    fields.append(cast[key].alias(f"k{i}"))
            if not fields:
                fields.append(F.monotonically_increasing_id().alias("seq"))
            order = F.struct(*fields)
        payload = [c.name for c in boundary.columns if c.name not in C.METADATA and c.name in cast]
        out = df.select(
            *(cast[name] for name in payload),
            op.alias(C.OP),
            order.alias(C.ORDER),
            F.lit(None).cast("string").alias(C.CORRUPT),
        )
        schema = StructType([out.schema[name] for name in payload])
        return out, schema

    # ----------------------------------------------------------------------- JDBC plumbing

    def check_driver(self, spark: SparkSession) -> None:
        """The JDBC driver class must be loadable by the Spark driver (jars are fixed at session start)."""
        name = self.driver_class()
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:  # Spark Connect: the server resolves drivers; errors surface on the first read
            return
        try:
            jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        except Exception:  # noqa: BLE001 - any failure means the class cannot be loaded
            raise ConfigError(self._driver_fix(name)) from None

    def _driver_fix(self, name: str) -> str:
        jar = self.options.jdbc_jar
        jar_hint, package = DEBIAN_JARS.get(name, (None, None))
        suggested = jar or jar_hint or "/path/to/driver.jar"
        parts = [
            f"JDBC driver class {name} is not on the Spark classpath.",
            "Fix: start the Spark session with the driver jar in spark.jars (jars cannot be added to a running "
            f'driver), e.g. DPONE_SPARK_CONF=\'{{"spark.jars": "{suggested}"}}\'',
        ]
        if jar:
            exists = "exists" if os.path.exists(jar) else "does NOT exist"
            parts.append(
                f"(source.options.jdbc_jar {jar} {exists} but was not in spark.jars when the session started)"
            )
        elif package:
            parts.append(f"(Debian: apt-get install {package}; or set source.options.jdbc_jar)")
        else:
            parts.append("(or set source.options.jdbc_jar to the jar)")
        if self.options.jdbc_driver:
            parts.append("; check source.options.jdbc_driver for typos")
        return " ".join(parts) + "."

    def _reader(self, spark: SparkSession):
        reader = (
            spark.read.format("jdbc").option("url", self.jdbc_url()).option("driver", self.driver_class())
        )
        for key, value in self.properties().items():
            reader = reader.option(key, value)
        return reader

    def _load(self, reader: Any, what: str) -> DataFrame:
        try:
            return reader.load()
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self._error(exc, what) from None

    def run_query(self, spark: SparkSession, sql: str, what: str) -> list[Any]:
        """Rows of a small query through Spark JDBC (`query` option)."""
        df = self._load(self._reader(spark).option("query", sql), what)
        try:
            return df.collect()
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self._error(exc, what) from None

    def catalog(self, spark: SparkSession) -> tuple[T.ColumnInfo, ...]:
        """The table's columns (INFORMATION_SCHEMA); ConfigError when the table does not exist."""
        if self._catalog is None:
            rows = self.run_query(
                spark, T.columns_query(self.dialect, self.table), "read the table's columns"
            )
            if not rows:
                where = self.connection.database or "the connection's database"
                raise ConfigError(
                    f"table {T.qualified_name(self.dialect, self.table)} does not exist in {where} (or the user "
                    f"'{self.connection.user}' cannot see it). Fix: correct source.table.schema / source.table.name "
                    "(quoted identifiers are case-sensitive) or grant access."
                )
            self._catalog = tuple(
                T.ColumnInfo(
                    name=str(r[0]),
                    data_type=str(r[1]).lower(),
                    precision=int(r[2]) if r[2] is not None else None,
                    scale=int(r[3]) if r[3] is not None else None,
                    column_type=str(r[4]).lower() if r[4] is not None else None,
                )
                for r in rows
            )
        return self._catalog

    def _error(self, exc: BaseException, what: str) -> Exception:
        messages = [redact_text(m) for m in _java_messages(exc)]
        lowered = "\n".join(messages).lower()
        detail = _detail(messages)
        target = f"{redact_text(self.jdbc_url())} (connection '{self.source.connection_id}')"
        if "classnotfoundexception" in lowered or "no suitable driver" in lowered:
            return ConfigError(self._driver_fix(self.driver_class()))
        if any(s in lowered for s in _AUTH) or re.search(r'role "[^"]*" does not exist', lowered):
            return ConfigError(
                f"{target} refused the login to {what}: {detail}. Fix: check the user and password of the "
                "connection and its grants."
            )
        if any(s in lowered for s in _UNREACHABLE) or re.search(r"connection to \S+ refused", lowered):
            return ConfigError(
                f"cannot connect to {target} to {what}: {detail}. Fix: check the host, port and database of the "
                "connection and that the server runs and is reachable from the Spark driver and executors."
            )
        if any(s in lowered for s in _UNKNOWN_OBJECT):
            return ConfigError(
                f"{target}: {what} failed because an object does not exist: {detail}. Fix: correct the "
                "connection's database, source.table, or source.options.columns / incremental_column / "
                "partition_column / predicate."
            )
        return RunFailed(f"{target}: failed to {what}: {detail}")

    # ----------------------------------------------------------------------- helpers

    def _payload_columns(self, catalog: Sequence[T.ColumnInfo]) -> list[T.ColumnInfo]:
        for key in self.strategy.unique_key_columns:
            self._column(catalog, key, "sink.strategy.unique_key")
        if self.options.partition_column:
            self._column(catalog, self.options.partition_column, "source.options.partition_column")
        if not self.options.columns:
            return list(catalog)
        chosen = [self._column(catalog, name, "source.options.columns") for name in self.options.columns]
        if len({c.name for c in chosen}) != len(chosen):
            raise ConfigError("source.options.columns lists a column twice. Fix: list each column once.")
        return chosen

    def _extra_columns(
        self, catalog: Sequence[T.ColumnInfo], payload: list[T.ColumnInfo], column: str | None
    ) -> list[T.ColumnInfo]:
        names = {c.name for c in payload}
        extras = []
        for name in (column, self.options.partition_column):
            if name and name not in names:
                extras.append(self._column(catalog, name, "source.options"))
                names.add(name)
        return extras

    def _column(self, catalog: Sequence[T.ColumnInfo], name: str, where: str) -> T.ColumnInfo:
        for col in catalog:
            if col.name == name:
                return col
        folded = [c for c in catalog if c.name.lower() == name.lower()]
        hint = f" (did you mean '{folded[0].name}'? names are case-sensitive)" if folded else ""
        raise ConfigError(
            f"{where}: column '{name}' does not exist in {T.qualified_name(self.dialect, self.table)}{hint}. "
            f"Columns: {', '.join(c.name for c in catalog)}. Fix: use one of these columns."
        )

    def _expressions(self, columns: Sequence[T.ColumnInfo]) -> dict[str, str]:
        out = {}
        for col in columns:
            expression = T.read_expression(self.dialect, col)
            if expression:
                out[col.name] = expression
        return out

    def _select(
        self,
        columns: Sequence[T.ColumnInfo],
        predicate: str | None,
        column: str | None = None,
        lower: Any = None,
        upper: Any = None,
        kind: str | None = None,
    ) -> str:
        return T.select_query(
            self.dialect,
            self.table,
            [c.name for c in columns],
            predicate,
            column,
            lower,
            True,
            upper,
            kind=kind,
            expressions=self._expressions(columns),
        )


# --------------------------------------------------------------------------- module helpers

_UNREACHABLE = (
    "connection refused",
    "unknownhostexception",
    "communications link failure",
    "could not connect",
    "connect timed out",
    "socket fail to connect",
    "network error ioexception",
    "the tcp/ip connection to the host",
    "no route to host",
    "could not open connection",
)
_AUTH = ("password authentication failed", "access denied", "login failed", "authentication failed")
_UNKNOWN_OBJECT = (
    "does not exist",
    "doesn't exist",
    "invalid object name",
    "invalid column name",
    "unknown column",
    "unknown table",
    "unknown database",
)


def _java_messages(exc: BaseException) -> list[str]:
    """The exception's text and every Java cause's (Spark 4 wraps driver errors in FAILED_JDBC.*)."""
    messages = [f"{type(exc).__name__}: {exc}"]
    cause = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    for _ in range(10):
        if cause is None:
            break
        try:
            messages.append(str(cause.toString()))
            cause = cause.getCause()
        except Exception:  # noqa: BLE001 - a broken gateway: keep what we have
            break
    return messages


def _detail(messages: list[str]) -> str:
    """The most specific message: the first cause that does not come from Spark itself."""
    for message in messages[1:]:
        if not message.startswith(("org.apache.spark", "java.util.concurrent")):
            return _first_line(message)
    return _first_line(messages[0])


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("at "):
            return line[:500]
    return text[:500]


def _table_of(source: SqlSource) -> T.Table:
    """The manifest table; a schema left at its default means the dialect's default schema.

    TableRef defaults schema to dbo (MSSQL); for postgres that means the current schema (public) and
    for mysql the connection's database.
    """
    schema: str | None = source.table.schema_
    if "schema_" not in source.table.model_fields_set and source.type != "mssql":
        schema = None
    return T.Table(schema, source.table.name)


def _watermark_value(kind: str, raw: Any) -> Any:
    """The MAX read back, as the JSON value stored in the watermark."""
    if raw is None:
        return None
    if kind == "integer":
        return int(raw)
    if kind in ("decimal", "float"):
        return format(Decimal(str(raw)), "f") if not isinstance(raw, float) else repr(raw)
    if kind in ("timestamp", "timestamp_tz"):
        text = str(raw).strip()
        head, dot, fraction = text.partition(".")
        fraction = fraction.rstrip("0")
        return head.replace(" ", "T") + (f".{fraction}" if fraction else "")
    if kind == "rowversion":
        return "0x" + str(raw)[2:].upper()
    return str(raw)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _cast(column: Column, current: str, target: str) -> Column:
    if target == "binary" and current == "string":
        return F.unhex(F.regexp_replace(column, "^0[xX]", ""))
    if target == "boolean" and current not in ("boolean", "string"):
        return column.cast("int").cast("boolean")
    return column.cast(target)


def _arrow_converter(type_name: str) -> Callable[[Any], Any]:
    if type_name == "string":
        return lambda v: v if v is None or isinstance(v, str) else str(v)
    if type_name == "binary":
        return lambda v: bytes(v) if isinstance(v, memoryview | bytearray) else v
    if type_name.startswith("decimal"):
        return lambda v: v if v is None or isinstance(v, Decimal) else Decimal(str(v))
    return lambda v: v


def read_bcp_file(
    spark: SparkSession,
    path: str,
    specs: Sequence[T.BcpColumn],
    field_terminator: str = T.BCP_FIELD_TERMINATOR,
    row_terminator: str = T.BCP_ROW_TERMINATOR,
) -> DataFrame:
    """A bcp -c queryout file written with `sql_text.bcp_select`'s encoding, decoded to its types."""
    schema = StructType([StructField(s.name, StringType(), True) for s in specs])
    raw = (
        spark.read.schema(schema)
        .option("sep", field_terminator)
        .option("lineSep", row_terminator)
        .option("quote", '"')
        .option("escape", '"')
        .option("encoding", "UTF-8")
        .option("mode", "FAILFAST")
        .csv(path)
    )
    esc = T.BCP_ESCAPE
    out = []
    for spec in specs:
        col = F.col(_q(spec.name))
        if spec.encoding == "text":
            body = F.expr(f"substring({_q(spec.name)}, 2)")
            pieces = F.transform(
                F.split(body, re.escape(esc + esc), -1),
                lambda piece: F.replace(piece, F.lit(esc + "r"), F.lit(row_terminator)),
            )
            value = F.when(col.isNull(), F.lit(None).cast("string")).otherwise(F.array_join(pieces, esc))
        elif spec.encoding == "hex":
            value = F.unhex(F.expr(f"substring({_q(spec.name)}, 2)"))
        else:
            value = _cast(col, "string", spec.target) if spec.target != "string" else col
        out.append(value.alias(spec.name))
    return raw.select(*out)


__all__ = ["SqlBatchSource", "SqlBoundary", "read_bcp_file"]
