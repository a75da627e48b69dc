"""SQL sources (type: mssql | postgres | mysql): plan a bounded extract, then read it on Spark.

`SqlBatchSource.plan()` fixes the boundary before anything is read and `extract()` reads exactly
that boundary (Spark JDBC by default; `bcp` or `pyodbc` for MSSQL exports). The SQL text itself is
built in `text` (pure, asserted in tests); incremental plans are in `watermark`, CDC plans in `cdc`.

Methods
-------
- full (strategy full_refresh / replace / snapshot_reconciliation, or no incremental_column): the
  whole table (within `predicate`); no watermark is stored.
- incremental (incremental_append / incremental_merge with `incremental_column`): the window
  described by THE TIE RULE (see `watermark`); the watermark stored after sink success is
  `{"column", "value", "type"}` with the upper bound of this run.
- cdc (mssql only): `cdc.fn_cdc_get_all_changes_<capture_instance>` between the LSN after the
  stored one (`sys.fn_cdc_increment_lsn`) and `sys.fn_cdc_get_max_lsn()` fixed at plan time;
  operation 1 becomes `__dpone__op = delete`. LSNs are stored as `0x` + 20 hex digits.

Type mapping (payload columns; a cast after the read where a driver delivers something else)
-------------------------------------------------------------------------------------------
decimal/numeric(p,s) -> decimal(p,s) (p <= 38); money -> decimal(19,4), smallmoney ->
decimal(10,4); datetime/datetime2/smalldatetime, timestamp, DATETIME/TIMESTAMP -> timestamp (UTC
session; jTDS delivers datetime2 as text, cast back); datetimeoffset -> timestamp (converted to UTC
in SQL), timestamptz -> timestamp; date -> date; binary/varbinary/image/rowversion, bytea, BLOB/
VARBINARY -> binary; uniqueidentifier, uuid -> string; bit/boolean -> boolean (mysql tinyint(1)
too); tinyint (mssql, 0..255) -> smallint; time, interval, json, xml, sql_variant, hierarchyid,
geography/geometry (WKT) -> string; float -> double, real -> float.

Export modes
------------
- jdbc (default): `spark.read.format("jdbc")` with `query` (or a `dbtable` sub-select for
  partitioned reads: partitionColumn/lowerBound/upperBound/numPartitions for numeric/date columns,
  hash predicates per partition for others), `fetchsize` = batch_size.
- bcp (mssql): `bcp "<select>" queryout` to a local file, read with Spark's CSV reader using the
  escaping scheme documented in `text.bcp` (lossless, NULL vs empty string kept). The file lives on
  the driver's filesystem (DPONE_BCP_DIR): with a cluster master it must be a shared path. It is
  removed once Spark holds the rows, whatever the outcome (`bcp.read_bcp`).
- pyodbc: a cursor on the Spark DRIVER fetches batch_size rows at a time into Arrow and builds the
  DataFrame from them: meant for small tables.

The extract DataFrame is lazy; the engine persists it, so the source is read once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from math import ceil, floor
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster import columns as C
from dpone_dagster.connections import JdbcConnection
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sources.kafka import ExtractResult
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.bcp import read_bcp
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.casts import backquote, cast_column
from dpone_dagster.sources.sql.cdc import change_columns, plan_cdc
from dpone_dagster.sources.sql.jdbc import JdbcTable
from dpone_dagster.sources.sql.odbc import odbc_connection_string, read_pyodbc
from dpone_dagster.sources.sql.watermark import plan_incremental

Log = Callable[[str], None]

_SOURCE_OP_DELETE_VALUES = ("delete", "d")
_INCREMENTAL_MODES = ("incremental_append", "incremental_merge")
_RANGE_PARTITION_KINDS = ("integer", "decimal", "float", "date", "timestamp", "timestamp_tz")


class SqlBatchSource(JdbcTable):
    """A bounded batch over one table of an SQL database."""

    def __init__(self, manifest: Manifest, connection: JdbcConnection):
        super().__init__(manifest, connection)
        # A driver-side export (bcp, pyodbc) and its boundary: taken once per run, so that a batch
        # the direct path hands to the Spark SQL path is not exported twice.
        self._export: tuple[SqlBoundary, ExtractResult] | None = None

    def plan(self, spark: SparkSession, stored_watermark: dict[str, Any] | None = None) -> SqlBoundary:
        """Fix the boundary: catalog check, then MAX/COUNT (or the LSN range) before anything is read."""
        if self.strategy.mode == "cdc" and self.dialect != "mssql":
            raise ConfigError("sink.strategy.mode: cdc is only available for source.type: mssql")
        self.check_driver(spark)
        self.check_utc_session(spark)
        catalog = self.catalog(spark)
        payload = self.payload_columns(catalog)
        mode = self.strategy.mode
        if mode == "cdc":
            return plan_cdc(self, spark, payload, stored_watermark)
        if mode == "kafka_offsets":
            raise ConfigError(
                "sink.strategy.mode: kafka_offsets needs a Kafka source; use incremental_append"
            )
        column = self.options.incremental_column
        if mode in _INCREMENTAL_MODES and column:
            return plan_incremental(self, spark, catalog, payload, stored_watermark)
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
        extras = self.extra_columns(catalog, payload, None)
        conditions = T.where_conditions(self.dialect, self.options.predicate)
        query = self.select_sql(payload + extras, self.options.predicate)
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

    def extract(self, spark: SparkSession, boundary: SqlBoundary, log: Log | None = None) -> ExtractResult:
        log = log or (lambda message: None)
        mode = self.options.export_mode
        if self._export is not None and self._export[0] is boundary:
            return self._export[1]
        notes, tasks = [], None  # the plan stage reports the boundary's own notes
        if mode == "bcp":
            raw = read_bcp(self, spark, boundary, log)
            notes.append(
                "export_mode bcp: queryout file read with Spark's CSV reader (escaping: see sql.text.bcp)"
            )
        elif mode == "pyodbc":
            raw = read_pyodbc(self, spark, boundary, log)
            notes.append("export_mode pyodbc: rows fetched on the Spark driver (for small tables)")
        else:
            raw, how, tasks = self._read_jdbc(spark, boundary)
            notes.append(how)
        df, schema = self._finish(raw, boundary)
        result = ExtractResult(lambda: df, schema=schema, envelope="flat", notes=notes, tasks=tasks)
        if mode in ("bcp", "pyodbc"):
            self._export = (boundary, result)
        return result

    def _read_jdbc(self, spark: SparkSession, boundary: SqlBoundary) -> tuple[DataFrame, str, int | None]:
        """The read, how it is split, and its task count where that is fixed (a range read may
        have fewer partitions than asked, when the range is narrower)."""
        column, n = self.options.partition_column, self.options.num_partitions
        if column and n > 1 and not boundary.empty and boundary.method != "cdc":
            info = self.find_column(
                boundary.columns + boundary.extra_columns, column, "source.options.partition_column"
            )
            subquery = f"({boundary.query}) dpone_src"
            kind = T.watermark_kind(self.dialect, info.data_type)
            if kind in _RANGE_PARTITION_KINDS:
                bounds = self._partition_bounds(spark, boundary, column, kind)
                if bounds is not None:
                    lower, upper = bounds
                    reader = (
                        self.reader(spark)
                        .option("dbtable", subquery)
                        .option("partitionColumn", column)
                        .option("lowerBound", lower)
                        .option("upperBound", upper)
                        .option("numPartitions", str(n))
                    )
                    df = self.load(reader, "read the table")
                    return df, f"jdbc read in {n} partitions by range of {column} [{lower}, {upper}]", None
            else:
                predicates = T.hash_predicates(self.dialect, column, n)
                props = {**self.properties(), "driver": self.driver_class()}
                try:
                    df = spark.read.jdbc(self.jdbc_url(), subquery, predicates=predicates, properties=props)
                except Exception as exc:  # noqa: BLE001 - classified below
                    raise self.jdbc_error(exc, "read the table") from None
                return df, f"jdbc read in {n} partitions by hash of {column}", len(predicates)
        reader = self.reader(spark).option("query", boundary.query)
        return self.load(reader, "read the table"), "jdbc read in one partition", 1

    def _partition_bounds(
        self, spark: SparkSession, boundary: SqlBoundary, column: str, kind: str
    ) -> tuple[str, str] | None:
        lower, upper = self.options.lower_bound, self.options.upper_bound
        if lower is None or upper is None:
            predicate = " AND ".join(boundary.conditions) or None
            sql = T.bounds_query(self.dialect, self.table, column, predicate)
            df = self.load(self.reader(spark).option("query", sql), "read the partition bounds")
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

    def odbc_connection_string(self) -> str:
        """An ODBC connection string for pyodbc (holds the password: never log it)."""
        return odbc_connection_string(self)

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
                cast[col.name] = cast_column(F.col(backquote(col.name)), current, target).alias(col.name)
            else:
                cast[col.name] = F.col(backquote(col.name))
        df = raw
        names = list(raw.columns)
        if boundary.method == "cdc":
            df, op, order = change_columns(raw)
        else:
            if C.OP in names:
                text = F.lower(F.trim(F.col(backquote(C.OP)).cast("string")))
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
