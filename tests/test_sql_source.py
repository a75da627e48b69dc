"""SqlBatchSource against the machine's real PostgreSQL and MariaDB (parametrized over both).

Each dialect gets a fresh database for this module (dropped at the end): PostgreSQL tables live in
an explicit schema `src`; MariaDB tables are addressed without a schema (the connection's
database), which exercises both table-resolution paths. Statements are executed through the JDBC
drivers already on the shared Spark session's classpath (spark.jars in conftest).

MSSQL-only paths (CDC, bcp, jTDS URLs) have no server here: their SQL is asserted as text in
test_sql_text.py; the bcp file decoding is exercised here for real through Spark's CSV reader on a
file written with the documented encoding.
"""

from __future__ import annotations

import json
import sys
import types
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.connections import JdbcConnection
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sources.sql import SqlBatchSource, SqlBoundary, read_bcp_file
from dpone_dagster.sources.sql import text as T

PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root"}


class Database:
    """A fresh database of one dialect, driven through JDBC inside the Spark JVM."""

    def __init__(self, spark, dialect: str):
        self.spark = spark
        self.dialect = dialect
        self.name = f"dpone_sql_{uuid.uuid4().hex[:8]}"
        if dialect == "postgres":
            self.server = PG
            self.schema: str | None = "src"
            self.admin_url = f"jdbc:postgresql://{PG['host']}:{PG['port']}/postgres"
            self.url = f"jdbc:postgresql://{PG['host']}:{PG['port']}/{self.name}"
        else:
            self.server = MARIADB
            self.schema = None
            self.admin_url = f"jdbc:mysql://{MARIADB['host']}:{MARIADB['port']}/test?permitMysqlScheme"
            self.url = f"jdbc:mysql://{MARIADB['host']}:{MARIADB['port']}/{self.name}?permitMysqlScheme"

    def _connect(self, url: str):
        jvm = self.spark._jvm
        driver = jvm.org.postgresql.Driver() if self.dialect == "postgres" else jvm.org.mariadb.jdbc.Driver()
        props = jvm.java.util.Properties()
        props.setProperty("user", self.server["user"])
        return driver.connect(url, props)

    def _run(self, url: str, statements: tuple[str, ...]) -> None:
        connection = self._connect(url)
        try:
            statement = connection.createStatement()
            for sql in statements:
                statement.execute(sql)
        finally:
            connection.close()

    def create(self) -> None:
        self._run(self.admin_url, (f"CREATE DATABASE {self.q(self.name)}",))
        if self.schema:
            self.execute(f"CREATE SCHEMA {self.q(self.schema)}")

    def drop(self) -> None:
        suffix = " WITH (FORCE)" if self.dialect == "postgres" else ""
        self._run(self.admin_url, (f"DROP DATABASE IF EXISTS {self.q(self.name)}{suffix}",))

    def execute(self, *statements: str) -> None:
        self._run(self.url, statements)

    def q(self, name: str) -> str:
        return T.quote_ident(self.dialect, name)

    def table(self, name: str) -> str:
        return f"{self.q(self.schema)}.{self.q(name)}" if self.schema else self.q(name)

    def connection(self, **overrides: Any) -> JdbcConnection:
        fields = {**self.server, "database": self.name, **overrides}
        return JdbcConnection(**fields)

    def manifest(
        self, table: str, *, mode: str = "incremental_merge", unique_key: Any = "id", **options
    ) -> Manifest:
        ref: dict[str, Any] = {"name": table}
        if self.schema:
            ref["schema"] = self.schema
        strategy: dict[str, Any] = {"mode": mode}
        if unique_key is not None:
            strategy["unique_key"] = unique_key
        return Manifest.model_validate(
            {
                "name": "sql_source_test",
                "source": {
                    "type": self.dialect,
                    "connection_id": "sql_src",
                    "table": ref,
                    "options": options,
                },
                "sink": {
                    "type": "kafka",
                    "connection_id": "kafka_cluster",
                    "topic": "t",
                    "strategy": strategy,
                },
            }
        )

    def source(self, table: str, **kwargs: Any) -> SqlBatchSource:
        connection = kwargs.pop("connection", None) or self.connection()
        return SqlBatchSource(self.manifest(table, **kwargs), connection)

    # Column types per dialect.
    @property
    def ts(self) -> str:
        return "TIMESTAMP(6)" if self.dialect == "postgres" else "DATETIME(6)"

    @property
    def binary(self) -> str:
        return "BYTEA" if self.dialect == "postgres" else "VARBINARY(16)"

    @property
    def boolean(self) -> str:
        return "BOOLEAN" if self.dialect == "postgres" else "BIT(1)"

    def bytes_literal(self, value: bytes) -> str:
        return T.literal(self.dialect, value)

    def bool_literal(self, value: bool) -> str:
        if self.dialect == "postgres":
            return "TRUE" if value else "FALSE"
        return "b'1'" if value else "b'0'"


@pytest.fixture(scope="module", params=["postgres", "mysql"])
def db(request, spark):
    database = Database(spark, request.param)
    database.create()
    try:
        yield database
    finally:
        database.drop()


