"""Promises of the SQL sources that depend on the server a user runs, not on this machine's
defaults: MySQL/MariaDB TIMESTAMP values arrive in UTC whatever the server's time zone, MSSQL
rowversion windows end below the oldest open transaction, and bcp exports do not outlive the run.

The MariaDB tests run against the machine's real server (127.0.0.1:3306, root) through the whole
engine into the embedded broker. No MSSQL server or `bcp` binary exists here: the rowversion
window is asserted as generated T-SQL text, and the bcp tests put a stand-in `bcp` program on PATH
that writes the export file the way `bcp ... queryout` would.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import consume_all, create_topic, unique_topic

from dpone_dagster.connections import JdbcConnection
from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import ConfigError, DataRefused, RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.sources.sql import SqlBatchSource, SqlBoundary
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.odbc import odbc_connection_string
from dpone_dagster.state.local import LocalStateStore

# --------------------------------------------------------------------------- MariaDB TIMESTAMP in UTC


def mysql(sql: str, database: str | None = None) -> str:
    """Run statements with the mysql client (root, no password) and return its tab-separated output."""
    argv = ["mysql", "-uroot", "-h127.0.0.1", "-N", "-B", *([database] if database else []), "-e", sql]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@contextlib.contextmanager
def server_time_zone(zone: str) -> Iterator[None]:
    """The server's global time_zone set to `zone` (new sessions start in it), restored afterwards."""
    before = mysql("SELECT @@GLOBAL.time_zone").strip()
    mysql(f"SET GLOBAL time_zone = '{zone}'")
    try:
        yield
    finally:
        mysql(f"SET GLOBAL time_zone = '{before}'")


@pytest.fixture
def mariadb(monkeypatch) -> Iterator[str]:
    name = f"dpone_tz_{uuid.uuid4().hex[:8]}"
    mysql(f"CREATE DATABASE {name}")
    env = {"SQL_DB_HOST": "127.0.0.1", "SQL_DB_PORT": "3306", "SQL_DB_USER": "root", "SQL_DB_DATABASE": name}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield name
    finally:
        mysql(f"DROP DATABASE {name}")


def tz_manifest(database: str, topic: str, state: str) -> str:
    return f"""
name: sql_tz
source:
  type: mysql
  connection_id: sql_db
  table: {{schema: {database}, name: events}}
  options: {{incremental_column: stamped}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {topic}
  strategy: {{mode: incremental_merge, unique_key: id}}
state: {{type: local, path: {state}}}
"""


def insert_utc(database: str, rows: str) -> None:
    """Insert rows whose TIMESTAMP literals are UTC (this session only is put on UTC)."""
    mysql(f"SET time_zone = '+00:00'; INSERT INTO events VALUES {rows}", database)


def test_mariadb_timestamp_arrives_in_utc_when_the_server_is_not(broker, spark, kafka_env, mariadb, tmp_path):
    """Server zone +02:00: a TIMESTAMP at 12:00 UTC arrives as 12:00Z (it arrived as 14:00Z before the
    fix), a DATETIME keeps its wall clock, and the watermark window of the next run agrees."""
    mysql("CREATE TABLE events (id INT PRIMARY KEY, stamped TIMESTAMP(6) NULL, wall DATETIME(6))", mariadb)
    insert_utc(mariadb, "(1, '2024-01-01 12:00:00', '2024-01-01 12:00:00')")
    topic = unique_topic("sqltz")
    create_topic(broker.bootstrap_servers, topic, 1)
    manifest = parse_manifest(tz_manifest(mariadb, topic, str(tmp_path)))
    store = LocalStateStore(str(tmp_path))
    with server_time_zone("+02:00"):
        run_pipeline(manifest, spark)
        first = consume_all(broker.bootstrap_servers, topic)
        assert [r["value"] for r in first] == [
            {"id": 1, "stamped": "2024-01-01T12:00:00.000000Z", "wall": "2024-01-01T12:00:00.000000Z"}
        ]
        assert store.load_watermark(manifest.name) == {
            "column": "stamped",
            "value": "2024-01-01T12:00:00",
            "type": "timestamp_tz",
        }
        # The next window starts at the stored 12:00 UTC (inclusive) and reads a row stamped 13:00 UTC.
        insert_utc(mariadb, "(2, '2024-01-01 13:00:00', '2024-01-01 13:00:00')")
        second = run_pipeline(manifest, spark)
    assert second.rows_extracted == 2  # the boundary row again, and the new one
    latest = {r["key"]: r["value"] for r in consume_all(broker.bootstrap_servers, topic)}
    assert latest["2"]["stamped"] == "2024-01-01T13:00:00.000000Z"
    assert store.load_watermark(manifest.name)["value"] == "2024-01-01T13:00:00"


