"""PostgreSQL → Kafka throughput: plain Python loops against Spark JDBC + the engine's writer, and
the whole engine (`run_pipeline` with a `source.type: postgres` manifest) when the engine runs SQL
sources.

    python -m bench.sql2k --rows 1000000 [--json] [--num-partitions 2]

PostgreSQL: 127.0.0.1:5432, user postgres, trust auth (override with DPONE_TEST_PG_HOST/PORT/USER).
A fresh database `dpone_bench_<hex>` holds `public.orders` with N rows (the same fields as the k2k
order events) and is dropped afterwards. Phases, each to its own sink topic:

  (p)  psycopg2 server-side (named) cursor, itersize 10,000 → dict → json.dumps → produce,
       key = order_id (what a user writes by hand)
  (p2) the same loop with the JSON built by PostgreSQL (row_to_json), Python only produces
  (s)  Spark JDBC read (partitioned by order_id over --num-partitions, fetchsize 10,000) → the
       engine's message shape (shape.JSON_WRITE_OPTIONS, key = order_id) → sinks.kafka.produce
  (e)  run_pipeline: source.type postgres, incremental_merge, unique_key order_id (keep_last),
       or with --strategy append an incremental_append of the same keys (append_repeated: keyed
       by country, so every key repeats), incremental_column
       updated_at (first run: the whole table) — skipped with the reason when the engine refuses
       SQL sources
The Spark session (with /usr/share/java/postgresql.jar on spark.jars) starts before (s) and its
start is reported separately.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any

from bench.common import MB, TreeSampler, create_topic, dump_json, machine_info, rate, topic_count

PG_HOST = os.environ.get("DPONE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("DPONE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("DPONE_TEST_PG_USER", "postgres")
JDBC_JAR = "/usr/share/java/postgresql.jar"

COLUMNS = ("order_id", "customer_id", "status", "amount", "currency", "items", "channel", "country", "created_at", "note", "updated_at")

CREATE = """
CREATE TABLE public.orders (
    order_id bigint PRIMARY KEY,
    customer_id text NOT NULL,
    status text NOT NULL,
    amount numeric(12,2) NOT NULL,
    currency text NOT NULL,
    items integer NOT NULL,
    channel text NOT NULL,
    country text NOT NULL,
    created_at timestamptz NOT NULL,
    note text,
    updated_at timestamp NOT NULL
)"""

FILL = """
INSERT INTO public.orders
SELECT i,
       'c' || lpad(((i * 7919) %% 10000000)::text, 7, '0'),
       (ARRAY['created','paid','packed','shipped','delivered','cancelled'])[i %% 6 + 1],
       ((i * 37) %% 5000) + (i %% 100) / 100.0,
       'EUR',
       1 + i %% 9,
       (ARRAY['web','app','store','partner'])[i %% 4 + 1],
       (ARRAY['DE','FR','NL','PL','ES','IT','SE','AT'])[i %% 8 + 1],
       timestamptz '2026-11-01 00:00:00+00' + (i %% 86400000) * interval '1 millisecond',
       'order ' || i || ' for customer ' || ((i * 7919) %% 10000000),
       timestamp '2026-11-01 00:00:00' + (i / 1000) * interval '1 second'