def rows_by_id(df) -> dict[int, dict[str, Any]]:
    return {row["id"]: row.asDict() for row in df.collect()}


# --------------------------------------------------------------------------- full extract, types


def test_full_extract_with_nulls_and_types(db, spark):
    db.execute(
        f"CREATE TABLE {db.table('types_t')} (id INT PRIMARY KEY, amount DECIMAL(18,2), created_at {db.ts}, "
        f"day DATE, payload {db.binary}, flag {db.boolean}, note TEXT)",
        f"INSERT INTO {db.table('types_t')} VALUES "
        f"(1, 12345678.91, '2024-01-02 03:04:05.123456', '2024-01-02', {db.bytes_literal(bytes([0, 255, 16]))}, "
        f"{db.bool_literal(True)}, 'héllo \"quoted\" ''single'''), "
        "(2, NULL, NULL, NULL, NULL, NULL, NULL), "
        f"(3, -0.01, '1999-12-31 23:59:59', '1999-12-31', {db.bytes_literal(b'')}, {db.bool_literal(False)}, '')",
    )
    source = db.source("types_t", mode="full_refresh")
    boundary = source.plan(spark, None)
    assert boundary.method == "full" and boundary.new_watermark is None and boundary.total == 3
    assert boundary.lower is None and boundary.upper is None and not boundary.empty
    json.dumps(boundary.as_dict())  # JSON-safe

    result = source.extract(spark, boundary)
    assert result.envelope == "flat"
    types = dict((f.name, f.dataType.simpleString()) for f in result.schema.fields)
    assert types == {
        "id": "int",
        "amount": "decimal(18,2)",
        "created_at": "timestamp",
        "day": "date",
        "payload": "binary",
        "flag": "boolean",
        "note": "string",
    }
    assert result.df.columns == [*types, C.OP, C.ORDER, C.CORRUPT]
    rows = rows_by_id(result.df)
    assert rows[1]["amount"] == Decimal("12345678.91")
    assert rows[1]["created_at"] == datetime(2024, 1, 2, 3, 4, 5, 123456)  # UTC session, UTC JVM
    assert rows[1]["day"] == date(2024, 1, 2)
    assert bytes(rows[1]["payload"]) == bytes([0, 255, 16])
    assert rows[1]["flag"] is True
    assert rows[1]["note"] == "héllo \"quoted\" 'single'"
    assert all(rows[2][c] is None for c in types if c != "id")  # NULLs stay NULL
    assert rows[3]["amount"] == Decimal("-0.01")
    assert bytes(rows[3]["payload"]) == b"" and rows[3]["flag"] is False
    assert rows[3]["note"] == ""  # empty string is not NULL
    assert {r[C.OP] for r in rows.values()} == {C.UPSERT}
    assert {r[C.CORRUPT] for r in rows.values()} == {None}
    # full read: order by the unique key
    assert rows[3][C.ORDER].asDict() == {"k0": 3}


def test_boundary_query_is_the_exact_select(db, spark):
    db.execute(f"CREATE TABLE {db.table('q_t')} (id INT PRIMARY KEY, updated_at {db.ts})")
    db.execute(f"INSERT INTO {db.table('q_t')} VALUES (1, '2024-05-01 10:00:00.5')")
    source = db.source("q_t", incremental_column="updated_at")
    boundary = source.plan(
        spark, {"column": "updated_at", "value": "2024-04-01T00:00:00", "type": "timestamp"}
    )
    assert boundary.query == T.select_query(
        db.dialect,
        T.Table(db.schema, "q_t"),
        ["id", "updated_at"],
        None,
        "updated_at",
        "2024-04-01T00:00:00",
        True,
        "2024-05-01T10:00:00.5",
        kind="timestamp",
    )
    assert boundary.lower == "2024-04-01T00:00:00" and boundary.lower_inclusive is True
    assert boundary.upper == "2024-05-01T10:00:00.5"


# --------------------------------------------------------------------------- incremental + ties