def mariadb_source(database: str, **connection: object) -> SqlBatchSource:
    manifest = parse_manifest(tz_manifest(database, "unused", "/nonexistent"))
    fields = {"host": "127.0.0.1", "port": 3306, "user": "root", "database": database, **connection}
    return SqlBatchSource(manifest, JdbcConnection(**fields))


def test_mariadb_watermark_stored_in_the_server_zone_is_converted_to_utc(spark, mariadb):
    """A `timestamp` watermark stored by an earlier version was the server's wall clock (+02:00):
    14:00 there is 12:00 UTC. Taken as UTC it would skip the row stamped 13:00 UTC."""
    mysql("CREATE TABLE events (id INT PRIMARY KEY, stamped TIMESTAMP(6) NULL, wall DATETIME(6))", mariadb)
    insert_utc(mariadb, "(1, '2024-01-01 12:00:00', NULL), (2, '2024-01-01 13:00:00', NULL)")
    legacy = {"column": "stamped", "value": "2024-01-01T14:00:00", "type": "timestamp"}
    with server_time_zone("+02:00"):
        source = mariadb_source(mariadb)
        boundary = source.plan(spark, legacy)
        rows = sorted(r["id"] for r in source.extract(spark, boundary).df.collect())
    assert boundary.lower == "2024-01-01T12:00:00" and boundary.upper == "2024-01-01T13:00:00"
    assert rows == [1, 2]
    assert boundary.new_watermark == {
        "column": "stamped",
        "value": "2024-01-01T13:00:00",
        "type": "timestamp_tz",
    }
    assert any("read in the session time zone +02:00" in note for note in boundary.notes)


def test_mariadb_connection_zone_is_replaced_and_a_url_override_refused(spark, mariadb):
    mysql("CREATE TABLE events (id INT PRIMARY KEY, stamped TIMESTAMP(6) NULL, wall DATETIME(6))", mariadb)
    insert_utc(mariadb, "(1, '2024-01-01 12:00:00', NULL)")
    own = {"sessionVariables": "sql_mode='ANSI_QUOTES,NO_ZERO_DATE',time_zone='+05:00'"}
    source = mariadb_source(mariadb, properties=own)
    assert source.properties()["sessionVariables"] == "sql_mode='ANSI_QUOTES,NO_ZERO_DATE',time_zone='+00:00'"
    assert source.plan(spark, None).upper == "2024-01-01T12:00:00"
    url = f"jdbc:mysql://127.0.0.1:3306/{mariadb}?permitMysqlScheme&sessionVariables=time_zone='+03:00'"
    with pytest.raises(ConfigError, match=r"session time zone is \+03:00, not UTC.*jdbc_url"):
        mariadb_source(mariadb, jdbc_url=url).plan(spark, None)


@pytest.mark.parametrize(
    ("configured", "expected", "named"),
    [
        (None, "time_zone='+00:00'", None),
        ("time_zone='SYSTEM'", "time_zone='+00:00'", "SYSTEM"),
        (
            "sql_mode='ANSI_QUOTES,NO_ZERO_DATE', @@session.time_zone = '-05:00',wait_timeout=60",
            "sql_mode='ANSI_QUOTES,NO_ZERO_DATE',wait_timeout=60,time_zone='+00:00'",
            "-05:00",
        ),
    ],
)
def test_mysql_session_variables_put_the_session_on_utc(configured, expected, named):
    assert T.mysql_session_variables(configured) == (expected, named)


