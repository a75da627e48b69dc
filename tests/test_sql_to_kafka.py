"""SQL → Kafka through the whole engine against the real PostgreSQL and MariaDB: full refresh,
incremental runs with new and updated rows and ties on the watermark, partitioned reads, nulls
and types; the watermark is stored only after the sink succeeded. (No MSSQL server runs here: the
MSSQL SQL is asserted as generated text in test_sql_text.py.)"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient
from conftest import PG_HOST, PG_PORT, PG_USER, consume_all, consume_raw, create_topic, unique_topic

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state.local import LocalStateStore


class Database:
    """A fresh database on the machine's PostgreSQL or MariaDB, dropped afterwards."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.name = f"dpone_sql_{uuid.uuid4().hex[:8]}"

    def admin(self, sql: str, database: str | None = None) -> None:
        if self.dialect == "postgres":
            conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=database or "postgres")
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
            conn.close()
        else:
            subprocess.run(["mysql", "-uroot", "-h127.0.0.1", *([database] if database else []), "-e", sql], check=True)

    def execute(self, sql: str) -> None:
        self.admin(sql, self.name)

    def env(self) -> dict[str, str]:
        port = PG_PORT if self.dialect == "postgres" else 3306
        user = PG_USER if self.dialect == "postgres" else "root"
        return {"SQL_DB_HOST": "127.0.0.1", "SQL_DB_PORT": str(port), "SQL_DB_USER": user, "SQL_DB_DATABASE": self.name}


@pytest.fixture(params=["postgres", "mysql"])
def database(request, monkeypatch) -> Iterator[Database]:
    db = Database(request.param)
    db.admin(f"CREATE DATABASE {db.name}")
    for key, value in db.env().items():
        monkeypatch.setenv(key, value)
    yield db
    db.admin(f"DROP DATABASE {db.name}" + (" WITH (FORCE)" if db.dialect == "postgres" else ""))


def manifest(db: Database, dst: str, tmp_path, strategy: str, options: str = "") -> str:
    schema = "public" if db.dialect == "postgres" else db.name
    return f"""
name: sql_{db.dialect}
source:
  type: {db.dialect}
  connection_id: sql_db
  table: {{schema: {schema}, name: orders}}
  options:
    batch_size: 500
{options}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
state: {{type: local, path: {tmp_path}}}
"""


def create_orders(db: Database) -> None:
    timestamp = "timestamp" if db.dialect == "postgres" else "datetime(6)"
    db.execute(
        f"CREATE TABLE orders (order_id integer primary key, amount decimal(18,2), note varchar(50), "
        f"paid boolean, updated_at {timestamp} not null)"
    )
    db.execute(
        "INSERT INTO orders VALUES "
        "(1, 10.50, 'first', true, '2024-01-01 10:00:00'), "
        "(2, NULL, NULL, false, '2024-01-01 11:00:00'), "
        "(3, 99999.99, '', NULL, '2024-01-01 12:00:00')"
    )


def by_key(bs: str, topic: str) -> dict[str, dict]:
    return {r["key"]: r["value"] for r in consume_all(bs, topic)}


def test_full_refresh_with_nulls_and_types(broker, spark, kafka_env, database, tmp_path):
    create_orders(database)
    dst = unique_topic("sqlfull")
    create_topic(broker.bootstrap_servers, dst, 2)
    strategy = "{mode: full_refresh, unique_key: order_id}"
    result = run_pipeline(parse_manifest(manifest(database, dst, tmp_path, strategy)), spark)
    assert result.rows_extracted == 3 and result.messages_produced == 3
    out = by_key(broker.bootstrap_servers, dst)
    assert out["1"] == {"order_id": 1, "amount": 10.5, "note": "first", "paid": True, "updated_at": "2024-01-01T10:00:00.000000Z"}
    assert out["2"]["amount"] is None and out["2"]["note"] is None and out["2"]["paid"] is False
    assert out["3"]["amount"] == 99999.99 and out["3"]["note"] == "" and out["3"]["paid"] is None


def test_incremental_reads_new_updated_and_tied_rows(broker, spark, kafka_env, database, tmp_path):
    create_orders(database)
    dst = unique_topic("sqlinc")
    create_topic(broker.bootstrap_servers, dst, 1)
    strategy = "{mode: incremental_merge, unique_key: order_id}"
    m = parse_manifest(manifest(database, dst, tmp_path, strategy, "    incremental_column: updated_at"))
    first = run_pipeline(m, spark)
    assert first.rows_extracted == 3
    assert len(first.notes) == len(set(first.notes)) and any(n.startswith("first incremental run") for n in first.notes), first.notes
    store = LocalStateStore(str(tmp_path))
    assert store.load_watermark(m.name)["value"].startswith("2024-01-01")

    # An update, a new row, and a row committed later with the SAME value as the stored watermark.
    database.execute("UPDATE orders SET note = 'changed', updated_at = '2024-01-02 09:00:00' WHERE order_id = 1")
    database.execute("INSERT INTO orders VALUES (4, 1.00, 'new', true, '2024-01-02 08:00:00')")
    database.execute("INSERT INTO orders VALUES (5, 2.00, 'tie', true, '2024-01-01 12:00:00')")
    second = run_pipeline(m, spark)
    # Inclusive lower bound: the boundary row 3 is read again, and so is the tie (5).
    out = consume_all(broker.bootstrap_servers, dst)
    second_keys = sorted(int(r["key"]) for r in out[3:])
    assert second_keys == [1, 3, 4, 5] and second.rows_extracted == 4
    assert by_key(broker.bootstrap_servers, dst)["1"]["note"] == "changed"
    assert "2024-01-02" in store.load_watermark(m.name)["value"]