def test_incremental_runs_ties_and_updates(db, spark):
    t = db.table("events")
    db.execute(
        f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20), updated_at {db.ts})",
        f"INSERT INTO {t} VALUES (1, 'a', '2024-01-01 00:00:01.000001'), (2, 'b', '2024-01-01 00:00:02.000002'), "
        "(3, 'c', '2024-01-01 00:00:03.000003'), (4, 'd', '2024-01-01 00:00:04.000004'), "
        "(5, 'e', '2024-01-01 00:00:05.123456'), (6, 'no-ts', NULL)",
    )
    source = db.source("events", incremental_column="updated_at")

    # Run 1: no watermark -> everything up to the maximum fixed at plan time (NULL never read).
    first = source.plan(spark, None)
    assert first.method == "incremental" and first.column == "updated_at" and first.kind == "timestamp"
    assert first.lower is None and first.upper == "2024-01-01T00:00:05.123456"
    assert first.total == 5
    assert first.new_watermark == {
        "column": "updated_at",
        "value": "2024-01-01T00:00:05.123456",
        "type": "timestamp",
    }
    assert sorted(rows_by_id(source.extract(spark, first).df)) == [1, 2, 3, 4, 5]
    stored = json.loads(json.dumps(first.new_watermark))  # what the state store keeps

    # Between runs: a late row with exactly the stored value (the tie), a new row, an update.
    db.execute(
        f"INSERT INTO {t} VALUES (7, 'tie', '2024-01-01 00:00:05.123456'), (8, 'new', '2024-01-01 00:00:08')",
        f"UPDATE {t} SET name = 'b2', updated_at = '2024-01-01 00:00:20' WHERE id = 2",
    )

    # Run 2: lower bound inclusive -> the boundary row 5 is re-read, the tie row 7 IS read.
    second = source.plan(spark, stored)
    assert second.lower == stored["value"] and second.lower_inclusive is True
    assert second.upper == "2024-01-01T00:00:20"
    assert second.total == 4
    rows = rows_by_id(source.extract(spark, second).df)
    assert sorted(rows) == [2, 5, 7, 8]
    assert rows[2]["name"] == "b2"
    assert rows[7]["name"] == "tie"
    # keep_last ordering: (incremental column, unique key)
    assert rows[2][C.ORDER].asDict() == {"w": datetime(2024, 1, 1, 0, 0, 20), "k0": 2}
    assert any("inclusive" in note for note in second.notes)

    # Run 3 without changes: only the rows sitting on the boundary (at-least-once on the boundary).
    third = source.plan(spark, second.new_watermark)
    assert sorted(rows_by_id(source.extract(spark, third).df)) == [2]
    assert third.new_watermark == second.new_watermark


def test_rows_inserted_after_plan_belong_to_the_next_run(db, spark):
    t = db.table("late")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, updated_at {db.ts})")
    db.execute(f"INSERT INTO {t} VALUES (1, '2024-01-01 00:00:01'), (2, '2024-01-01 00:00:02')")
    source = db.source("late", incremental_column="updated_at")
    boundary = source.plan(spark, None)
    db.execute(f"INSERT INTO {t} VALUES (3, '2024-01-01 00:00:03')")  # committed after the plan
    assert sorted(rows_by_id(source.extract(spark, boundary).df)) == [1, 2]
    after = source.plan(spark, boundary.new_watermark)
    assert sorted(rows_by_id(source.extract(spark, after).df)) == [2, 3]


def test_integer_watermark_with_lookback(db, spark):
    t = db.table("ids")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(5))")
    db.execute(f"INSERT INTO {t} VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 11)))
    source = db.source("ids", mode="incremental_append", unique_key=None, incremental_column="id", lookback=3)
    boundary = source.plan(spark, {"column": "id", "value": 7, "type": "integer"})
    assert boundary.kind == "integer" and boundary.lower == 4 and boundary.upper == 10
    assert f"{db.q('id')} >= 4" in boundary.query and f"{db.q('id')} <= 10" in boundary.query
    assert sorted(rows_by_id(source.extract(spark, boundary).df)) == [4, 5, 6, 7, 8, 9, 10]
    assert boundary.new_watermark == {"column": "id", "value": 10, "type": "integer"}


def test_timestamp_lookback_duration(db, spark):
    t = db.table("lb_ts")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, updated_at {db.ts})")
    db.execute(
        f"INSERT INTO {t} VALUES (1, '2024-01-01 00:00:00'), (2, '2024-01-01 00:04:59'), "
        "(3, '2024-01-01 00:05:00'), (4, '2024-01-01 00:10:00')"
    )
    source = db.source("lb_ts", incremental_column="updated_at", lookback="PT5M")
    boundary = source.plan(
        spark, {"column": "updated_at", "value": "2024-01-01T00:10:00", "type": "timestamp"}
    )
    assert boundary.lower == "2024-01-01T00:05:00"
    assert sorted(rows_by_id(source.extract(spark, boundary).df)) == [3, 4]


def test_empty_window_keeps_the_watermark(db, spark):
    t = db.table("quiet")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, updated_at {db.ts})")
    source = db.source("quiet", incremental_column="updated_at")
    first = source.plan(spark, None)
    assert first.empty and first.upper is None and first.new_watermark is None and first.total == 0
    result = source.extract(spark, first)
    assert result.df.count() == 0 and result.schema.fieldNames() == ["id", "updated_at"]
    stored = {"column": "updated_at", "value": "2030-01-01T00:00:00", "type": "timestamp"}
    db.execute(f"INSERT INTO {t} VALUES (1, '2024-01-01 00:00:00')")  # below the stored watermark
    later = source.plan(spark, stored)
    assert later.empty and later.new_watermark == stored
    assert source.extract(spark, later).df.count() == 0


# --------------------------------------------------------------------------- columns, predicate, partitions


def test_columns_subset_and_predicate(db, spark):
    t = db.table("subset")
    db.execute(
        f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(10), secret VARCHAR(10), updated_at {db.ts})"
    )
    db.execute(
        f"INSERT INTO {t} VALUES "
        + ", ".join(f"({i}, 'n{i}', 's{i}', '2024-01-01 00:00:0{i}')" for i in range(1, 6))
    )
    source = db.source("subset", incremental_column="updated_at", columns=["id", "name"], predicate="id > 2")
    boundary = source.plan(spark, None)
    assert boundary.total == 3 and boundary.upper == "2024-01-01T00:00:05"
    result = source.extract(spark, boundary)
    assert result.schema.fieldNames() == ["id", "name"]  # updated_at read for ordering only
    rows = rows_by_id(result.df)
    assert sorted(rows) == [3, 4, 5]
    assert rows[4]["name"] == "n4" and rows[4][C.ORDER]["w"] == datetime(2024, 1, 1, 0, 0, 4)
    assert "(id > 2)" in boundary.query