FROM generate_series(0::bigint, %s - 1) AS i
"""


# --------------------------------------------------------------------------- database


def pg_connect(dbname: str = "postgres", **overrides: Any) -> Any:
    import psycopg2

    kwargs = {"host": PG_HOST, "port": PG_PORT, "user": PG_USER, "dbname": dbname, **overrides}
    return psycopg2.connect(**kwargs)


def create_database(rows: int) -> tuple[str, float]:
    """A fresh database with public.orders holding `rows` rows; returns (name, seconds)."""
    name = f"dpone_bench_{uuid.uuid4().hex[:8]}"
    admin = pg_connect()
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    started = time.perf_counter()
    try:
        fill_table(pg_connect(name), rows)
    except BaseException:
        drop_database(name)
        raise
    return name, time.perf_counter() - started


def fill_table(conn: Any, rows: int) -> None:
    with conn, conn.cursor() as cur:
        cur.execute(CREATE)
        cur.execute(FILL, (rows,))
        cur.execute("ANALYZE public.orders")
    conn.close()


def drop_database(name: str) -> None:
    admin = pg_connect()
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


# --------------------------------------------------------------------------- plain loops


def plain_loop(conn_kwargs: dict[str, Any], bootstrap: str, topic: str, server_json: bool, itersize: int = 10_000) -> dict[str, Any]:
    """Named cursor → producer; JSON built in Python (json.dumps) or by PostgreSQL (row_to_json)."""
    import psycopg2
    from confluent_kafka import Producer

    from bench.k2k import _Deliveries, engine_producer_config

    conn = psycopg2.connect(**conn_kwargs)
    producer = Producer(engine_producer_config(bootstrap))
    deliveries = _Deliveries()
    produce, poll, dumps = producer.produce, producer.poll, json.dumps
    started = time.perf_counter()
    n = 0
    with conn:
        cur = conn.cursor(name=f"bench_{uuid.uuid4().hex[:6]}")  # server-side cursor
        cur.itersize = itersize
        if server_json:
            cur.execute("SELECT order_id::text, row_to_json(o)::text FROM public.orders o")
            for key, value in cur:
                while True:
                    try:
                        produce(topic, value.encode(), key.encode(), on_delivery=deliveries)
                        break
                    except BufferError:
                        poll(0.05)
                n += 1
                if n % 10_000 == 0:
                    poll(0)
        else:
            cur.execute(f"SELECT {', '.join(COLUMNS)} FROM public.orders")
            names = COLUMNS
            for row in cur:
                record = dict(zip(names, row, strict=True))
                value = dumps(record, default=str).encode()
                while True:
                    try:
                        produce(topic, value, str(record["order_id"]).encode(), on_delivery=deliveries)
                        break
                    except BufferError:
                        poll(0.05)
                n += 1
                if n % 10_000 == 0:
                    poll(0)
        cur.close()
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    conn.close()
    return {"messages": n, "seconds": seconds, "delivered": deliveries.delivered, "failed": deliveries.failed + remaining}


# --------------------------------------------------------------------------- Spark


def start_spark_with_jdbc(conf: dict[str, Any] | None = None) -> tuple[Any, dict[str, float]]:
    from bench.k2k import start_spark

    jars = {"spark.jars": JDBC_JAR}
    return start_spark({**jars, **(conf or {})})


def spark_jdbc_to_writer(
    spark: Any,
    database: str,
    bootstrap: str,
    topic: str,
    num_partitions: int,
    rows: int,
    fetchsize: int = 10_000,
) -> dict[str, Any]:
    """JDBC read → the engine's message shape → sinks.kafka.produce (no state, gates or dedupe)."""
    from pyspark.sql import functions as F

    from bench.k2k import engine_producer_config
    from dpone_dagster.sinks.kafka import ProducerSettings, produce
    from dpone_dagster.sinks.kafka_messages import JSON_WRITE_OPTIONS

    started = time.perf_counter()
    def jdbc() -> Any:
        return (
            spark.read.format("jdbc")
            .option("url", f"jdbc:postgresql://{PG_HOST}:{PG_PORT}/{database}")
            .option("user", PG_USER)
            .option("driver", "org.postgresql.Driver")
            .option("fetchsize", str(fetchsize))
        )

    reader = jdbc()
    if num_partitions > 1:
        bounds = jdbc().option("query", "SELECT min(order_id) AS lo, max(order_id) AS hi FROM public.orders").load().first()
        reader = (
            reader.option("dbtable", "public.orders")
            .option("partitionColumn", "order_id")
            .option("lowerBound", str(bounds["lo"]))
            .option("upperBound", str(bounds["hi"] + 1))
            .option("numPartitions", str(num_partitions))
        )
    else:
        reader = reader.option("dbtable", "public.orders")
    df = reader.load()
    payload = [c for c in df.columns]
    messages = df.select(
        F.col("order_id").cast("string").cast("binary").alias("key"),
        F.to_json(F.struct(*payload), JSON_WRITE_OPTIONS).cast("binary").alias("value"),
        F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
        F.lit(-1).cast("int").alias("partition"),
        F.lit("upsert").alias("__dpone__op"),
    )
    stats = produce(messages, ProducerSettings(topic, tuple(engine_producer_config(bootstrap).items())), rows)
    seconds = time.perf_counter() - started
    return {"messages": stats.delivered + stats.failed, "seconds": seconds, "delivered": stats.delivered, "failed": stats.failed}


ENGINE_MANIFEST = """
name: bench_sql2k
source:
  type: postgres
  connection_id: bench_pg
  connection_type: params
  params: {{host: "{host}", port: {port}, user: "{user}", database: "{database}"}}
  table: {{schema: public, name: orders}}
  options:
    incremental_column: updated_at
    batch_size: 10000
    partition_column: order_id
    num_partitions: {num_partitions}
sink:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}"}}
  topic: {topic}
  strategy: {strategy}
  options:
    message_format: json
    envelope: flat
state: {{type: local, path: "{state}"}}
"""