def test_watermark_stays_when_the_sink_fails(broker, spark, kafka_env, database, tmp_path):
    """The sink topic disappears after the rows were read (a real delete on the broker): the run
    fails and the stored watermark stays where the last successful run left it."""
    bootstrap = broker.bootstrap_servers
    create_orders(database)
    dst = unique_topic("sqlfail")
    create_topic(bootstrap, dst, 1)
    # A short delivery time-out: the producer gives up on the vanished topic after 5 s.
    strategy = "{mode: incremental_append, unique_key: order_id}\n  options: {delivery: {producer_config: {message.timeout.ms: 5000}}}"
    m = parse_manifest(manifest(database, dst, tmp_path, strategy, "    incremental_column: updated_at"))
    run_pipeline(m, spark)
    store = LocalStateStore(str(tmp_path))
    before = store.load_watermark(m.name)
    assert before["value"].startswith("2024-01-01")

    database.execute("INSERT INTO orders VALUES (4, 1.00, 'late', true, '2024-01-03 00:00:00')")

    def delete_sink_once_reading(message: str) -> None:
        if message == "extract: started":
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.delete_topics([dst])[dst].result(timeout=30)

    with pytest.raises(RunFailed, match="were not delivered"):
        run_pipeline(m, spark, RunRequest(log=delete_sink_once_reading))
    assert store.load_watermark(m.name) == before


def test_partitioned_read_delivers_every_row_once(broker, spark, kafka_env, database, tmp_path):
    database.execute("CREATE TABLE orders (order_id integer primary key, v varchar(10))")
    database.execute("INSERT INTO orders VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 101)))
    dst = unique_topic("sqlpart")
    create_topic(broker.bootstrap_servers, dst, 3)
    options = "    partition_column: order_id\n    num_partitions: 3"
    strategy = "{mode: full_refresh, unique_key: order_id}"
    result = run_pipeline(parse_manifest(manifest(database, dst, tmp_path, strategy, options)), spark)
    assert result.messages_produced == 100
    assert sorted(int(k) for k in by_key(broker.bootstrap_servers, dst)) == list(range(1, 101))


def test_repeated_keys_keep_the_last_row_per_key(broker, spark, kafka_env, database, tmp_path):
    """A change table repeats its unique_key: keep_last sends each key's latest row once, and the
    counts add up (rows extracted = messages + duplicates removed)."""
    timestamp = "timestamp" if database.dialect == "postgres" else "datetime(6)"
    database.execute(f"CREATE TABLE orders (change_id integer primary key, order_id integer, status varchar(20), updated_at {timestamp} not null)")
    database.execute(
        "INSERT INTO orders VALUES "
        "(1, 10, 'created', '2024-01-01 10:00:00'), (2, 11, 'created', '2024-01-01 10:05:00'), "
        "(3, 10, 'paid', '2024-01-01 11:00:00'), (4, 10, 'shipped', '2024-01-01 12:00:00'), "
        "(5, 12, 'created', '2024-01-01 12:30:00')"
    )
    dst = unique_topic("sqldup")
    create_topic(broker.bootstrap_servers, dst, 1)
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    result = run_pipeline(parse_manifest(manifest(database, dst, tmp_path, strategy, "    incremental_column: updated_at")), spark)
    assert (result.rows_extracted, result.messages_produced, result.duplicates_removed) == (5, 3, 2)
    out = consume_all(broker.bootstrap_servers, dst)
    assert sorted((r["key"], r["value"]["status"]) for r in out) == [("10", "shipped"), ("11", "created"), ("12", "created")]


@pytest.mark.parametrize("database", ["postgres"], indirect=True)
def test_large_doubles_and_reals_are_written_as_java_prints_them(broker, spark, kafka_env, database, tmp_path):
    """Doubles from 1e16 up, which Java prints in scientific notation (not always with the
    shortest digits), and a real column added later keep Spark's own text in the message."""
    database.execute("CREATE TABLE orders (order_id integer PRIMARY KEY, x double precision, updated_at timestamp NOT NULL)")
    database.execute("INSERT INTO orders VALUES (1, 1.5, '2024-01-01'), (2, 1e20, '2024-01-01'), (3, -2.5e16, '2024-01-01')")
    stamp = '"updated_at":"2024-01-01T00:00:00.000000Z"'
    expected = {b"1": '{"order_id":1,"x":1.5,' + stamp, b"2": '{"order_id":2,"x":1.0E20,' + stamp, b"3": '{"order_id":3,"x":-2.5E16,' + stamp}
    for run, extra in enumerate(("", "ALTER TABLE orders ADD COLUMN r real; UPDATE orders SET r = order_id / 4.0")):
        if extra:  # a column added last
            database.execute(extra)
            expected = {k: v + f',"r":{int(k) / 4}' for k, v in expected.items()}
        dst = unique_topic("sqlunwritten")
        create_topic(broker.bootstrap_servers, dst, 1)
        run_pipeline(parse_manifest(manifest(database, dst, tmp_path / str(run), "{mode: incremental_append, unique_key: order_id}")), spark)
        values = {r["key"]: r["value"].decode() for r in consume_raw(broker.bootstrap_servers, dst)}
        assert values == {k: v + "}" for k, v in expected.items()}