def test_partitioned_range_read_reads_every_row_once(db, spark):
    t = db.table("parts")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, code VARCHAR(10))")
    values = [f"({i}, 'c{i:03d}')" for i in range(1, 31)] + ["(31, NULL)"]
    db.execute(f"INSERT INTO {t} VALUES " + ", ".join(values))

    source = db.source("parts", mode="full_refresh", partition_column="id", num_partitions=3)
    result = source.extract(spark, source.plan(spark, None))
    assert result.df.rdd.getNumPartitions() == 3
    ids = [r["id"] for r in result.df.collect()]
    assert sorted(ids) == list(range(1, 32))  # exactly once each
    sizes = result.df.rdd.glom().map(len).collect()
    assert len(sizes) == 3 and sum(sizes) == 31 and min(sizes) > 0

    # explicit bounds narrower than the data: Spark's first/last partitions stay open-ended
    source = db.source(
        "parts", mode="full_refresh", partition_column="id", num_partitions=3, lower_bound=10, upper_bound=20
    )
    ids = [r["id"] for r in source.extract(spark, source.plan(spark, None)).df.collect()]
    assert sorted(ids) == list(range(1, 32))


def test_partitioned_hash_read_on_a_string_key(db, spark):
    source = db.source("parts", mode="full_refresh", partition_column="code", num_partitions=3)
    result = source.extract(spark, source.plan(spark, None))
    assert result.df.rdd.getNumPartitions() == 3
    ids = [r["id"] for r in result.df.collect()]
    assert sorted(ids) == list(range(1, 32))  # the NULL code (id 31) too, exactly once
    sizes = result.df.rdd.glom().map(len).collect()
    assert sum(sizes) == 31 and sum(1 for s in sizes if s) >= 2


def test_partitioned_incremental_read_keeps_the_window(db, spark):
    t = db.table("parts_inc")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, updated_at {db.ts})")
    db.execute(
        f"INSERT INTO {t} VALUES " + ", ".join(f"({i}, '2024-01-01 00:00:{i:02d}')" for i in range(1, 21))
    )
    source = db.source("parts_inc", incremental_column="updated_at", partition_column="id", num_partitions=4)
    boundary = source.plan(
        spark, {"column": "updated_at", "value": "2024-01-01T00:00:11", "type": "timestamp"}
    )
    ids = [r["id"] for r in source.extract(spark, boundary).df.collect()]
    assert sorted(ids) == list(range(11, 21))


def test_source_op_column_drives_deletes(db, spark):
    t = db.table("soft")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, {db.q('__dpone__op')} VARCHAR(10), v INT)")
    db.execute(f"INSERT INTO {t} VALUES (1, 'upsert', 10), (2, 'DELETE', 20), (3, NULL, 30), (4, 'd', 40)")
    source = db.source("soft", mode="full_refresh")
    result = source.extract(spark, source.plan(spark, None))
    assert result.schema.fieldNames() == ["id", "v"]  # the op column is metadata, not payload
    ops = {r["id"]: r[C.OP] for r in result.df.collect()}
    assert ops == {1: C.UPSERT, 2: C.DELETE, 3: C.UPSERT, 4: C.DELETE}


# --------------------------------------------------------------------------- errors


def test_unknown_table_is_a_config_error(db, spark):
    with pytest.raises(ConfigError, match=r"does not exist.*Fix: correct source\.table"):
        db.source("no_such_table", mode="full_refresh").plan(spark, None)


def test_unknown_columns_are_config_errors(db, spark):
    db.execute(
        f"CREATE TABLE {db.table('cols')} (id INT PRIMARY KEY, {db.q('Name')} VARCHAR(5), updated_at {db.ts})"
    )
    with pytest.raises(
        ConfigError, match=r"incremental_column: column 'changed_at' does not exist.*Columns: id, Name"
    ):
        db.source("cols", incremental_column="changed_at").plan(spark, None)
    with pytest.raises(ConfigError, match=r"source\.options\.columns: column 'name' .*did you mean 'Name'"):
        db.source("cols", mode="full_refresh", columns=["id", "name"]).plan(spark, None)
    with pytest.raises(ConfigError, match=r"sink\.strategy\.unique_key: column 'order_id'"):
        db.source("cols", mode="full_refresh", unique_key="order_id").plan(spark, None)


def test_stored_watermark_for_another_column_is_refused(db, spark):
    db.execute(f"CREATE TABLE {db.table('wm')} (id INT PRIMARY KEY, updated_at {db.ts})")
    source = db.source("wm", incremental_column="updated_at")
    with pytest.raises(ConfigError, match="stored watermark is for column 'id'"):
        source.plan(spark, {"column": "id", "value": 3, "type": "integer"})
    with pytest.raises(ConfigError, match="stored watermark is invalid"):
        source.plan(spark, {"column": "updated_at", "value": "yesterday", "type": "timestamp"})