# The sink strategies the engine phase may run: seed 002's merge, or an append of the same unique keys.
STRATEGIES = {
    "merge": "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}",
    "append": "{mode: incremental_append, unique_key: order_id}",
    # Every row's key repeats (8 countries): the whole batch is produced in source order per key.
    "append_repeated": "{mode: incremental_append, unique_key: country}",
}


def engine_run(spark: Any, database: str, bootstrap: str, topic: str, num_partitions: int, strategy: str = "merge") -> dict[str, Any]:
    """run_pipeline with a postgres source; {'skipped': reason} when the engine refuses it."""
    from dpone_dagster.engine.run import RunRequest, run_pipeline
    from dpone_dagster.errors import ConfigError
    from dpone_dagster.manifest import parse_manifest

    with tempfile.TemporaryDirectory(prefix="dpone-bench-sql-") as state:
        text = ENGINE_MANIFEST.format(
            host=PG_HOST, port=PG_PORT, user=PG_USER, database=database, num_partitions=num_partitions,
            bootstrap=bootstrap, topic=topic, state=state, strategy=STRATEGIES[strategy],
        )
        try:
            manifest = parse_manifest(text)
        except Exception as exc:  # noqa: BLE001 - the manifest model may not take SQL sources yet
            return {"skipped": f"manifest refused: {exc}"}
        started = time.perf_counter()
        try:
            result = run_pipeline(manifest, spark, RunRequest())
        except ConfigError as exc:
            return {"skipped": f"engine refused the SQL source: {exc}"}
        seconds = time.perf_counter() - started
    return {
        "messages": result.rows_extracted,
        "seconds": seconds,
        "delivered": result.messages_produced,
        "failed": result.rows_extracted - result.duplicates_removed - result.messages_produced,
        "stage_seconds": result.timings,
        "notes": result.notes,
        "path": result.execution_path,
    }


# --------------------------------------------------------------------------- the benchmark


def _phase(sampler: TreeSampler | None, name: str) -> Any:
    from contextlib import nullcontext

    return sampler.phase(name) if sampler is not None else nullcontext(None)


def _finish(out: dict[str, Any], peaks: Any, bootstrap: str, topic: str) -> dict[str, Any]:
    if "skipped" in out:
        return out
    out["seconds"] = round(out["seconds"], 3)
    out["msgs_per_s"] = round(rate(out["messages"], out["seconds"]))
    out["in_topic"] = topic_count(bootstrap, topic)
    if peaks is not None:
        out["memory_mb"] = peaks.as_mb()
        out["cpu"] = peaks.cpu()
    return out


def run_bench(
    bootstrap: str,
    rows: int,
    spark: Any = None,
    database: str | None = None,
    sampler: TreeSampler | None = None,
    num_partitions: int = 2,
    topic_partitions: int = 6,
    only: tuple[str, ...] = ("p", "p2", "s", "e"),
    spark_conf: dict[str, Any] | None = None,
    log: Any = None,
    strategy: str = "merge",
) -> dict[str, Any]:
    """Time the phases against `database` (a fresh one with `rows` rows when None).
    A `spark` session passed in must have the PostgreSQL JDBC jar on spark.jars."""
    say = log or (lambda _m: None)
    report: dict[str, Any] = {"bench": "sql2k", "rows": rows, "num_partitions": num_partitions, "strategy": strategy, "phases": {}}
    created = database is None
    if database is None:
        say(f"creating a database with {rows} rows")
        database, fill_s = create_database(rows)
        report["fill_seconds"] = round(fill_s, 2)
    try:
        conn_kwargs = {"host": PG_HOST, "port": PG_PORT, "user": PG_USER, "dbname": database}
        for key, server_json in (("p", False), ("p2", True)):
            if key in only:
                say(f"({key}) psycopg2 → producer" + (" (row_to_json)" if server_json else ""))
                topic = f"bench_sql_{key}_{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, topic_partitions)
                with _phase(sampler, key) as peaks:
                    out = plain_loop(conn_kwargs, bootstrap, topic, server_json)
                report["phases"][key] = _finish(out, peaks, bootstrap, topic)
        if "s" in only or "e" in only:
            if spark is None:
                say("starting Spark (with the PostgreSQL JDBC jar)")
                with _phase(sampler, "spark_start") as peaks:
                    spark, start = start_spark_with_jdbc(spark_conf)
                report["spark_start"] = start
            if "s" in only:
                say("(s) Spark JDBC → sinks.kafka.produce")
                topic = f"bench_sql_s_{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, topic_partitions)
                with _phase(sampler, "s") as peaks:
                    out = spark_jdbc_to_writer(spark, database, bootstrap, topic, num_partitions, rows)
                report["phases"]["s"] = _finish(out, peaks, bootstrap, topic)
            if "e" in only:
                say("(e) run_pipeline, source.type postgres")
                topic = f"bench_sql_e_{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, topic_partitions)
                with _phase(sampler, "e") as peaks:
                    out = engine_run(spark, database, bootstrap, topic, num_partitions, strategy)
                report["phases"]["e"] = _finish(out, peaks, bootstrap, topic)
    finally:
        if created:
            drop_database(database)
    phases = report["phases"]

    def ratio(x: str, y: str) -> float | None:
        if phases.get(x, {}).get("msgs_per_s") and phases.get(y, {}).get("msgs_per_s"):
            return round(phases[x]["msgs_per_s"] / phases[y]["msgs_per_s"], 3)
        return None

    report["ratios"] = {
        "s/p": ratio("s", "p"),
        "e/p": ratio("e", "p"),
        "s/p2": ratio("s", "p2"),
        "e/p2": ratio("e", "p2"),
    }
    return report


