"""Spark Connect mode: a real Connect server started with `dpone spark-server start` (the pyspark
package's own server), and the engine run against it by `dpone run` and by `dagster asset
materialize` with DPONE_SPARK_REMOTE, each asserted on the target topic and the stored offsets.

Clients run in their own processes: a Connect session switches PySpark in its process to
Connect mode, which the rest of this suite's classic session must not see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import consume_all, consume_raw, create_topic, kafka_pipeline_yaml, produce_json, unique_topic

from dpone_dagster.embedded_broker import free_port
from dpone_dagster.spark.session import client_conf, fresh_session, shared_session
from dpone_dagster.state.local import LocalStateStore

pytestmark = pytest.mark.spark_connect

KEEP_LAST = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"


def dpone(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpone_dagster.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A Connect server on a free port for this module; stopped (and seen stopped) at the end."""
    home = tmp_path_factory.mktemp("spark_connect")
    env = {**os.environ, "DPONE_SPARK_MASTER": "local[2]"}
    env.pop("DPONE_SPARK_REMOTE", None)
    started = dpone("spark-server", "start", "--port", str(free_port()), env=env, cwd=home)
    assert started.returncode == 0, started.stdout + started.stderr
    url = next(line.split("=", 1)[1] for line in started.stdout.splitlines() if line.startswith("export DPONE_SPARK_REMOTE="))
    try:
        yield url, home
    finally:
        stopped = dpone("spark-server", "stop", env=env, cwd=home)
        assert "stopped" in stopped.stdout
        assert dpone("spark-server", "status", env=env, cwd=home).returncode == 1