def test_missing_driver_class_is_a_config_error(db, spark):
    source = db.source("wm", jdbc_driver="com.example.jdbc.MissingDriver", jdbc_jar="/nonexistent/driver.jar")
    with pytest.raises(ConfigError) as info:
        source.plan(spark, None)
    message = str(info.value)
    assert "com.example.jdbc.MissingDriver is not on the Spark classpath" in message
    assert "spark.jars" in message and "DPONE_SPARK_CONF" in message and "does NOT exist" in message


def test_unreachable_database_is_a_config_error(db, spark):
    source = db.source("wm", connection=db.connection(port=1))
    with pytest.raises(ConfigError, match="cannot connect to .*Fix: check the host, port and database"):
        source.plan(spark, None)


def test_refused_login_is_a_config_error(db, spark):
    source = db.source(
        "wm", connection=db.connection(user=f"nobody_{uuid.uuid4().hex[:6]}", password="wrong")
    )
    with pytest.raises(ConfigError, match="refused the login .*Fix: check the user and password") as info:
        source.plan(spark, None)
    assert "wrong" not in str(info.value).replace("wrong_", "")


# --------------------------------------------------------------------------- describe / secrets


def test_describe_and_boundary_hide_the_password(db):
    secret = f"pw-{uuid.uuid4().hex}"
    source = db.source("wm", connection=db.connection(password=secret))
    assert source.properties()["password"] == secret
    assert source.properties()["fetchsize"] == "50000"
    assert secret not in json.dumps(source.describe()) and secret not in repr(source.connection)
    assert source.describe()["password"] == "**********"


def test_urls_and_drivers_per_dialect():
    def source(dialect: str, **options: Any) -> SqlBatchSource:
        manifest = Manifest.model_validate(
            {
                "name": "u",
                "source": {"type": dialect, "connection_id": "c", "table": {"name": "t"}, "options": options},
                "sink": {"type": "kafka", "connection_id": "k", "topic": "t"},
            }
        )
        return SqlBatchSource(
            manifest, JdbcConnection(host="db.local", port=1500, database="sales", user="u")
        )

    assert source("mssql").jdbc_url() == "jdbc:jtds:sqlserver://db.local:1500/sales"
    assert source("mssql").driver_class() == "net.sourceforge.jtds.jdbc.Driver"
    ms = source("mssql", jdbc_driver="com.microsoft.sqlserver.jdbc.SQLServerDriver")
    assert ms.jdbc_url() == "jdbc:sqlserver://db.local:1500;databaseName=sales"
    assert source("postgres").jdbc_url() == "jdbc:postgresql://db.local:1500/sales"
    assert source("postgres").driver_class() == "org.postgresql.Driver"
    assert source("mysql").jdbc_url() == "jdbc:mysql://db.local:1500/sales?permitMysqlScheme"
    assert source("mysql").driver_class() == "org.mariadb.jdbc.Driver"
    assert (
        source("mysql", jdbc_driver="com.mysql.cj.jdbc.Driver").jdbc_url()
        == "jdbc:mysql://db.local:1500/sales"
    )
    assert source("mssql").table == T.Table("dbo", "t")  # TableRef's default schema is MSSQL's
    assert source("postgres").table == T.Table(None, "t")  # current schema
    assert source("mysql").table == T.Table(None, "t")  # the connection's database


def test_mssql_without_the_jtds_jar_is_a_config_error(spark):
    manifest = Manifest.model_validate(
        {
            "name": "m",
            "source": {"type": "mssql", "connection_id": "c", "table": {"name": "orders"}},
            "sink": {"type": "kafka", "connection_id": "k", "topic": "t"},
        }
    )
    source = SqlBatchSource(manifest, JdbcConnection(host="127.0.0.1", port=1433, user="sa"))
    with pytest.raises(ConfigError, match=r"net\.sourceforge\.jtds\.jdbc\.Driver .*libjtds-java"):
        source.plan(spark, None)


# --------------------------------------------------------------------------- bcp / pyodbc


def _bcp_encode(value: Any, encoding: str) -> str:
    """What `bcp -c` writes for one value exported with sql.text.bcp_select's expressions."""
    if value is None:
        return ""
    if encoding == "text":
        escaped = value.replace("\x1b", "\x1b\x1b").replace(T.BCP_ROW_TERMINATOR, "\x1br").replace('"', '""')
        return f'"~{escaped}"'
    if encoding == "hex":
        return "x" + value.hex().upper()
    return value