def test_mysql_stored_watermark_conversion_text():
    literal = T.watermark_literal("mysql", "timestamp", "2024-01-01T14:00:00")
    assert T.mysql_utc_from_zone_query(literal, None) == (
        "SELECT DATE_FORMAT(CONVERT_TZ(CAST('2024-01-01 14:00:00' AS DATETIME(6)), @@GLOBAL.time_zone, '+00:00'), "
        "'%Y-%m-%dT%H:%i:%s.%f') AS `utc_value`, @@GLOBAL.time_zone AS `time_zone`"
    )
    assert "CONVERT_TZ(CAST('2024-01-01 14:00:00' AS DATETIME(6)), '-05:00', '+00:00')" in (
        T.mysql_utc_from_zone_query(literal, "-05:00")
    )


# --------------------------------------------------------------------------- MSSQL rowversion window
#
# No MSSQL server here: the plan runs against canned answers and its T-SQL is asserted as text.

ROWVERSION_COLUMNS = (T.ColumnInfo("order_id", "int", 10, 0), T.ColumnInfo("rv", "timestamp"))


def mssql_rowversion_source(answers: dict[str, tuple]) -> tuple[SqlBatchSource, list[str]]:
    """An incremental MSSQL source on rowversion column `rv` whose queries get `answers`: the
    active rowversion, and the window's row count."""
    manifest = parse_manifest(
        """
name: rv
source: {type: mssql, connection_id: c, table: {name: orders}, options: {incremental_column: rv}}
sink: {type: kafka, connection_id: k, topic: t, strategy: {mode: incremental_merge, unique_key: order_id}}
"""
    )
    source = SqlBatchSource(manifest, JdbcConnection(host="sql.local", user="sa", password="pw"))
    sent: list[str] = []

    def run_query(spark, sql, what):
        sent.append(sql)
        if "MIN_ACTIVE_ROWVERSION()" in sql:
            return [(answers["active"],)]
        if sql.startswith("SELECT COUNT_BIG([rv])"):
            return [(answers["count"],)]
        raise AssertionError(f"unexpected query {sql}")

    source.check_driver = lambda spark: None  # type: ignore[method-assign]
    source._catalog = ROWVERSION_COLUMNS
    source.run_query = run_query  # type: ignore[method-assign]
    return source, sent


def test_mssql_rowversion_window_ends_below_the_oldest_open_transaction():
    """Under read committed snapshot a transaction still open holds rowversion 0x7D3 while 0x7D4 is
    committed: MAX(rv) (0x7D4, what the plan used before the fix) would end the window above the
    open row, and the next run, starting at 0x7D4, would never read it. MIN_ACTIVE_ROWVERSION()
    (0x7D3) ends it below, exclusive; the next run starts exactly there."""
    source, sent = mssql_rowversion_source({"active": "0x00000000000007D3", "count": 2})
    first = source.plan(None, None)
    assert sent == [
        "SELECT CONVERT(VARCHAR(18), MIN_ACTIVE_ROWVERSION(), 1) AS [upper_value]",
        "SELECT COUNT_BIG([rv]) AS [row_count] FROM [dbo].[orders] WHERE [rv] < 0x00000000000007D3",
    ]
    assert first.query == "SELECT [order_id], [rv] FROM [dbo].[orders] WHERE [rv] < 0x00000000000007D3"
    assert (first.upper, first.upper_inclusive, first.total) == ("0x00000000000007D3", False, 2)
    assert first.new_watermark == {"column": "rv", "value": "0x00000000000007D3", "type": "rowversion"}

    # The transaction committed (0x7D3) and a later one too; nothing is open: the bound is @@DBTS + 1.
    source, sent = mssql_rowversion_source({"active": "0x00000000000007D6", "count": 3})
    second = source.plan(None, first.new_watermark)
    window = "[rv] >= 0x00000000000007D3 AND [rv] < 0x00000000000007D6"
    assert sent[1] == f"SELECT COUNT_BIG([rv]) AS [row_count] FROM [dbo].[orders] WHERE {window}"
    assert second.query == f"SELECT [order_id], [rv] FROM [dbo].[orders] WHERE {window}"
    assert second.conditions == ("[rv] >= 0x00000000000007D3", "[rv] < 0x00000000000007D6")  # bcp, partitions

    # Nothing new since: an empty window keeps the watermark, and the next window starts there.
    source, _ = mssql_rowversion_source({"active": "0x00000000000007D6", "count": 0})
    third = source.plan(None, second.new_watermark)
    assert third.empty and third.new_watermark == second.new_watermark
    assert "rowversion" in " ".join(third.notes)