def print_report(report: dict[str, Any], out: Any = sys.stdout) -> None:
    w = out.write
    w(f"sql2k: {report['rows']} rows, JDBC partitions {report['num_partitions']}\n")
    if "fill_seconds" in report:
        w(f"  table fill (generate_series): {report['fill_seconds']} s\n")
    if report.get("spark_start"):
        w(f"  spark start: session {report['spark_start']['session_s']} s + first job {report['spark_start']['first_job_s']} s (not in s/e)\n")
    labels = {
        "p": "(p) psycopg2+json.dumps",
        "p2": "(p2) psycopg2+row_to_json",
        "s": "(s) JDBC+writer",
        "e": "(e) run_pipeline",
    }
    w(f"  {'phase':<27}{'msgs/s':>9}{'seconds':>9}{'delivered':>10}{'in topic':>10}{'CPU s':>8}{'tree MB':>9}\n")
    for key, phase in report["phases"].items():
        if "skipped" in phase:
            w(f"  {labels.get(key, key):<27} skipped: {phase['skipped']}\n")
            continue
        cpu = phase.get("cpu", {})
        mem = phase.get("memory_mb", {})
        w(
            f"  {labels.get(key, key):<27}{phase['msgs_per_s']:>9}{phase['seconds']:>9}{phase['delivered']:>10}"
            f"{str(phase['in_topic']):>10}{cpu.get('tree_cpu_s', '-'):>8}{mem.get('tree_rss', '-'):>9}\n"
        )
        if phase.get("stage_seconds"):
            w(f"      {phase.get('path', '?')} path, stages (s): {phase['stage_seconds']}\n")
    w(f"  ratios: {report['ratios']}\n")


def main(argv: list[str] | None = None) -> int:
    from bench.k2k import stdout_to_stderr

    p = argparse.ArgumentParser(prog="python -m bench.sql2k", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--num-partitions", type=int, default=2, help="JDBC read partitions (by order_id range)")
    p.add_argument("--topic-partitions", type=int, default=6)
    p.add_argument("--only", default="p,p2,s,e")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V")
    p.add_argument("--strategy", choices=sorted(STRATEGIES), default="merge", help="the engine phase's sink strategy")
    args = p.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))

    from dpone_dagster.embedded_broker import EmbeddedBroker

    with stdout_to_stderr(args.json), EmbeddedBroker() as broker:
        assert broker._process is not None
        sampler = TreeSampler(exclude={broker._process.pid}).start()
        try:
            report = run_bench(
                broker.bootstrap_servers,
                args.rows,
                sampler=sampler,
                num_partitions=args.num_partitions,
                topic_partitions=args.topic_partitions,
                only=tuple(args.only.split(",")),
                spark_conf=dict(item.split("=", 1) for item in args.spark_conf) or None,
                log=log,
                strategy=args.strategy,
            )
        finally:
            sampler.stop()
    from bench.common import hwm_bytes

    report["driver_hwm_mb"] = round(hwm_bytes() / MB, 1)
    report["machine"] = machine_info()
    if args.json:
        print(dump_json(report))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