def test_bcp_file_round_trips_through_spark_csv(spark, tmp_path):
    specs = [
        T.BcpColumn("id", "plain", "int"),
        T.BcpColumn("note", "text", "string"),
        T.BcpColumn("blob", "hex", "binary"),
        T.BcpColumn("at", "plain", "timestamp"),
        T.BcpColumn("flag", "plain", "boolean"),
        T.BcpColumn("amount", "plain", "decimal(19,4)"),
    ]
    tricky = [
        "plain",
        "",  # empty string (bcp would write \0 for it without the prefix)
        None,
        'quote " and "" doubled',
        "field\x1fsep and row\x1esep and esc\x1b and \x1b\x1br",
        "multi\nline\r\n",
        "~ starts with the prefix",
        "ünïcødé ✓",
    ]
    rows = [
        (
            i + 1,
            note,
            bytes([i, 0, 255]) if i % 3 else (b"" if i == 0 else None),
            "2024-01-02T03:04:05.1234567",
            "1" if i % 2 else "0",
            "12.3400",
        )
        for i, note in enumerate(tricky)
    ]
    encodings = [s.encoding for s in specs]
    text = "".join(
        T.BCP_FIELD_TERMINATOR.join(_bcp_encode(v, e) for v, e in zip(row, encodings, strict=True))
        + T.BCP_ROW_TERMINATOR
        for row in [(str(r[0]), *r[1:]) for r in rows]
    )
    path = tmp_path / "export.dat"
    path.write_bytes(text.encode("utf-8"))
    df = read_bcp_file(spark, str(path), specs)
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "int",
        "string",
        "binary",
        "timestamp",
        "boolean",
        "decimal(19,4)",
    ]
    got = {r["id"]: r for r in df.collect()}
    assert len(got) == len(rows)
    for i, note in enumerate(tricky):
        row = got[i + 1]
        assert row["note"] == note, (i, row["note"])
        expected_blob = rows[i][2]
        assert (None if row["blob"] is None else bytes(row["blob"])) == expected_blob
        assert row["at"] == datetime(2024, 1, 2, 3, 4, 5, 123456)
        assert row["flag"] is bool(i % 2)
        assert row["amount"] == Decimal("12.3400")


def _mssql_source(**options: Any) -> SqlBatchSource:
    manifest = Manifest.model_validate(
        {
            "name": "m",
            "source": {
                "type": "mssql",
                "connection_id": "c",
                "table": {"name": "orders"},
                "options": options,
            },
            "sink": {
                "type": "kafka",
                "connection_id": "k",
                "topic": "t",
                "strategy": {"mode": "full_refresh"},
            },
        }
    )
    return SqlBatchSource(manifest, JdbcConnection(host="127.0.0.1", user="sa", password="pw"))