# --------------------------------------------------------------------------- bcp exports do not outlive the run
#
# No `bcp` binary exists here: a stand-in program named `bcp` on PATH writes the export file the
# way `bcp "<select>" queryout <file> -c -t \x1f -r \x1e` would (the encoding of sql.text.bcp), or
# fails, or is killed, or writes a file Spark cannot parse, as STAND_IN_BCP says. The MSSQL catalog
# and row count are canned (no server); everything after the export runs for real, into Kafka.

STAND_IN_BCP = r"""#!{python}
import os, signal, sys
path = sys.argv[sys.argv.index("queryout") + 1]
mode = os.environ.get("STAND_IN_BCP", "ok")
if os.environ.get("STAND_IN_BCP_CALLS"):
    with open(os.environ["STAND_IN_BCP_CALLS"], "a") as calls:
        calls.write("export\n")
rows = {{"ok": "1\x1f\"~first\"\x1e2\x1f\x1e", "garbage": "1\x1f\"~a\"\x1fextra\x1fextra\x1e", "keyless": "\x1f\"~first\"\x1e2\x1f\x1e"}}
with open(path, "w", encoding="utf-8") as export:
    export.write(rows.get(mode, "1\x1f\"~part"))
    export.flush()
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
if mode == "fail":
    sys.exit("SQLState = 08S01, NativeError = 0 Error = [Microsoft][ODBC Driver 18] Communication link failure")
"""
BCP_COLUMNS = (T.ColumnInfo("order_id", "int", 10, 0), T.ColumnInfo("note", "nvarchar"))


def bcp_manifest(topic: str, state: str) -> str:
    return f"""
name: sql_bcp
source:
  type: mssql
  connection_id: sql_db
  table: {{name: orders}}
  options: {{export_mode: bcp}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {topic}
  strategy: {{mode: full_refresh, unique_key: order_id}}
state: {{type: local, path: {state}}}
"""


@pytest.fixture
def stand_in_bcp(monkeypatch, tmp_path):
    """The export directory (DPONE_BCP_DIR), with a stand-in `bcp` first on PATH and an MSSQL
    server's answers canned."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "bcp"
    program.write_text(STAND_IN_BCP.format(python=sys.executable))
    program.chmod(0o755)
    exports = tmp_path / "exports"
    exports.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DPONE_BCP_DIR", str(exports))
    for key, value in {"SQL_DB_HOST": "sql.local", "SQL_DB_USER": "sa", "SQL_DB_PASSWORD": "pw"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(SqlBatchSource, "check_driver", lambda self, spark: None)
    monkeypatch.setattr(SqlBatchSource, "catalog", lambda self, spark: BCP_COLUMNS)
    monkeypatch.setattr(SqlBatchSource, "run_query", lambda self, spark, sql, what: [(2,)])  # the row count
    return exports


def test_bcp_export_is_removed_after_a_successful_run(broker, spark, kafka_env, stand_in_bcp, tmp_path):
    topic = unique_topic("sqlbcp")
    create_topic(broker.bootstrap_servers, topic, 1)
    result = run_pipeline(parse_manifest(bcp_manifest(topic, str(tmp_path / "state"))), spark)
    assert result.messages_produced == 2 and result.execution_path == "direct"
    assert sorted((r["key"], r["value"]["note"]) for r in consume_all(broker.bootstrap_servers, topic)) == [
        ("1", "first"),
        ("2", None),
    ]
    assert list(stand_in_bcp.iterdir()) == []  # no export file, no export directory


def test_a_bcp_export_handed_to_the_spark_sql_path_is_not_exported_again(broker, spark, kafka_env, stand_in_bcp, tmp_path, monkeypatch):
    """A row without its key sends the batch from the direct path to the Spark SQL path, which
    judges it with the rows already exported (its bad-record policy, fail, refuses the batch)."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("STAND_IN_BCP", "keyless")
    monkeypatch.setenv("STAND_IN_BCP_CALLS", str(calls))
    topic = unique_topic("sqlbcpkeyless")
    create_topic(broker.bootstrap_servers, topic, 1)
    with pytest.raises(DataRefused, match="have no unique key"):
        run_pipeline(parse_manifest(bcp_manifest(topic, str(tmp_path / "state"))), spark)
    assert calls.read_text() == "export\n"
    assert consume_all(broker.bootstrap_servers, topic, timeout_s=5) == []
    assert list(stand_in_bcp.iterdir()) == []


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("fail", r"bcp exited with 1: .*Communication link failure"),
        ("kill", r"bcp exited with -9"),
        ("garbage", r"the bcp export could not be read back \(.*MALFORMED_CSV_RECORD\)"),
    ],
)
def test_bcp_export_is_removed_after_a_failed_run(
    broker, spark, kafka_env, stand_in_bcp, tmp_path, monkeypatch, mode, error
):
    """bcp fails after writing part of the file, is killed mid-export, or leaves a file Spark
    cannot parse: the run fails, and no export is left behind."""
    monkeypatch.setenv("STAND_IN_BCP", mode)
    topic = unique_topic("sqlbcpfail")
    create_topic(broker.bootstrap_servers, topic, 1)
    with pytest.raises(RunFailed, match=error) as failed:
        run_pipeline(parse_manifest(bcp_manifest(topic, str(tmp_path / "state"))), spark)
    assert "~a" not in str(failed.value)  # row data stays out of the error
    assert list(stand_in_bcp.iterdir()) == []
    assert consume_all(broker.bootstrap_servers, topic, timeout_s=3) == []