def test_client_settings_leave_server_settings_to_the_server(monkeypatch):
    monkeypatch.delenv("DPONE_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    conf = {"spark.master": "local[2]", "spark.task.maxFailures": "1", "spark.sql.session.timeZone": "UTC"}
    assert client_conf(conf) == conf  # classic: unchanged
    monkeypatch.setenv("DPONE_SPARK_REMOTE", "sc://127.0.0.1:15002")
    shared = shared_session("sc://127.0.0.1:15002")
    assert client_conf(conf) == {"spark.remote": shared, "spark.sql.session.timeZone": "UTC"}


def test_every_run_of_a_server_names_the_same_session():
    shared = shared_session("sc://127.0.0.1:15002")
    assert shared.startswith("sc://127.0.0.1:15002/;session_id=") and shared == shared_session("sc://127.0.0.1:15002/")
    assert shared != shared_session("sc://127.0.0.1:15003")
    assert shared_session("sc://h:1/;token=t").startswith("sc://h:1/;token=t;session_id=")
    own = "sc://h:1/;session_id=6d0bd6c4-0a9d-4e1e-9d38-5b3bd5e1b5a3"
    assert shared_session(own) == own  # a URL that names its session keeps it
    assert fresh_session(shared) != shared and fresh_session(shared).startswith("sc://127.0.0.1:15002/;session_id=")


def server_python_daemons(url: str) -> int:
    """Python worker daemons the Connect server at `url` started (pyspark.daemon processes whose
    parent is the server's JVM): one per Connect session that ran Python."""
    port = url.rsplit(":", 1)[1].strip("/")
    commands, parents = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    return sum(
        1
        for pid, command in commands.items()
        if "pyspark.daemon" in command and f"spark.connect.grpc.binding.port={port} " in commands.get(parents[pid], "") + " "
    )


def test_dpone_run_and_dagster_materialize_on_a_connect_server(broker, connect_server, tmp_path):
    url, home = connect_server
    assert dpone("spark-server", "status", env=dict(os.environ), cwd=home).returncode == 0
    bs = broker.bootstrap_servers
    src, dst = unique_topic("connect"), unique_topic("connect_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    for partition in range(2):
        produce_json(bs, src, [{"order_id": partition * 1000 + i} for i in range(500)], partition=partition)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    state = tmp_path / "state"
    (manifests / "connect_run.yaml").write_text(kafka_pipeline_yaml("connect_run", src, dst, state, KEEP_LAST, "{}"))
    env = {
        **os.environ,
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs,
        "DPONE_SPARK_REMOTE": url,
        "DPONE_MANIFESTS_DIR": str(manifests),
        "DAGSTER_HOME": str(tmp_path),
    }
    run = dpone("run", str(manifests / "connect_run.yaml"), "--format", "json", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["execution_path"] == "direct"  # Arrow tasks run on Connect too
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == sorted(p * 1000 + i for p in range(2) for i in range(500))
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_run") == {0: 500, 1: 500}

    produce_json(bs, src, [{"order_id": 5000 + i} for i in range(10)], partition=0)
    materialize = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "dpone_dagster.definitions", "--select", "connect_run"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert materialize.returncode == 0, materialize.stdout[-3000:] + materialize.stderr[-3000:]
    assert len(consume_all(bs, dst)) == 1010  # only the 10 new records were read and produced
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_run") == {0: 510, 1: 500}
    # Both processes ran in the server's one shared session: one Python worker daemon, not one per run.
    assert server_python_daemons(url) == 1

    # A client closes the shared session; the next run gets a session of its own and completes.
    closer = subprocess.run(
        [sys.executable, "-c", "from dpone_dagster.spark.session import get_spark; get_spark().stop()"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert closer.returncode == 0, closer.stderr[-2000:]
    produce_json(bs, src, [{"order_id": 6000 + i} for i in range(5)], partition=1)
    again = dpone("run", str(manifests / "connect_run.yaml"), env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(consume_all(bs, dst)) == 1015
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_run") == {0: 510, 1: 505}


def test_spark_sql_path_on_a_connect_server(broker, connect_server, tmp_path):
    """With the direct path switched off, a run's shuffle, keep_last, check (a unique check off
    the unique key) and encoding run as Spark SQL on the server."""
    url, _ = connect_server
    bs = broker.bootstrap_servers
    src, dst = unique_topic("connect_sql"), unique_topic("connect_sql_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    for partition in range(2):  # every key three times, in both partitions: the last version wins
        produce_json(bs, src, [{"order_id": i % 100, "version": partition * 1000 + i} for i in range(300)], partition=partition)
    state = tmp_path / "state"
    path = tmp_path / "connect_sql.yaml"
    quality = "quality: {mode: fail, checks: [{type: unique, columns: [version]}]}"
    path.write_text(kafka_pipeline_yaml("connect_sql", src, dst, state, KEEP_LAST, "{headers: {static: {team: dwh}}}", quality))
    env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs, "DPONE_SPARK_REMOTE": url, "DPONE_DIRECT_PATH": "off"}
    run = dpone("run", str(path), "--format", "json", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["execution_path"] == "spark_sql"
    out = consume_all(bs, dst)
    assert sorted(int(r["key"]) for r in out) == list(range(100))  # one message per key
    assert all(r["headers"]["team"] == "dwh" for r in out)
    # keep_last orders by partition, then offset: the last partition's last version of each key.
    assert {int(r["key"]): r["value"]["version"] for r in out} == {k: 1000 + 200 + k for k in range(100)}
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_sql") == {0: 300, 1: 300}


def test_sql_source_on_a_connect_server(broker, connect_server, tmp_path):
    """PostgreSQL → Kafka through the server's JDBC driver, incremental by a watermark column, on
    the direct path."""
    import psycopg2
    from conftest import PG_HOST, PG_PORT, PG_USER, fresh_pg_database

    url, _ = connect_server
    bs = broker.bootstrap_servers
    dst = unique_topic("connect_pg_out")
    create_topic(bs, dst, 1)
    with fresh_pg_database("dpone_connect") as db:
        conn = psycopg2.connect(**db)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (order_id integer primary key, note varchar(20), updated_at timestamp not null)")
            cur.execute("INSERT INTO orders SELECT i, 'n' || i, '2024-01-01'::timestamp + i * interval '1 minute' FROM generate_series(1, 50) i")
        state = tmp_path / "state"
        path = tmp_path / "connect_pg.yaml"
        path.write_text(f"""
name: connect_pg
source:
  type: postgres
  connection_id: sql_db
  table: {{schema: public, name: orders}}
  options: {{incremental_column: updated_at}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
state: {{type: local, path: {state}}}
""")
        env = {
            **os.environ,
            "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs,
            "DPONE_SPARK_REMOTE": url,
            "SQL_DB_HOST": PG_HOST,
            "SQL_DB_PORT": str(PG_PORT),
            "SQL_DB_USER": PG_USER,
            "SQL_DB_DATABASE": db["dbname"],
        }
        first = dpone("run", str(path), "--format", "json", env=env, cwd=tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        # The server's master is local: the kept messages' files are on the host of every task.
        assert json.loads(first.stdout)["execution_path"] == "direct", first.stdout
        assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == list(range(1, 51))
        with conn.cursor() as cur:
            cur.execute("UPDATE orders SET note = 'changed', updated_at = '2024-02-01' WHERE order_id = 7")
        second = dpone("run", str(path), env=env, cwd=tmp_path)
        conn.close()
    assert second.returncode == 0, second.stdout + second.stderr
    out = consume_all(bs, dst)
    # The watermark's lower bound is inclusive: the boundary row (50) is read again with the update.
    assert sorted(int(r["key"]) for r in out[50:]) == [7, 50]
    assert next(r for r in out[50:] if r["key"] == "7")["value"]["note"] == "changed"
    assert LocalStateStore(str(state)).load_watermark("connect_pg")["value"].startswith("2024-02-01")


def test_dead_letters_and_quality_checks_on_a_connect_server(broker, connect_server, tmp_path):
    """An undecodable record goes to the dead-letter topic and the quality checks (Great
    Expectations among them) judge the batch, all through the server."""
    url, _ = connect_server
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("connect_dq"), unique_topic("connect_dq_out"), unique_topic("connect_dq_dlq")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    poison = b"\xff\xfe not json"
    produce_json(bs, src, [{"order_id": i, "amount": i * 10} for i in range(5)] + [poison] + [{"order_id": i, "amount": i * 10} for i in range(6, 10)], partition=0)
    state = tmp_path / "state"
    path = tmp_path / "connect_dq.yaml"
    source_options = (
        f"{{on_error: dead_letter, dead_letter: {{topic: {dlq}, create: true}}, "
        "schema: [{name: order_id, type: long}, {name: amount, type: long}]}"
    )
    checks = """quality:
  mode: fail
  checks:
    - {type: not_null, columns: [order_id]}
    - {type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, min_value: 0, max_value: 1000}}
    - {type: source_target_count, tolerance_pct: 0}
"""
    strategy = "{mode: incremental_merge, unique_key: order_id}"
    path.write_text(kafka_pipeline_yaml("connect_dq", src, dst, state, strategy, "{}", checks, source_options))
    env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs, "DPONE_SPARK_REMOTE": url}
    run = dpone("run", str(path), "--format", "json", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["execution_path"] == "direct"  # the expectation judged on the decoded rows, on the server
    assert summary["rows_dead_lettered"] == 1
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    (letter,) = consume_raw(bs, dlq)
    assert letter["value"] == poison and dict(letter["headers"])["dpone.error.source.offset"] == b"5"
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_dq") == {0: 10}

    # A value outside the expectation's range fails the run before anything is published.
    produce_json(bs, src, [{"order_id": 20, "amount": 5000}], partition=0)
    failed = dpone("run", str(path), env=env, cwd=tmp_path)
    assert failed.returncode != 0
    assert len(consume_all(bs, dst)) == 9
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_dq") == {0: 10}


def test_bad_records_and_column_checks_on_the_direct_path_of_a_connect_server(broker, connect_server, tmp_path):
    """The direct path on the server: the tasks set an undecodable record and a record without
    its key aside, the driver judges them through the server and dead-letters them, and a column
    check is measured in the tasks."""
    url, _ = connect_server
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("connect_dbad"), unique_topic("connect_dbad_out"), unique_topic("connect_dbad_dlq")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    poison = b"{not json"
    rows = [{"order_id": i, "amount": i * 10} for i in range(5)] + [poison, {"amount": 1}] + [{"order_id": i, "amount": i * 10} for i in range(7, 10)]
    produce_json(bs, src, rows, partition=0)
    state = tmp_path / "state"
    path = tmp_path / "connect_dbad.yaml"
    source_options = f"{{on_error: dead_letter, dead_letter: {{topic: {dlq}, create: true}}}}"
    checks = "quality:\n  mode: fail\n  checks:\n    - {type: not_null, columns: [amount]}\n"
    strategy = "{mode: incremental_merge, unique_key: order_id}"
    path.write_text(kafka_pipeline_yaml("connect_dbad", src, dst, state, strategy, "{}", checks, source_options))
    env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs, "DPONE_SPARK_REMOTE": url}
    run = dpone("run", str(path), "--format", "json", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert summary["execution_path"] == "direct" and summary["rows_dead_lettered"] == 2
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [0, 1, 2, 3, 4, 7, 8, 9]
    letters = {int(dict(r["headers"])["dpone.error.source.offset"]): r["value"] for r in consume_raw(bs, dlq)}
    assert letters == {5: poison, 6: b'{"amount": 1}'}
    assert LocalStateStore(str(state)).load_offsets(src, "dpone.connect_dbad") == {0: 10}


CDC_CLIENT = """
import json, sys
sys.path.insert(0, sys.argv[2])
from _pytest.monkeypatch import MonkeyPatch
from test_sql_direct import cdc_changes, fake_mssql_cdc
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.spark.session import get_spark

spark = get_spark()
fake_mssql_cdc(spark, MonkeyPatch(), cdc_changes())
result = run_pipeline(parse_manifest(open(sys.argv[1]).read()), spark, RunRequest(run_id="connect-cdc"))
print(json.dumps({"path": result.execution_path, "produced": result.messages_produced, "notes": result.notes}))
"""


def test_an_mssql_cdc_batch_on_the_direct_path_of_a_connect_server(broker, connect_server, tmp_path):
    """A CDC read is not counted when planning: each scan task's bound is a share of the rows the
    driver settles, and on Spark Connect the share comes from the reader's own task count (the
    client cannot see the read's partitions). No SQL Server runs here: the client process cans the
    LSN queries and the change-table read (tests/test_sql_direct.fake_mssql_cdc, three tasks), the
    rest runs on the server."""
    from test_sql_direct import manifest_text

    url, _ = connect_server
    bs = broker.bootstrap_servers
    dst = unique_topic("connect_cdc_out")
    create_topic(bs, dst, 2)
    path = tmp_path / "connect_cdc.yaml"
    path.write_text(
        manifest_text(dst, tmp_path / "state", "{mode: cdc, unique_key: order_id, duplicate_policy: keep_last}", "{deletes: {enabled: true, tombstone: true}}")
        .replace("type: postgres", "type: mssql")
        .replace("{schema: public, name: orders}", "{schema: dbo, name: orders}")
        .replace("{incremental_column: updated_at, batch_size: 100}", "{}")
    )
    client = tmp_path / "cdc_client.py"
    client.write_text(CDC_CLIENT)
    env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs, "DPONE_SPARK_REMOTE": url}
    run = subprocess.run([sys.executable, str(client), str(path), str(Path(__file__).parent)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["path"] == "direct", summary["notes"]
    records = consume_raw(bs, dst)
    assert summary["produced"] == len(records) == 66
    last = {r["key"]: r["value"] for r in sorted(records, key=lambda r: (r["partition"], r["offset"]))}
    assert json.loads(last[b"1"])["amount"] == 12.5 and last[b"2"] is None and json.loads(last[b"6"])["amount"] == 66.0