def test_bcp_without_the_bcp_command_is_a_config_error(spark, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without mssql-tools
    source = _mssql_source(export_mode="bcp")
    boundary = SqlBoundary(
        method="full",
        table="[dbo].[orders]",
        column=None,
        lower=None,
        lower_inclusive=True,
        upper=None,
        query="SELECT [id] FROM [dbo].[orders]",
        total=None,
        new_watermark=None,
        dialect="mssql",
        columns=(T.ColumnInfo("id", "int"),),
    )
    with pytest.raises(ConfigError, match=r"needs the `bcp` command.*mssql-tools18"):
        source.extract(spark, boundary)


def test_pyodbc_mode_without_pyodbc_is_a_config_error(db, spark, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyodbc", None)  # import fails
    source = db.source("wm", export_mode="pyodbc")
    boundary = source.plan(spark, None)
    with pytest.raises(
        ConfigError, match=r"export_mode: pyodbc needs the pyodbc package.*pip install pyodbc"
    ):
        source.extract(spark, boundary)


@pytest.mark.parametrize("db", ["postgres"], indirect=True)  # the DB-API stand-in is psycopg2
def test_pyodbc_mode_streams_batches_into_spark(db, spark, monkeypatch):
    """pyodbc itself is not installed here: a DB-API stand-in on psycopg2 / JDBC rows checks the path."""
    import psycopg2

    fetches: list[int] = []

    class Cursor:
        def __init__(self, inner):
            self.inner = inner

        def execute(self, sql):
            self.inner.execute(sql)

        def fetchmany(self, size):
            rows = self.inner.fetchmany(size)
            fetches.append(len(rows))
            return rows

    class Connection:
        def __init__(self, inner):
            self.inner = inner

        def cursor(self):
            return Cursor(self.inner.cursor())

        def close(self):
            self.inner.close()

    seen: list[str] = []

    def connect(connection_string):
        seen.append(connection_string)
        return Connection(psycopg2.connect(host=PG["host"], port=PG["port"], user=PG["user"], dbname=db.name))

    monkeypatch.setitem(sys.modules, "pyodbc", types.SimpleNamespace(connect=connect))
    t = db.table("odbc_t")
    db.execute(
        f"CREATE TABLE {t} (id INT PRIMARY KEY, amount DECIMAL(18,2), at {db.ts}, payload BYTEA, note TEXT)",
        f"INSERT INTO {t} SELECT g, g / 100.0, TIMESTAMP '2024-01-01' + g * INTERVAL '1 second', "
        "decode('00ff', 'hex'), CASE WHEN g % 2 = 0 THEN NULL ELSE 'n' || g END FROM generate_series(1, 25) g",
    )
    source = db.source("odbc_t", mode="full_refresh", export_mode="pyodbc", batch_size=10)
    result = source.extract(spark, source.plan(spark, None))
    assert fetches == [10, 10, 5, 0]
    assert seen and seen[0].startswith("DRIVER={PostgreSQL Unicode};SERVER={127.0.0.1};PORT={5432}")
    rows = rows_by_id(result.df)
    assert len(rows) == 25
    assert rows[7]["amount"] == Decimal("0.07") and rows[7]["note"] == "n7" and rows[8]["note"] is None
    assert rows[7]["at"] == datetime(2024, 1, 1, 0, 0, 7) and bytes(rows[7]["payload"]) == b"\x00\xff"
    assert [f.dataType.simpleString() for f in result.schema.fields] == [
        "int",
        "decimal(18,2)",
        "timestamp",
        "binary",
        "string",
    ]
    assert result.df.where(F.col(C.OP) != C.UPSERT).count() == 0


# --------------------------------------------------------------------------- MSSQL plans (canned answers)
#
# No MSSQL server exists here: the planning logic runs against canned answers keyed by the query
# text it sends, and the produced SQL is asserted as text.

ORDERS_COLUMNS = (
    T.ColumnInfo("order_id", "int", 10, 0),
    T.ColumnInfo("amount", "money", 19, 4),
    T.ColumnInfo("updated_at", "datetime2"),
)


def _canned(source: SqlBatchSource, answers: dict[str, list[tuple]]) -> list[str]:
    sent: list[str] = []

    def run_query(spark, sql, what):
        sent.append(sql)
        for needle, rows in answers.items():
            if needle in sql:
                return rows
        raise AssertionError(f"unexpected query {sql}")

    source.check_driver = lambda spark: None  # type: ignore[method-assign]
    source._catalog = ORDERS_COLUMNS
    source.run_query = run_query  # type: ignore[method-assign]
    return sent


def _mssql(mode: str, **options: Any) -> SqlBatchSource:
    manifest = Manifest.model_validate(
        {
            "name": "m",
            "source": {
                "type": "mssql",
                "connection_id": "c",
                "table": {"name": "orders"},
                "options": options,
            },
            "sink": {
                "type": "kafka",
                "connection_id": "k",
                "topic": "t",
                "strategy": {"mode": mode, "unique_key": "order_id"},
            },
        }
    )
    return SqlBatchSource(manifest, JdbcConnection(host="sql.local", user="sa", password="pw"))


def test_mssql_incremental_plan_text():
    source = _mssql("incremental_merge", incremental_column="updated_at", lookback="PT1M")
    sent = _canned(source, {"MAX(": [("2024-01-02T03:04:05.1234567", 12)]})
    boundary = source.plan(
        None, {"column": "updated_at", "value": "2024-01-01T00:01:00.003", "type": "timestamp"}
    )
    assert sent[0] == (
        "SELECT CONVERT(VARCHAR(27), MAX([updated_at]), 126) AS [max_value], COUNT_BIG([updated_at]) AS [row_count] "
        "FROM [dbo].[orders] WHERE [updated_at] >= '2024-01-01T00:00:00.003'"
    )
    assert boundary.query == (
        "SELECT [order_id], CAST([amount] AS DECIMAL(19,4)) AS [amount], [updated_at] FROM [dbo].[orders] "
        "WHERE [updated_at] >= '2024-01-01T00:00:00.003' AND [updated_at] <= '2024-01-02T03:04:05.1234567'"
    )
    assert boundary.total == 12 and boundary.kind == "timestamp"
    assert boundary.new_watermark == {
        "column": "updated_at",
        "value": "2024-01-02T03:04:05.1234567",
        "type": "timestamp",
    }
    json.dumps(boundary.as_dict())


def test_mssql_cdc_first_run_starts_at_the_minimum_lsn():
    source = _mssql("cdc")
    sent = _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002A000001F40001",)],
            "fn_cdc_get_max_lsn": [("0x0000002A000002000003",)],
        },
    )
    boundary = source.plan(None, None)
    assert sent == [T.cdc_min_lsn_query("dbo_orders"), T.cdc_max_lsn_query()]
    assert boundary.method == "cdc" and boundary.kind == "lsn"
    assert (boundary.lower, boundary.upper) == ("0x0000002A000001F40001", "0x0000002A000002000003")
    assert boundary.query == T.cdc_query(
        "dbo_orders",
        "0x0000002A000001F40001",
        "0x0000002A000002000003",
        ["order_id", "amount", "updated_at"],
        expressions={"amount": "CAST([amount] AS DECIMAL(19,4))"},
    )
    assert boundary.new_watermark == {
        "column": "__$start_lsn",
        "value": "0x0000002A000002000003",
        "type": "lsn",
        "capture_instance": "dbo_orders",
    }


def test_mssql_cdc_next_run_starts_after_the_stored_lsn():
    source = _mssql("cdc", capture_instance="sales_orders_v2")
    stored = {"column": "__$start_lsn", "value": "0x0000002A000002000003", "type": "lsn"}
    sent = _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002A000001F40001",)],
            "fn_cdc_get_max_lsn": [("0x0000002B000000100002",)],
            "fn_cdc_increment_lsn": [("0x0000002A000002000004",)],
        },
    )
    boundary = source.plan(None, stored)
    assert T.cdc_increment_lsn_query("0x0000002A000002000003") in sent
    assert boundary.lower == "0x0000002A000002000004" and boundary.upper == "0x0000002B000000100002"
    assert (
        "[cdc].[fn_cdc_get_all_changes_sales_orders_v2](0x0000002A000002000004, 0x0000002B000000100002, N'all')"
        in (boundary.query)
    )
    assert boundary.new_watermark["value"] == "0x0000002B000000100002"