def test_bcp_exports_left_by_killed_processes_are_swept(spark, stand_in_bcp):
    """A driver killed mid-read leaves its export: the next export removes it when no process holds
    its lock any more — a pid reused since does not matter — keeps a live one (locked, here by a
    process that stays alive), and removes an older version's export once 6 hours old."""
    host = socket.gethostname()
    killed = stand_in_bcp / f"dpone_bcp.{host}.{os.getpid()}.{uuid.uuid4().hex}"  # its pid is alive: reused
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dpone_dagster.sources.sql.bcp import make_export_directory as m; "
         "print(m(sys.argv[1])[0], flush=True); time.sleep(600)", str(stand_in_bcp)],
        stdout=subprocess.PIPE, text=True,
    )
    live = Path(holder.stdout.readline().strip())
    leftovers = {"killed": killed, "old_version": stand_in_bcp / "dpone_bcp_k2j4x9ab", "old_version_fresh": stand_in_bcp / "dpone_bcp_z8y7w6vu"}
    for directory in leftovers.values():
        directory.mkdir()
        (directory / "export.dat").write_text('1\x1f"~personal data"\x1e')
    (killed / ".lock").write_text("")  # the lock file of a run killed mid-read: nobody holds it
    (live / "export.dat").write_text('1\x1f"~personal data"\x1e')
    day_ago = time.time() - 24 * 3600
    for leftover in (leftovers["old_version"], leftovers["old_version"] / "export.dat"):
        os.utime(leftover, (day_ago, day_ago))
    source = SqlBatchSource(
        parse_manifest(bcp_manifest("t", "/nonexistent")), JdbcConnection(host="sql.local")
    )
    boundary = SqlBoundary(
        method="full",
        table="[dbo].[orders]",
        column=None,
        lower=None,
        lower_inclusive=True,
        upper=None,
        query="",
        total=2,
        new_watermark=None,
        dialect="mssql",
        columns=BCP_COLUMNS,
    )
    try:
        assert source.extract(spark, boundary).df.count() == 2
        assert sorted(p.name for p in stand_in_bcp.iterdir()) == sorted([live.name, leftovers["old_version_fresh"].name])
    finally:
        holder.kill()
        holder.wait()


def test_mysql_odbc_session_is_put_on_utc():
    """export_mode pyodbc reads the window the plan fixed in a UTC session: its ODBC session too."""
    source = mariadb_source("shop")
    assert odbc_connection_string(source).endswith(";INITSTMT={SET time_zone='+00:00'}")