def test_mssql_cdc_without_changes_keeps_the_stored_lsn():
    source = _mssql("cdc")
    stored = {"column": "__$start_lsn", "value": "0x0000002A000002000003", "type": "lsn"}
    _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002A000001F40001",)],
            "fn_cdc_get_max_lsn": [("0x0000002A000002000003",)],
            "fn_cdc_increment_lsn": [("0x0000002A000002000004",)],
        },
    )
    boundary = source.plan(None, stored)
    assert boundary.empty and boundary.query.startswith("SELECT TOP 0 ")
    assert boundary.new_watermark["value"] == stored["value"]


def test_mssql_cdc_refuses_gaps_and_missing_capture_instances():
    stored = {"column": "__$start_lsn", "value": "0x0000002A000002000003", "type": "lsn"}
    source = _mssql("cdc")
    _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002F000000000001",)],  # cleanup removed what we need
            "fn_cdc_get_max_lsn": [("0x00000030000000000001",)],
            "fn_cdc_increment_lsn": [("0x0000002A000002000004",)],
        },
    )
    with pytest.raises(RunFailed, match="removed by the CDC cleanup job"):
        source.plan(None, stored)
    source = _mssql("cdc")
    _canned(source, {"fn_cdc_get_min_lsn": [(T.ZERO_LSN,)]})
    with pytest.raises(ConfigError, match="capture instance 'dbo_orders' does not exist"):
        source.plan(None, None)
    source = _mssql("cdc")
    _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002A000001F40001",)],
            "fn_cdc_get_max_lsn": [("0x0000002A000002000003",)],
        },
    )
    with pytest.raises(ConfigError, match="not an LSN"):
        source.plan(None, {"column": "updated_at", "value": "2024-01-01T00:00:00", "type": "timestamp"})


def test_cdc_extract_maps_operations_order_and_types(spark):
    """The CDC rows as jTDS delivers them (datetime2 as text) become typed rows with op and order."""
    source = _mssql("cdc")
    _canned(
        source,
        {
            "fn_cdc_get_min_lsn": [("0x0000002A000001F40001",)],
            "fn_cdc_get_max_lsn": [("0x0000002A000002000003",)],
        },
    )
    boundary = source.plan(None, None)
    raw = spark.createDataFrame(
        [
            (
                "0x0000002A000001F40001",
                "0x0000002A000001F40001",
                2,
                1,
                Decimal("10.5000"),
                "2024-01-02 03:04:05.1234567",
            ),
            (
                "0x0000002A000001F50001",
                "0x0000002A000001F50002",
                4,
                1,
                Decimal("11.0000"),
                "2024-01-02 03:05:00.0000000",
            ),
            (
                "0x0000002A000002000003",
                "0x0000002A000002000001",
                1,
                1,
                Decimal("11.0000"),
                "2024-01-02 03:06:00.0000000",
            ),
        ],
        f"{T.CDC_START_LSN} string, {T.CDC_SEQVAL} string, {T.CDC_OPERATION} int, order_id int, "
        "amount decimal(19,4), updated_at string",
    )
    source._read_jdbc = lambda spark, boundary: (raw, "jdbc read in one partition", 1)  # type: ignore[method-assign]
    result = source.extract(spark, boundary)
    assert [(f.name, f.dataType.simpleString()) for f in result.schema.fields] == [
        ("order_id", "int"),
        ("amount", "decimal(19,4)"),
        ("updated_at", "timestamp"),
    ]
    rows = result.df.orderBy(C.ORDER).collect()
    assert [r[C.OP] for r in rows] == [C.UPSERT, C.UPSERT, C.DELETE]
    assert rows[0]["updated_at"] == datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert rows[2][C.ORDER].asDict() == {"lsn": "0x0000002A000002000003", "seq": "0x0000002A000002000001", "op": 1}


@pytest.mark.parametrize("db", ["postgres"], indirect=True)  # timestamp with time zone is a PostgreSQL type
def test_postgres_timestamptz_watermark_is_utc(db, spark):
    t = db.table("tz")
    db.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, changed TIMESTAMPTZ)")
    db.execute(f"INSERT INTO {t} VALUES (1, '2024-01-01 05:00:00+05:00'), (2, '2024-01-01 01:00:00+01:00')")
    source = db.source("tz", incremental_column="changed")
    first = source.plan(spark, None)
    assert first.kind == "timestamp_tz" and first.upper == "2024-01-01T00:00:00"
    assert "'2024-01-01T00:00:00+00:00'" in first.query
    assert sorted(rows_by_id(source.extract(spark, first).df)) == [1, 2]  # the same instant
    db.execute(f"INSERT INTO {t} VALUES (3, '2024-01-01 00:30:00+00:00')")
    second = source.plan(spark, first.new_watermark)
    assert sorted(rows_by_id(source.extract(spark, second).df)) == [1, 2, 3]
