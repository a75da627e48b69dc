"""The direct path of a SQL source (engine/direct_sql.py): the rows go from Spark's JDBC read to
Python tasks that write and keep the messages, the driver judges the batch, the tasks produce.
Against the real PostgreSQL, the real broker and a real Spark session: the same messages as the
Spark SQL path (its outcomes stored under tests/golden/spark_sql/), the batches only that path
decides go there, and a fault mid-delivery moves no watermark and loses nothing."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from conftest import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    consume_raw,
    create_topic,
    freeze_once_delivering,
    fresh_pg_database,
    kill_python_workers,
    once_delivering,
    unique_topic,
)
from spark_sql_golden import any_sample, on_both_paths, without_timestamp

from dpone_dagster.direct import sql_task
from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.engine import sql_kept
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import DataRefused, DponeError, RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state.open import open_manifest_state_store


@pytest.fixture(params=["on_host", "in_spark"])
def kept_in(request: Any, monkeypatch: Any) -> Iterator[str]:
    """Where the direct path keeps a batch's messages: files on this host (a local session's way),
    or a local checkpoint in Spark's storage (a cluster's way, chosen here in the local session:
    the same Spark code runs; tests/test_cluster.py runs it on a standalone cluster). The test
    fails if the store asked for was not the one that scanned."""
    scans: list[str] = []
    if request.param == "in_spark":
        monkeypatch.setattr(sql_kept, "one_host", lambda spark: False)
    for store in (sql_kept.KeptOnHost, sql_kept.KeptInSpark):
        scan = store.scan
        monkeypatch.setattr(store, "scan", lambda self, *args, _scan=scan, **kwargs: scans.append(type(self).__name__) or _scan(self, *args, **kwargs))
    yield request.param
    assert scans, "the direct path scanned nothing"
    assert set(scans) == {"KeptInSpark" if request.param == "in_spark" else "KeptOnHost"}, scans


@pytest.fixture
def db(monkeypatch) -> Any:
    with fresh_pg_database("dpone_sqldirect") as database:
        for key, value in {"SQL_DB_HOST": PG_HOST, "SQL_DB_PORT": str(PG_PORT), "SQL_DB_USER": PG_USER, "SQL_DB_DATABASE": database["dbname"]}.items():
            monkeypatch.setenv(key, value)
        yield database


def execute(db: dict[str, Any], *statements: str) -> None:
    conn = psycopg2.connect(**db)
    conn.autocommit = True
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    conn.close()


def create_orders(db: dict[str, Any], rows: int = 300, extra: str = "") -> None:
    """Typed rows, nulls included; two rows per customer."""
    execute(
        db,
        "CREATE TABLE orders (order_id bigint PRIMARY KEY, customer text, amount numeric(12,2), fine numeric(20,10), "
        "rate double precision, placed_at timestamp, placed_on date, flag boolean, blob bytea, note text, ratio real, "
        f"updated_at timestamp NOT NULL{extra})",
        "INSERT INTO orders SELECT i, 'c' || (i / 2), CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 13.37)::numeric(12,2) END, "
        "CASE WHEN i % 3 = 0 THEN 0 ELSE i * 0.0000001 END, i / 7.0, timestamp '2026-01-01' + i * interval '61.5 second', "
        "date '2026-01-01' + i, i % 2 = 0, decode(lpad(to_hex(i), 4, '0'), 'hex'), 'n' || i || ' é\"q', "
        "CASE WHEN i % 13 = 0 THEN NULL ELSE i / 7.0 - 20 END, "
        f"timestamp '2026-01-02' + i * interval '1 second' FROM generate_series(1, {rows}) AS i",
    )


def manifest_text(dst: str, state: Path, strategy: str, sink_options: str = "{}", quality: str = "") -> str:
    return f"""
name: sqldirect
source:
  type: postgres
  connection_id: sql_db
  table: {{schema: public, name: orders}}
  options: {{incremental_column: updated_at, batch_size: 100}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
  options: {sink_options}
state: {{type: local, path: "{state}"}}
{quality}
"""


def run_both(
    bs: str, spark: Any, tmp_path: Path, monkeypatch: Any, strategy: str, sink_options: str = "{}", quality: str = ""
) -> list[tuple[Any, list[dict]]]:
    """The same manifest on each path, each into its own target: [(result, records)] direct first."""

    def run(path: str, dst: str) -> tuple[Any, list[dict]]:
        create_topic(bs, dst, 2)
        text = manifest_text(dst, tmp_path / path, strategy, sink_options, quality)
        result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id="sqldirect"))
        return result, [without_timestamp(r) for r in consume_raw(bs, dst, expected=result.messages_produced)]

    both = on_both_paths(monkeypatch, tmp_path, run, {"dst": "sqld"})
    return [both["direct"], both["spark_sql"]]


def messages(records: list[dict]) -> Counter:
    return Counter((r["partition"] if r["key"] is not None else None, r["key"], r["value"], tuple(r["headers"] or ())) for r in records)


SINKS = {
    "flat_merge": ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", "{}"),
    "envelope_static_headers": ("{mode: incremental_append, unique_key: order_id}", "{envelope: dpone, headers: {static: {team: dwh, env: test}}}"),
    "hash_row": ("{mode: incremental_append}", "{key: {mode: hash_row}}"),
    "null_key": ("{mode: incremental_append}", '{key: {mode: "null"}}'),
    "composite_key": ("{mode: incremental_append, unique_key: [customer, placed_on]}", "{}"),
    "composite_key_with_a_real": ("{mode: incremental_append, unique_key: [customer, ratio]}", "{}"),
    "timestamp_key": ("{mode: incremental_append, unique_key: placed_at}", "{}"),
    "full_refresh": ("{mode: full_refresh, unique_key: order_id}", "{}"),
}


@pytest.mark.parametrize("sink", list(SINKS))
def test_the_direct_path_writes_what_the_spark_sql_path_writes(broker, spark, kafka_env, db, tmp_path, monkeypatch, sink, kept_in):
    """Keys of every mode, the dpone envelope, static headers, decimals of both notations,
    timestamps, dates, binary and doubles: byte for byte the Spark SQL path's messages."""
    create_orders(db)
    strategy, options = SINKS[sink]
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy, options)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.rows_extracted == sql.rows_extracted == 300
    assert direct.messages_produced == len(direct_records) == 300
    assert messages(direct_records) == messages(sql_records)
    assert not kept_directory_exists(spark, direct.run_id), "the kept files outlived the run"


@pytest.mark.parametrize(
    ("unique_key", "key_format"),
    [("order_id", "string"), ("[customer, placed_on]", "avro")],
)
def test_an_avro_sink_registers_once_every_gate_passed(broker, spark, kafka_env, db, tmp_path, monkeypatch, unique_key, key_format):
    """Seed 002's route into seed 001's sink: Avro through the registry, each value framed with
    the id registered after the gates; with key.format avro, each key the key columns' record (a
    text and a date column) under the `-key` subject's schema, framed with its id. Past the
    frames, the Spark SQL path's keys and values."""
    import uuid

    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    create_orders(db)
    options = f"{{message_format: avro, key: {{format: {key_format}}}, schema_registry: {{enabled: true}}}}"
    (direct, direct_records), (sql, sql_records) = run_both(
        broker.bootstrap_servers, spark, tmp_path, monkeypatch, f"{{mode: incremental_append, unique_key: {unique_key}}}", options
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    key_frame = 5 if key_format == "avro" else 0
    for result, records in ((direct, direct_records), (sql, sql_records)):
        assert {r["value"][:5] for r in records} == {b"\x00" + result.schema_evolution["schema_id"].to_bytes(4, "big")}
        if key_frame:
            assert {r["key"][:5] for r in records} == {b"\x00" + result.schema_evolution["key_subject_schema_id"].to_bytes(4, "big")}

    def unframed(records: list[dict]) -> Counter:  # each target's subjects are its own
        return Counter((r["key"][key_frame:], r["value"][5:]) for r in records)

    assert len(direct_records) == 300 and unframed(direct_records) == unframed(sql_records)


@pytest.mark.parametrize("strategy", ["{mode: incremental_append, unique_key: [customer, rate]}", "{mode: incremental_merge, unique_key: rate, duplicate_policy: keep_last}"])
def test_nan_and_infinities_are_written_as_the_spark_sql_path_writes_them(broker, spark, kafka_env, db, tmp_path, monkeypatch, strategy):
    """double precision and real columns holding NaN and the infinities: the same keys and
    values on both paths (JSON strings in values, Spark's text in keys), on the direct path."""
    create_orders(db)
    execute(
        db,
        "UPDATE orders SET rate = 'NaN' WHERE order_id % 5 = 0",
        "UPDATE orders SET rate = 'Infinity', ratio = '-Infinity' WHERE order_id % 7 = 0",
        "UPDATE orders SET rate = '-Infinity', ratio = 'NaN' WHERE order_id % 9 = 0",
    )
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.messages_produced == len(direct_records) == len(sql_records)
    assert messages(direct_records) == messages(sql_records)
    assert any(b'"rate":"NaN"' in r["value"] for r in direct_records)


def test_numbers_java_prints_otherwise_than_the_shortest_are_printed_by_spark(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Doubles from 1e16, reals from 1e7 and powers of two below 1e-3, which Java 17 may print
    with more digits than the shortest: the scan meets them, Spark prints them on the driver and
    the batch is scanned again with their texts, on the direct path; the messages are the Spark
    SQL path's and nothing of the first scan is left behind."""
    create_orders(db)
    execute(db, "UPDATE orders SET rate = 1e20 WHERE order_id = 7", "UPDATE orders SET rate = power(2::float8, -20) WHERE order_id = 8", "UPDATE orders SET ratio = 12345678 WHERE order_id = 9")
    (direct, direct_records), (sql, sql_records) = run_both(
        broker.bootstrap_servers, spark, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}"
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert not kept_directory_exists(spark, direct.run_id), "a scan's kept files outlived it"
    assert len(direct_records) == 300 and messages(direct_records) == messages(sql_records)
    values = {json.loads(r["value"])["order_id"]: r["value"] for r in direct_records}
    assert b'"rate":1.0E20' in values[7] and b'"rate":9.5367431640625E-7' in values[8] and b'"ratio":1.2345678E7' in values[9], (values[7], values[8], values[9])


@pytest.mark.parametrize(
    "strategy",
    ["{mode: incremental_append, unique_key: flag}", "{mode: incremental_merge, unique_key: [flag, placed_on], duplicate_policy: allow}"],
)
def test_keys_that_repeat_where_every_row_is_published_keep_their_source_order(broker, spark, kafka_env, db, tmp_path, monkeypatch, strategy, kept_in):
    """An append, or a merge under duplicate_policy: allow, whose keys repeat across the three
    partitions of the read (flag: two keys of 150 rows each; with placed_on, ten rows share a day):
    on the direct path every row is published and each key's messages reach the topic in source
    order (the watermark, updated_at), as the Spark SQL path orders them."""
    create_orders(db)
    if "placed_on" in strategy:
        execute(db, "UPDATE orders SET placed_on = date '2026-01-01' + (order_id % 15)::int")
    partitioned = "{incremental_column: updated_at, partition_column: order_id, num_partitions: 3, lower_bound: 1, upper_bound: 300}"

    def one(path: str, dst: str) -> list[dict]:
        create_topic(broker.bootstrap_servers, dst, 2)
        text = manifest_text(dst, tmp_path / path, strategy).replace("{incremental_column: updated_at, batch_size: 100}", partitioned)
        result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id=f"sqld-order-{path}"))
        assert result.execution_path == path, result.notes
        assert not kept_directory_exists(spark, result.run_id)
        return [without_timestamp(r) for r in consume_raw(broker.bootstrap_servers, dst)]

    results = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_order"})
    direct, sql = results["direct"], results["spark_sql"]
    assert len(direct) == 300 and messages(direct) == messages(sql)

    def per_key(records: list[dict]) -> dict[bytes, list[int]]:
        """Each key's order ids, in the order its partition holds them."""
        out: dict[bytes, list[int]] = {}
        for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
            out.setdefault(r["key"], []).append(json.loads(r["value"])["order_id"])
        return out

    assert all(ids == sorted(ids) for ids in per_key(direct).values())
    assert per_key(direct) == per_key(sql)
    assert max(len(ids) for ids in per_key(direct).values()) > 1


# Rows the sink cannot take: (strategy, sink options, the table's change, the refusal both paths give,
# whether the direct path decides it).
REFUSED_ROWS = {
    # amount is null in every 11th row: 27 rows without their key.
    "keyless_rows": ("{mode: incremental_append, unique_key: amount}", "{}", "", (DataRefused, r"^27 record\(s\) have no unique key; nothing")),
    # Those rows are deletes: no tombstone can be keyed.
    "keyless_tombstones": (
        "{mode: incremental_merge, unique_key: amount}",
        "{deletes: {enabled: true, tombstone: true}}",
        "UPDATE orders SET __dpone__op = CASE WHEN amount IS NULL THEN 'delete' ELSE 'upsert' END",
        (RunFailed, r"^27 delete\(s\) have no key, so no tombstone")
    ),
    # Six rows of 5,000 bytes over a limit of 4,000.
    "oversized": (
        "{mode: incremental_append, unique_key: order_id}",
        "{delivery: {producer_config: {message.max.bytes: 4000}}}",
        "UPDATE orders SET note = repeat('x', 5000) WHERE order_id % 50 = 0",
        (DataRefused, r"^6 message\(s\) exceed message.max.bytes 4000; nothing .* sink.options.delivery.producer_config")
    ),
    # keep_last leaves five of them out (each the earlier order of its customer): both paths count
    # only the one published.
    "oversized_left_out": (
        "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}",
        "{delivery: {producer_config: {message.max.bytes: 4000}}}",
        "UPDATE orders SET note = repeat('x', 5000) WHERE order_id % 50 = 0",
        (DataRefused, r"^1 message\(s\) exceed message.max.bytes 4000")
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_ROWS))
def test_rows_the_sink_cannot_take_refuse_the_batch_as_on_the_spark_sql_path(broker, spark, kafka_env, db, tmp_path, monkeypatch, case):
    """Rows without their key, deletes without a key for their tombstone, messages over
    message.max.bytes: a SQL source has no bad-record policy, so the batch is refused with the
    Spark SQL path's error, on the direct path itself; nothing is produced, the watermark stays and
    no kept file outlives the run."""
    from dpone_dagster.engine import run as run_module

    strategy, options, change, (error, refusal) = REFUSED_ROWS[case]
    create_orders(db, extra=", __dpone__op text")
    if change:
        execute(db, change)

    def one(path: str, dst: str) -> str:
        create_topic(broker.bootstrap_servers, dst, 2)
        m = parse_manifest(manifest_text(dst, tmp_path / path, strategy, options))
        with monkeypatch.context() as patched, pytest.raises(error, match=refusal) as refused:
            if path == "direct":
                patched.setattr(run_module, "shape_messages", lambda *a, **k: pytest.fail("the Spark SQL path shaped the batch"))
            run_pipeline(m, spark, RunRequest(run_id=f"sqld-{case}-{path}"))
        assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
        assert stored_watermark(m) is None
        assert not kept_directory_exists(spark, f"sqld-{case}-{path}")
        return str(refused.value)

    failures = on_both_paths(monkeypatch, tmp_path, one, {"dst": f"sqld_{case.replace(' ', '_')}"})
    assert failures["direct"] == failures["spark_sql"]


@pytest.mark.parametrize("settled_by", ["driver", "spark"])
@pytest.mark.parametrize("last_order_too", [False, True])
def test_messages_over_the_limit_that_keep_last_leaves_out_are_not_counted(
    broker, spark, kafka_env, db, tmp_path, monkeypatch, settled_by, last_order_too, kept_in
):
    """Orders of 5,000 bytes over a limit of 4,000, each the earlier order of its customer:
    keep_last leaves them all out, so the batch is published, on the direct path, with the Spark
    SQL path's messages, whether the driver or Spark settles the keys. The last order has no later
    one: made that large too, it is the one message both paths refuse the batch for."""
    from dpone_dagster.engine import direct_sql
    from dpone_dagster.engine import run as run_module

    create_orders(db)
    execute(db, f"UPDATE orders SET note = repeat('x', 5000) WHERE order_id % 50 = 0 {'' if last_order_too else 'AND order_id < 300'}")
    if settled_by == "spark":
        monkeypatch.setattr(direct_sql, "MAX_HASHED_ROWS", 100)
    strategy = "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}"
    options = "{delivery: {producer_config: {message.max.bytes: 4000}}}"
    if last_order_too:
        dst = unique_topic("sqld_over")
        create_topic(broker.bootstrap_servers, dst, 2)
        monkeypatch.setattr(run_module, "shape_messages", lambda *a, **k: pytest.fail("the Spark SQL path shaped the batch"))
        with pytest.raises(DataRefused, match=r"^1 message\(s\) exceed message.max.bytes 4000"):
            run_pipeline(parse_manifest(manifest_text(dst, tmp_path, strategy, options)), spark, RunRequest(run_id="sqld-over"))
        assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
        return
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy, options)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.messages_produced == len(direct_records) == 151
    assert messages(direct_records) == messages(sql_records)
    assert not any(len(r["value"]) > 4000 for r in direct_records)


def test_more_messages_over_the_limit_than_the_driver_lists_go_to_the_spark_sql_path(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Past the oversized messages whose rows the driver lists (the bound lowered to 2), it cannot
    tell those keep_last leaves out: the batch goes to the Spark SQL path, which publishes it,
    every oversized order being its customer's earlier one."""
    from dpone_dagster.engine import direct_sql

    create_orders(db)
    execute(db, "UPDATE orders SET note = repeat('x', 5000) WHERE order_id % 50 = 0 AND order_id < 300")
    monkeypatch.setattr(direct_sql, "MAX_OVERSIZED_LISTED", 2)
    dst = unique_topic("sqld_over_listed")
    create_topic(broker.bootstrap_servers, dst, 2)
    strategy = "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}"
    text = manifest_text(dst, tmp_path, strategy, "{delivery: {producer_config: {message.max.bytes: 4000}}}")
    result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id="sqld-over-listed"))
    assert result.execution_path == "spark_sql" and any("more than 2 messages over message.max.bytes" in n for n in result.notes), result.notes
    records = consume_raw(broker.bootstrap_servers, dst)
    assert result.messages_produced == len(records) == 151 and not any(len(r["value"]) > 4000 for r in records)
    assert not kept_directory_exists(spark, result.run_id)


@pytest.mark.parametrize(("mode", "policy"), [("incremental_merge", "keep_last"), ("incremental_merge", "keep_first"), ("full_refresh", "keep_last")])
def test_repeated_keys_are_settled_on_the_direct_path(broker, spark, kafka_env, db, tmp_path, monkeypatch, mode, policy, kept_in):
    """Customer c<i/2> orders twice: keep_last keeps the later row of each customer by the
    watermark (updated_at), keep_first the earlier, the Spark SQL path's messages exactly; the
    rows left out are never produced. A full refresh reads no watermark: rows of one key tie, and
    either path keeps any one of them, one per key."""
    create_orders(db)
    strategy = f"{{mode: {mode}, unique_key: customer, duplicate_policy: {policy}}}"
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.duplicates_removed == sql.duplicates_removed == 149
    assert direct.messages_produced == len(direct_records) == 151
    if mode == "full_refresh":
        assert Counter(r["key"] for r in direct_records) == Counter(r["key"] for r in sql_records)
        assert len({r["key"] for r in direct_records}) == 151
        return
    assert messages(direct_records) == messages(sql_records)
    kept = {r["key"].decode(): r["value"] for r in direct_records}
    assert (b'"order_id":5,' in kept["c2"]) == (policy == "keep_last")
    assert (b'"order_id":4,' in kept["c2"]) == (policy == "keep_first")
    assert not kept_directory_exists(spark, direct.run_id)


def test_duplicate_policy_fail_refuses_repeated_keys_on_the_direct_path(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Customer c<i/2> orders twice: duplicate_policy: fail refuses the batch on the direct path
    itself (the Spark SQL path's de-duplication is never reached), with the Spark SQL path's
    error; nothing is produced and the watermark stays. Unique keys under fail are produced."""
    from dpone_dagster.sinks import kafka_messages

    create_orders(db)

    def one(path: str, dst: str) -> str:
        create_topic(broker.bootstrap_servers, dst, 2)
        m = parse_manifest(manifest_text(dst, tmp_path / path, "{mode: incremental_merge, unique_key: customer, duplicate_policy: fail}"))
        with monkeypatch.context() as patched, pytest.raises(RunFailed, match="duplicate_policy: fail") as refused:
            if path == "direct":
                patched.setattr(kafka_messages, "duplicate_keys", lambda *a, **k: pytest.fail("the Spark SQL path judged the keys"))
            run_pipeline(m, spark, RunRequest(run_id=f"sqld-fail-{path}"))
        assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
        assert stored_watermark(m) is None
        assert not kept_directory_exists(spark, f"sqld-fail-{path}")
        return re.sub(r"\(e\.g\. \[.*?\]\)", "(e.g. ...)", str(refused.value))  # Spark samples any ten keys

    failures = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_fail"})
    assert failures["direct"] == failures["spark_sql"] and "149 key(s)" in failures["direct"]

    (direct, direct_records), (sql, sql_records) = run_both(
        broker.bootstrap_servers, spark, tmp_path / "unique", monkeypatch, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: fail}"
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 300 and messages(direct_records) == messages(sql_records)


# Batches past what the driver settles (the bound lowered to this table's size): the bound, the
# strategy, and whether the read is in three partitions (keys that repeat across them).
PAST_THE_DRIVER = {
    "keep_last_unhashed": ("MAX_HASHED_ROWS", 100, "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}", False),
    "keep_first_candidates": ("MAX_CANDIDATES", 10, "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_first}", False),
    "append_listed": ("MAX_LISTED", 10, "{mode: incremental_append, unique_key: flag}", True),
    "allow_unhashed": ("MAX_HASHED_ROWS", 100, "{mode: incremental_merge, unique_key: [flag, placed_on], duplicate_policy: allow}", True),
    "keep_last_task_hashes": ("MAX_TASK_HASHES", 50, "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}", True),
    # No key repeats: Spark counts them and the kept messages are produced as they are.
    "unique_task_hashes": ("MAX_TASK_HASHES", 50, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", True),
}


@pytest.mark.parametrize("case", list(PAST_THE_DRIVER))
def test_keys_that_repeat_past_the_drivers_bounds_are_settled_by_spark(broker, spark, kafka_env, db, tmp_path, monkeypatch, case, kept_in):
    """More rows with a unique key, more keys that may repeat, or more rows of keys that repeat
    than the driver settles: the batch stays on the direct path and Spark settles the keys on the
    kept messages with the Spark SQL path's rules: keep_last / keep_first its messages exactly,
    and where every row is published, each key's messages in source order."""
    from dpone_dagster.engine import direct_sql

    bound, value, strategy, partitioned = PAST_THE_DRIVER[case]
    create_orders(db)
    if "placed_on" in strategy:
        execute(db, "UPDATE orders SET placed_on = date '2026-01-01' + (order_id % 15)::int")
    monkeypatch.setattr(direct_sql, bound, value)
    settled = []
    settle = direct_sql._settle_in_spark
    monkeypatch.setattr(direct_sql, "_settle_in_spark", lambda *args: settled.append(args[-2]) or settle(*args))
    read = "{incremental_column: updated_at, partition_column: order_id, num_partitions: 3, lower_bound: 1, upper_bound: 300}" if partitioned else None

    def one(path: str, dst: str) -> tuple[Any, list[dict]]:
        create_topic(broker.bootstrap_servers, dst, 2)
        text = manifest_text(dst, tmp_path / path, strategy)
        text = text.replace("{incremental_column: updated_at, batch_size: 100}", read) if read else text
        result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id=f"sqld-past-{path}"))
        assert result.execution_path == path, result.notes
        return result, sorted((without_timestamp(r) for r in consume_raw(broker.bootstrap_servers, dst)), key=lambda r: (r["partition"], r["offset"]))

    results = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_past"})
    why = {"MAX_HASHED_ROWS": "keyed rows", "MAX_CANDIDATES": "keys that may repeat", "MAX_LISTED": "rows of keys that may repeat", "MAX_TASK_HASHES": "keyed rows in one task"}[bound]
    assert settled == [f"more than {value:,} {why}"], settled
    (direct, direct_records), (sql, sql_records) = results["direct"], results["spark_sql"]
    assert direct.duplicates_removed == sql.duplicates_removed == (149 if "keep_" in case else 0)
    assert direct.messages_produced == len(direct_records) == len(sql_records) == (151 if "keep_" in case else 300)
    assert messages(direct_records) == messages(sql_records)

    def per_key(records: list[dict]) -> dict[bytes, list[int]]:
        out: dict[bytes, list[int]] = {}
        for r in records:
            out.setdefault(r["key"], []).append(json.loads(r["value"])["order_id"])
        return out

    assert per_key(direct_records) == per_key(sql_records)
    assert all(ids == sorted(ids) for ids in per_key(direct_records).values())
    assert not kept_directory_exists(spark, direct.run_id)


def test_duplicate_policy_fail_past_the_drivers_bounds_refuses_as_the_spark_sql_path(broker, spark, kafka_env, db, tmp_path, monkeypatch, kept_in):
    """Keys that repeat under duplicate_policy: fail, past the rows the driver hashes: Spark counts
    them on the kept messages and the batch is refused with the Spark SQL path's error; nothing is
    produced and the watermark stays."""
    from dpone_dagster.engine import direct_sql

    create_orders(db)
    monkeypatch.setattr(direct_sql, "MAX_HASHED_ROWS", 100)
    settled = []
    settle = direct_sql._settle_in_spark
    monkeypatch.setattr(direct_sql, "_settle_in_spark", lambda *args: settled.append(args[-2]) or settle(*args))
    dst = unique_topic("sqld_past_fail")
    create_topic(broker.bootstrap_servers, dst, 2)
    m = parse_manifest(manifest_text(dst, tmp_path, "{mode: incremental_merge, unique_key: customer, duplicate_policy: fail}"))
    with pytest.raises(RunFailed, match=r"duplicate_policy: fail — 149 key\(s\) occur more than once"):
        run_pipeline(m, spark, RunRequest(run_id="sqld-past-fail"))
    assert settled == ["more than 100 keyed rows"], settled
    assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
    assert stored_watermark(m) is None
    assert not kept_directory_exists(spark, "sqld-past-fail")


PUBLISHED_CHECKS = {  # (checks of the rows as published, strategy, deletes skipped)
    "unique_keep_last": ("[{type: unique, columns: [customer]}]", "keep_last", False),
    # amount is null in every 11th row: keep_first and keep_last each leave some of them out.
    "not_null_keep_first": ("[{type: not_null, columns: [amount]}, {type: accepted_values, column: flag, values: [true]}]", "keep_first", False),
    "not_null_deletes_skipped": ("[{type: not_null, columns: [amount]}, {type: unique, columns: [customer]}]", "keep_last", True),
}


@pytest.mark.parametrize("settled_by", ["driver", "spark"])
@pytest.mark.parametrize("case", list(PUBLISHED_CHECKS))
def test_checks_of_the_rows_as_published_judge_the_rows_keep_last_keeps(broker, spark, kafka_env, db, tmp_path, monkeypatch, case, settled_by, kept_in):
    """Row-level checks of the rows as published, with rows keep_last / keep_first leaves out (and
    deletes skipped): the direct path judges the kept read but the rows left out, whether the
    driver or Spark settled the keys, and observes what the Spark SQL path observes."""
    from dpone_dagster.engine import direct_sql

    checks, policy, skip = PUBLISHED_CHECKS[case]
    create_orders(db, extra=", __dpone__op text" if skip else "")
    if skip:
        execute(db, "UPDATE orders SET __dpone__op = CASE WHEN order_id % 7 = 0 THEN 'delete' ELSE 'upsert' END")
    if settled_by == "spark":
        monkeypatch.setattr(direct_sql, "MAX_HASHED_ROWS", 100)
    quality = f"quality: {{mode: warn, checks: {checks}}}"  # a row-level check judges the rows as published unless told
    strategy = f"{{mode: incremental_merge, unique_key: customer, duplicate_policy: {policy}}}"
    options = "{deletes: {when_disabled: skip}}" if skip else "{}"
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy, options, quality)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    judged = [(g["phase"], g["name"], g["passed"], g["observed"]) for g in direct.gates]
    assert judged == [(g["phase"], g["name"], g["passed"], g["observed"]) for g in sql.gates]
    assert any(g["observed"] for g in direct.gates) == (case != "unique_keep_last"), judged
    assert messages(direct_records) == messages(sql_records)


@pytest.mark.parametrize("policy", ["keep_last", "keep_first"])
def test_rows_that_tie_in_source_order_are_kept_alike_by_the_driver_and_by_spark(broker, spark, kafka_env, db, tmp_path, monkeypatch, policy, kept_in):
    """A full refresh reads no watermark: the two rows of each customer tie in source order. The
    driver ranks ties by partition and row number; Spark's settlement (past the driver's bounds)
    ranks them the same way, so the same rows are published whichever settles the keys, and the
    check of the rows as published (which computes Spark's settlement again) judges those rows:
    it counts the null amounts that were produced."""
    from dpone_dagster.engine import direct_sql

    create_orders(db)
    quality = "quality: {mode: warn, checks: [{type: not_null, columns: [amount]}]}"
    strategy = f"{{mode: full_refresh, unique_key: customer, duplicate_policy: {policy}}}"
    published = {}
    for settled_by in ("driver", "spark"):
        with monkeypatch.context() as patched:
            if settled_by == "spark":
                patched.setattr(direct_sql, "MAX_HASHED_ROWS", 100)
            dst = unique_topic(f"sqld_ties_{settled_by}")
            create_topic(broker.bootstrap_servers, dst, 2)
            result = run_pipeline(parse_manifest(manifest_text(dst, tmp_path / settled_by, strategy, "{}", quality)), spark, RunRequest(run_id="sqld-ties"))
        records = consume_raw(broker.bootstrap_servers, dst)
        assert result.execution_path == "direct" and result.messages_produced == len(records) == 151, result.notes
        values = [json.loads(r["value"]) for r in records]
        nulls = sum(v["amount"] is None for v in values)
        assert [g["observed"] for g in result.gates] == [nulls], result.gates
        published[settled_by] = sorted(v["order_id"] for v in values)
    # One partition read in the table's order: the later row of a customer is read last.
    last = policy == "keep_last"
    assert published["driver"] == published["spark"] == sorted({1, 300, *(2 * k + last for k in range(1, 150))})


ROW_CHECKS = """quality:
  mode: warn
  checks:
    - {type: not_null, columns: [amount, note]}
    - {type: accepted_values, column: flag, values: [true]}
    - {type: unique, columns: [customer]}
    - {type: unique, columns: [order_id], stage: extracted}
    - {type: freshness, column: placed_at, max_age_seconds: 60}
    - {type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, min_value: 0, max_value: 2000}}
    - {type: great_expectations, expectation_type: expect_table_row_count_to_equal, kwargs: {value: 300}, stage: extracted}
"""


def test_row_checks_and_great_expectations_judge_the_rows_the_direct_path_writes(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Every row-level check type, Great Expectations included, on the SQL direct path: the
    results of the Spark SQL path on the same rows, and the run still takes the direct path."""
    create_orders(db)
    (direct, direct_records), (sql, _) = run_both(
        broker.bootstrap_servers, spark, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", quality=ROW_CHECKS
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 300

    def comparable(gate: dict) -> dict:  # a freshness age depends on the moment it ran
        gate = any_sample(gate)
        return {**gate, "observed": None, "description": None} if gate["check_type"] == "freshness" else gate

    assert [comparable(g) for g in direct.gates] == [comparable(g) for g in sql.gates]
    observed = {g["name"]: (g["passed"], g["observed"]) for g in direct.gates if g["check_type"] != "freshness"}
    # 27 null amounts (i % 11 == 0); 150 odd orders; c1..c149 twice; 137 amounts over 2,000.
    assert observed == {
        "unique_order_id_extracted": (True, 0),
        "ge_expect_table_row_count_to_equal_extracted": (True, 300),
        "not_null_amount_note": (False, 27),
        "accepted_values_flag": (False, 150),
        "unique_customer": (False, 149),
        "ge_expect_column_values_to_be_between_amount": (False, 137),
    }


@pytest.mark.parametrize(
    ("check", "failure"),
    [
        ("{type: min_rows, threshold: 1000}", "min_rows"),
        ("{type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, max_value: 2000}}", "137 unexpected"),
    ],
)
def test_a_failed_gate_produces_nothing_and_keeps_the_watermark(broker, spark, kafka_env, db, tmp_path, check, failure):
    create_orders(db)
    dst = unique_topic("sqld_gate")
    create_topic(broker.bootstrap_servers, dst, 2)
    quality = f"quality: {{checks: [{check}]}}"
    m = parse_manifest(manifest_text(dst, tmp_path, "{mode: incremental_append, unique_key: order_id}", quality=quality))
    with pytest.raises(DataRefused, match=failure):
        run_pipeline(m, spark, RunRequest(run_id="sqld-gate"))
    assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
    assert stored_watermark(m) is None
    assert not kept_directory_exists(spark, "sqld-gate")


def test_a_checks_only_run_judges_the_batch_as_the_spark_sql_path_and_registers_nothing(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Asset checks selected without their asset (publish=False) into an Avro sink: the rows are
    judged on the direct path with the gates the Spark SQL path gives (Great Expectations too);
    nothing is produced, the watermark stays, the sink's subject stays empty."""
    import uuid

    from dpone_dagster.schema.registry import registry_client

    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    create_orders(db)
    checks = (
        "[{type: min_rows, threshold: 200}, {type: unique, columns: [order_id]}, {type: not_null, columns: [amount]}, "
        "{type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, max_value: 5000}}]"
    )
    selected = frozenset({"min_rows", "unique_order_id", "ge_expect_column_values_to_be_between_amount"})

    def one(path: str, dst: str) -> tuple:
        create_topic(broker.bootstrap_servers, dst, 2)
        text = manifest_text(dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}", "{message_format: avro, schema_registry: {enabled: true}}", f"quality: {{checks: {checks}}}")
        m = parse_manifest(text)
        with pytest.raises(DataRefused, match="not_null_amount"):  # 27 null amounts
            run_pipeline(m, spark, RunRequest(checks=frozenset({"not_null_amount"}), publish=False))
        judged = run_pipeline(m, spark, RunRequest(run_id=f"sqld-checks-{path}", checks=selected, publish=False))
        assert judged.execution_path == path, judged.notes
        assert consume_raw(broker.bootstrap_servers, dst, timeout_s=5) == []
        assert stored_watermark(m) is None
        assert not [s for s in registry_client({"url": url}).get_subjects() if s.startswith(dst)]
        assert not kept_directory_exists(spark, judged.run_id)
        return ([(g["name"], g["passed"], g["observed"]) for g in judged.gates], judged.rows_extracted, judged.messages_produced)

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_checks"})
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert [(name, passed) for name, passed, _ in outcomes["direct"][0]] == [("min_rows", True), ("unique_order_id", True), ("ge_expect_column_values_to_be_between_amount", True)]
    assert outcomes["direct"][1:] == (300, 0)


def test_a_run_sweeps_what_killed_runs_left(broker, spark, kafka_env, db, tmp_path):
    """Kept files of another run untouched for STALE_SPILL_S (a driver killed mid-run) go with
    the next SQL run's scan; a recent run's stay."""
    import shutil
    import time

    from dpone_dagster.direct import spill

    create_orders(db, 20)
    root = Path(spark.sparkContext.parallelize([0], 1).map(lambda _: spill.spill_root()).collect()[0])
    stale, recent = root / f"{spill.SPILL_PREFIX}killed-sql-run", root / f"{spill.SPILL_PREFIX}live-sql-run"
    for leftover in (stale, recent):
        leftover.mkdir(parents=True, exist_ok=True)
        (leftover / "sql-other-0.arrow").write_bytes(b"kept")
    hours_ago = time.time() - spill.STALE_SPILL_S - 60
    os.utime(stale, (hours_ago, hours_ago))
    dst = unique_topic("sqld_sweep")
    create_topic(broker.bootstrap_servers, dst, 1)
    result = run_pipeline(parse_manifest(manifest_text(dst, tmp_path, "{mode: incremental_append, unique_key: order_id}")), spark)
    assert result.execution_path == "direct" and result.messages_produced == 20
    assert not stale.exists() and (recent / "sql-other-0.arrow").exists()
    shutil.rmtree(recent)


def kept_directory_exists(spark: Any, run_id: str) -> bool:
    """Whether the run's directory of kept files is there, seen from a Spark task (a Python
    worker's local directory is not the driver's)."""
    return spark.sparkContext.parallelize([run_id], 1).map(lambda r: os.path.exists(sql_task.run_directory(r))).collect()[0]


def outcome_by_key(bs: str, dst: str, rows: int) -> tuple[int, int]:
    """(lost, duplicated) of the target, whose keys are the order ids 1..rows."""
    seen = Counter(r["key"] for r in consume_raw(bs, dst, timeout_s=60))
    lost = sum(1 for i in range(1, rows + 1) if str(i).encode() not in seen)
    return lost, sum(n - 1 for n in seen.values())


def stored_watermark(m: Any) -> Any:
    store = open_manifest_state_store(m)
    try:
        return store.load_watermark(m.name)
    finally:
        store.close()


@pytest.mark.faults
def test_broker_frozen_while_the_sql_batch_is_delivered(spark, db, monkeypatch, tmp_path, fault_outcome):
    """A dedicated broker frozen (SIGSTOP) once the target holds some of a SQL batch: deliveries
    time out, the run fails and stores no watermark; resumed, the rerun delivers every row (at
    least once: duplicates only among what the failed run delivered)."""
    broker = EmbeddedBroker().start()
    frozen_at: list[float] = []
    rows = 60_000
    try:
        bs = broker.bootstrap_servers
        monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", bs)
        create_orders(db, rows)
        dst = unique_topic("sqld_frozen")
        create_topic(bs, dst, 2)
        options = "{delivery: {producer_config: {message.timeout.ms: 8000}}}"
        m = parse_manifest(manifest_text(dst, tmp_path, "{mode: incremental_merge, unique_key: order_id}", options))
        pid = broker._process.pid
        with pytest.raises(RunFailed, match=r"not delivered|timed out"):
            run_pipeline(m, spark, RunRequest(log=freeze_once_delivering(pid, bs, dst, frozen_at)))
        assert frozen_at
        os.kill(pid, signal.SIGCONT)
        assert stored_watermark(m) is None
        delivered_by_failed_run = len(consume_raw(bs, dst, timeout_s=60))
        assert delivered_by_failed_run < rows
        rerun = run_pipeline(m, spark)
        assert rerun.execution_path == "direct" and rerun.messages_produced == rows
        lost, duplicated = outcome_by_key(bs, dst, rows)
        assert lost == 0 and duplicated <= delivered_by_failed_run
        assert stored_watermark(m) is not None
    finally:
        if broker._process is not None:
            os.kill(broker._process.pid, signal.SIGCONT)
        broker.stop()
    fault_outcome(
        "SQL source on the direct path: broker frozen (SIGSTOP) mid-delivery, resumed after the run failed",
        "Deliveries time out; the run fails and stores no watermark; the rerun delivers every row",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"{rows:,} rows; {delivered_by_failed_run:,} arrived before the run gave up; duplicates after rerun {duplicated:,}",
    )


def run_killed_mid_produce(bs: str, spark: Any, db: dict[str, Any], tmp_path: Path, rows: int, strategy: str, run_id: str) -> tuple[Any, str, list[int]]:
    """A run of `rows` orders whose Python workers are killed (SIGKILL) once the target holds some:
    it fails, stores no watermark and leaves no kept file. (manifest, target, killed pids)"""
    create_orders(db, rows)
    dst = unique_topic(run_id.replace("-", "_"))
    create_topic(bs, dst, 2)
    m = parse_manifest(manifest_text(dst, tmp_path, strategy))
    killed: list[int] = []
    with pytest.raises(DponeError):
        run_pipeline(m, spark, RunRequest(run_id=run_id, log=once_delivering(bs, dst, lambda: kill_python_workers(killed))))
    assert killed, "no Python worker was found to kill"
    assert stored_watermark(m) is None
    assert not kept_directory_exists(spark, run_id)
    return m, dst, killed


@pytest.mark.faults
def test_python_workers_killed_while_the_sql_batch_is_produced(broker, spark, kafka_env, db, tmp_path, fault_outcome):
    """The Python workers producing a SQL batch's kept messages are killed (SIGKILL) once the
    target holds some: the task fails, the run fails and stores no watermark, the kept files go;
    the rerun reads the table again and delivers every row (duplicates only among what the failed
    run delivered)."""
    rows = 120_000  # the produce outlasts the kill on a loaded machine (at 60,000 it once delivered every row first)
    bs = broker.bootstrap_servers
    m, dst, killed = run_killed_mid_produce(bs, spark, db, tmp_path, rows, "{mode: incremental_merge, unique_key: order_id}", "sqld-wkill")
    delivered_by_failed_run = len(consume_raw(bs, dst, timeout_s=60))
    assert delivered_by_failed_run < rows
    rerun = run_pipeline(m, spark)
    assert rerun.execution_path == "direct" and rerun.messages_produced == rows
    lost, duplicated = outcome_by_key(bs, dst, rows)
    assert lost == 0 and duplicated <= delivered_by_failed_run
    fault_outcome(
        "SQL source on the direct path: Spark Python workers killed (SIGKILL) while the kept messages are produced",
        "The task fails, so the run fails and stores no watermark; the kept files are removed; the rerun reads the table again and delivers every row",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"{rows:,} rows; {len(killed)} worker(s) killed after {delivered_by_failed_run:,} had arrived; duplicates after rerun {duplicated:,}",
    )


@pytest.mark.faults
def test_python_workers_killed_while_a_deduplicated_sql_batch_is_produced(broker, spark, kafka_env, db, tmp_path, fault_outcome):
    """keep_last over customers who order twice, Python workers killed (SIGKILL) mid-produce: the
    failed run delivered no row keep_last leaves out, stores no watermark; the rerun delivers the
    later order of every customer (duplicates only among what the failed run delivered)."""
    rows = 120_000  # 60,001 messages: as many as the append fault above produces, so the kill lands mid-produce
    bs = broker.bootstrap_servers
    strategy = "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}"
    m, dst, _ = run_killed_mid_produce(bs, spark, db, tmp_path, rows, strategy, "sqld-dkill")

    def order_ids() -> list[tuple[bytes, int]]:
        return [(r["key"], json.loads(r["value"])["order_id"]) for r in consume_raw(bs, dst, timeout_s=60)]

    failed_run = order_ids()
    later = {f"c{i // 2}".encode(): i for i in range(1, rows + 1)}  # customer c<i/2>: its later order i
    assert 0 < len(failed_run) <= len(later)  # the kill may come after the last delivery, before the run ends
    assert all(later[key] == order for key, order in failed_run), "a row keep_last leaves out was produced"
    rerun = run_pipeline(m, spark)
    assert rerun.execution_path == "direct" and rerun.messages_produced == len(later) and rerun.duplicates_removed == rows - len(later)
    seen = Counter(key for key, _ in order_ids())
    lost = sum(1 for key in later if key not in seen)
    duplicated = sum(n - 1 for n in seen.values())
    assert lost == 0 and duplicated <= len(failed_run)
    assert all(later[key] == order for key, order in order_ids())
    fault_outcome(
        "SQL source on the direct path, keep_last: Spark Python workers killed (SIGKILL) while the kept messages are produced",
        "The failed run produced no row keep_last leaves out and stores no watermark; the rerun delivers the later row of every key",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"{rows:,} rows, {len(later):,} keys; {len(failed_run):,} arrived before the kill; duplicates after rerun {duplicated:,}",
    )


@pytest.mark.faults
def test_python_workers_killed_while_repeated_keys_are_produced_in_order(broker, spark, kafka_env, db, tmp_path, fault_outcome):
    """An append whose every customer orders twice: all 60,000 rows are produced first, in source
    order per key, by one task; its Python worker is killed (SIGKILL) mid-produce. The run fails
    and stores no watermark; the rerun delivers every row, each customer's orders in source order
    (duplicates only among what the failed run delivered)."""
    rows = 60_000
    bs = broker.bootstrap_servers
    m, dst, killed = run_killed_mid_produce(bs, spark, db, tmp_path, rows, "{mode: incremental_append, unique_key: customer}", "sqld-okill")
    failed_run = consume_raw(bs, dst, timeout_s=60)
    assert len(failed_run) < rows
    rerun = run_pipeline(m, spark)
    assert rerun.execution_path == "direct" and rerun.messages_produced == rows
    delivered = {(r["partition"], r["offset"]) for r in failed_run}
    everything = sorted(consume_raw(bs, dst, timeout_s=60), key=lambda r: (r["partition"], r["offset"]))
    seen = Counter(json.loads(r["value"])["order_id"] for r in everything)
    lost = sum(1 for i in range(1, rows + 1) if i not in seen)
    duplicated = sum(n - 1 for n in seen.values())
    by_rerun: dict[bytes, list[int]] = {}
    for r in everything:
        if (r["partition"], r["offset"]) not in delivered:
            by_rerun.setdefault(r["key"], []).append(json.loads(r["value"])["order_id"])
    assert lost == 0 and duplicated <= len(failed_run)
    assert all(ids == sorted(ids) for ids in by_rerun.values()), "the rerun produced a customer's orders out of source order"
    fault_outcome(
        "SQL source on the direct path, keys that repeat in an append: Spark Python workers killed (SIGKILL) while they are produced in source order",
        "The run fails and stores no watermark; the rerun delivers every row, each key's rows in source order",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"{rows:,} rows, {rows // 2 + 1:,} keys; {len(killed)} worker(s) killed after {len(failed_run):,} had arrived; duplicates after rerun {duplicated:,}",
    )


def test_the_listed_messages_are_produced_in_the_order_listed_a_chunk_at_a_time(broker, kafka_env, tmp_path, monkeypatch):
    """produce_listed reads the listed rows of two kept files a chunk at a time (three rows here)
    and sends them in the order listed, from one producer: a one-partition target holds exactly
    that order. In the calling process, against the real broker (no Spark task needed)."""
    import numpy as np
    import pyarrow as pa

    from dpone_dagster.direct.spill import SpillWriter
    from dpone_dagster.shape.message import MessageRule
    from dpone_dagster.sinks.kafka import ProducerSettings

    monkeypatch.setattr(sql_task, "LISTED_CHUNK", 3)
    paths = []
    for f in range(2):
        path = str(tmp_path / f"kept-{f}.arrow")
        with SpillWriter(path, sql_task.MESSAGES) as spill:
            for b in range(3):  # three batches of four rows: values f-b-r
                values = [f"{f}-{b}-{r}".encode() for r in range(4)]
                spill.write(pa.RecordBatch.from_arrays([pa.array([b"k"] * 4, pa.binary()), pa.array(values, pa.binary())], names=["key", "value"]))
        paths.append(path)
    files = np.array([1, 0, 1, 0, 0, 1, 1, 0], np.int64)
    rows = np.array([11, 0, 4, 7, 3, 0, 5, 10], np.int64)  # rows span batches, out of file order
    dst = unique_topic("sqld_listed")
    create_topic(broker.bootstrap_servers, dst, 1)
    settings = sql_task.SqlSettings(run_id="listed", pipeline="p", names=(), rule=MessageRule(key_columns=None), hashed=False, max_message_bytes=1_000_000)
    producer = ProducerSettings(dst, (("bootstrap.servers", broker.bootstrap_servers), ("acks", "all")), 30.0)
    stats = [row for batch in sql_task.produce_listed(settings, producer, paths, files, rows) for row in batch.to_pylist()]
    assert sum(s["delivered"] for s in stats) == len(rows)
    expected = [f"{f}-{r // 4}-{r % 4}".encode() for f, r in zip(files, rows, strict=True)]
    assert [r["value"] for r in sorted(consume_raw(broker.bootstrap_servers, dst), key=lambda r: r["offset"])] == expected
    assert all(os.path.exists(p) for p in paths), "the rest of the files is produced next"


def test_a_tombstone_is_measured_without_the_value_frame():
    """The size limit counts a registry frame on each key and value sent, and none on a null: a
    tombstone's value stays null on the wire (no frame), as the Spark SQL path measures it."""
    import pyarrow as pa

    from dpone_dagster.direct.outgoing import sent_size

    values = pa.array([b"abc", None], pa.binary())
    assert sent_size(values, 5).to_pylist() == [8, 0]


# An MSSQL CDC read, faked: no SQL Server can run here (no Docker; Microsoft's packages are not
# reachable), so the LSN queries get canned answers and the JDBC read of
# cdc.fn_cdc_get_all_changes_<instance> returns its rows as jTDS delivers them (LSNs as 0x text,
# datetime2 as text). Everything after the read is the real engine, broker and state store.
CDC_MIN_LSN, CDC_MAX_LSN = "0x0000002A000001F40001", "0x0000002A000002000003"
CDC_CATALOG = (("order_id", "int", 10, 0), ("amount", "money", 19, 4), ("updated_at", "datetime2", None, None))


def cdc_changes() -> list[tuple]:
    """(start_lsn, seqval, operation, order_id, amount, updated_at): keys 1-5 change more than
    once (updates, a delete last, a delete then an insert, two changes in one LSN told apart by
    seqval, a delete and an insert told apart by the operation); keys 10-69 are inserted once. Listed out of LSN order, as a read may return them."""
    lsn = lambda n: f"0x0000002A000001F5{n:04X}"  # noqa: E731
    seq = lambda n: f"0x0000002A00000100{n:04X}"  # noqa: E731
    rows = [
        (lsn(3), seq(1), 4, 1, "12.5000", "2026-01-01 00:00:03.0000000"),
        (lsn(1), seq(1), 2, 1, "10.0000", "2026-01-01 00:00:01.0000000"),
        (lsn(2), seq(1), 4, 1, "11.2500", "2026-01-01 00:00:02.0000000"),
        (lsn(1), seq(2), 2, 2, "20.0000", "2026-01-01 00:00:01.0000000"),
        (lsn(4), seq(1), 1, 2, "20.0000", "2026-01-01 00:00:01.0000000"),
        (lsn(2), seq(3), 1, 4, "40.0000", "2026-01-01 00:00:00.5000000"),
        (lsn(5), seq(1), 2, 4, "44.0000", "2026-01-01 00:00:05.0000000"),
        (lsn(6), seq(2), 4, 5, "50.5000", "2026-01-01 00:00:06.2000000"),
        (lsn(6), seq(1), 4, 5, "50.0000", "2026-01-01 00:00:06.1000000"),
        (lsn(2), seq(4), 2, 3, "30.0000", "2026-01-01 00:00:02.0000000"),
        # One statement's delete and insert of key 6 share (lsn, seqval): the operation orders them.
        (lsn(8), seq(1), 2, 6, "66.0000", "2026-01-01 00:00:08.0000000"),
        (lsn(8), seq(1), 1, 6, "60.0000", "2026-01-01 00:00:07.0000000"),
    ]
    rows += [(lsn(7), seq(k), 2, k, f"{k}.0000", "2026-01-02 00:00:00.0000000") for k in range(10, 70)]
    return rows


def fake_mssql_cdc(spark: Any, monkeypatch: Any, changes: list[tuple]) -> None:
    from decimal import Decimal

    from dpone_dagster.sources.sql import text as T
    from dpone_dagster.sources.sql.extract import SqlBatchSource
    from dpone_dagster.sources.sql.jdbc import JdbcTable

    answers = {"fn_cdc_get_min_lsn": [(CDC_MIN_LSN,)], "fn_cdc_get_max_lsn": [(CDC_MAX_LSN,)]}

    def run_query(self: Any, spark: Any, sql: str, what: str) -> list[tuple]:
        return next(rows for needle, rows in answers.items() if needle in sql)

    raw = spark.createDataFrame(
        [(s, q, o, k, Decimal(a), t) for s, q, o, k, a, t in changes],
        f"{T.CDC_START_LSN} string, {T.CDC_SEQVAL} string, {T.CDC_OPERATION} int, order_id int, amount decimal(19,4), updated_at string",
    ).repartition(3)
    monkeypatch.setattr(JdbcTable, "check_driver", lambda self, spark: None)
    monkeypatch.setattr(JdbcTable, "catalog", lambda self, spark: tuple(T.ColumnInfo(*c) for c in CDC_CATALOG))
    monkeypatch.setattr(JdbcTable, "run_query", run_query)
    monkeypatch.setattr(SqlBatchSource, "_read_jdbc", lambda self, spark, boundary: (raw, "jdbc read (canned CDC rows)", 3))
    for key, value in {"SQL_DB_HOST": "sql.invalid", "SQL_DB_USER": "sa", "SQL_DB_PASSWORD": "pw"}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("policy", ["keep_last", "allow"])
def test_an_mssql_cdc_batch_takes_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, policy, kept_in):
    """strategy: cdc over a change table read: keep_last publishes each key's last change in LSN
    (then seqval) order, a delete last as its tombstone; allow publishes every change, each key's
    in that order. The direct path writes what the Spark SQL path writes, in the same order per
    key, and stores the planned LSN as the watermark."""
    fake_mssql_cdc(spark, monkeypatch, cdc_changes())

    def one(path: str, dst: str) -> tuple[list[dict], Any]:
        create_topic(broker.bootstrap_servers, dst, 2)
        text = (
            manifest_text(dst, tmp_path / path, f"{{mode: cdc, unique_key: order_id, duplicate_policy: {policy}}}", "{deletes: {enabled: true, tombstone: true}}")
            .replace("type: postgres", "type: mssql")
            .replace("{schema: public, name: orders}", "{schema: dbo, name: orders}")
            .replace("{incremental_column: updated_at, batch_size: 100}", "{}")
        )
        manifest = parse_manifest(text)
        result = run_pipeline(manifest, spark, RunRequest(run_id=f"sqld-cdc-{path}"))
        assert result.execution_path == path, result.notes
        assert not kept_directory_exists(spark, result.run_id)
        records = sorted((without_timestamp(r) for r in consume_raw(broker.bootstrap_servers, dst)), key=lambda r: (r["partition"], r["offset"]))
        return records, open_manifest_state_store(manifest).load_watermark(manifest.name)

    both = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_cdc"})
    results, stored = {path: both[path][0] for path in both}, {path: both[path][1] for path in both}
    direct, sql = results["direct"], results["spark_sql"]
    assert messages(direct) == messages(sql)
    assert stored["direct"] == stored["spark_sql"] and stored["direct"]["value"] == CDC_MAX_LSN

    def per_key(records: list[dict]) -> dict[bytes, list[Any]]:
        out: dict[bytes, list[Any]] = {}
        for r in records:
            out.setdefault(r["key"], []).append(json.loads(r["value"])["amount"] if r["value"] is not None else None)
        return out

    assert per_key(direct) == per_key(sql)
    keyed = per_key(direct)
    if policy == "keep_last":
        assert len(direct) == 66
        assert keyed[b"1"] == [12.5] and keyed[b"2"] == [None] and keyed[b"4"] == [44.0] and keyed[b"5"] == [50.5]
        assert keyed[b"6"] == [66.0]
    else:
        assert len(direct) == 72
        assert keyed[b"6"] == [None, 66.0]
        assert keyed[b"1"] == [10.0, 11.25, 12.5] and keyed[b"2"] == [20.0, None] and keyed[b"4"] == [None, 44.0]
        assert keyed[b"5"] == [50.0, 50.5]


def test_a_cdc_batch_too_large_for_the_drivers_key_hashes_goes_to_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A CDC read is not counted when planning, so each scan task bounds the rows it scans (and the
    key hashes it sends the driver): past its share it stops, and the batch goes to the Spark SQL
    path (nothing produced first)."""
    from dpone_dagster.engine import direct_sql

    fake_mssql_cdc(spark, monkeypatch, cdc_changes())
    monkeypatch.setattr(direct_sql, "MAX_HASHED_ROWS", 30)  # 10 rows per task of the three: 72 changes exceed it
    dst = unique_topic("sqld_cdc_bound")
    create_topic(broker.bootstrap_servers, dst, 2)
    text = (
        manifest_text(dst, tmp_path, "{mode: cdc, unique_key: order_id, duplicate_policy: keep_last}", "{deletes: {enabled: true, tombstone: true}}")
        .replace("type: postgres", "type: mssql")
        .replace("{incremental_column: updated_at, batch_size: 100}", "{}")
    )
    result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id="sqld-cdc-bound"))
    assert result.execution_path == "spark_sql"
    assert any("rows in one scan task" in n for n in result.notes), result.notes
    assert not kept_directory_exists(spark, result.run_id)
    assert len(consume_raw(broker.bootstrap_servers, dst)) == 66


@pytest.mark.parametrize("strategy", ["{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}", "{mode: incremental_append, unique_key: customer}"])
def test_delete_events_without_a_key_among_keys_that_repeat_stay_on_the_direct_path(broker, spark, kafka_env, db, tmp_path, monkeypatch, strategy):
    """Delete events (the dpone envelope, no tombstones) of rows without their key, among keys
    that repeat (two orders per customer): every such event is published, as the Spark SQL path
    publishes rows without a key, and the keyed rows are settled (keep_last) or ordered (an
    append) as there: the same messages on both paths."""
    create_orders(db, extra=", __dpone__op text")
    execute(db, "UPDATE orders SET customer = NULL, __dpone__op = 'delete' WHERE order_id % 10 = 0")
    options = "{envelope: dpone, deletes: {enabled: true, tombstone: false}}"
    (direct, direct_records), (sql, sql_records) = run_both(broker.bootstrap_servers, spark, tmp_path, monkeypatch, strategy, options)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert messages(direct_records) == messages(sql_records)
    keyless = [r for r in direct_records if r["key"] is None]
    assert len(keyless) == 30 and all(json.loads(r["value"])["op"] == "delete" for r in keyless)
    assert direct.messages_produced == len(direct_records) == (300 if "append" in strategy else 30 + 150)  # c150 orders once, in a keyless row
    assert not kept_directory_exists(spark, direct.run_id)


def test_deletes_with_avro_keys_take_the_direct_path_with_the_spark_sql_paths_tombstones(broker, spark, kafka_env, db, tmp_path, monkeypatch, kept_in):
    """A SQL delete carries its row, so its Avro key (the key columns' record) is made as an
    upsert's is: tombstones under the `-key` subject's schema, byte for byte past the frames the
    Spark SQL path's, on the direct path."""
    import uuid

    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    create_orders(db, extra=", __dpone__op text")
    execute(db, "UPDATE orders SET __dpone__op = 'delete' WHERE order_id % 7 = 0")
    options = "{message_format: avro, key: {format: avro}, schema_registry: {enabled: true}, deletes: {enabled: true, tombstone: true}}"
    (direct, direct_records), (sql, sql_records) = run_both(
        broker.bootstrap_servers, spark, tmp_path, monkeypatch, "{mode: incremental_merge, unique_key: [customer, placed_on], duplicate_policy: keep_last}", options
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes

    def unframed(records: list[dict]) -> Counter:
        return Counter((r["key"][5:], r["value"][5:] if r["value"] is not None else None) for r in records)

    tombstones = [r for r in direct_records if r["value"] is None]
    assert len(tombstones) == 42 and all(r["key"][:1] == b"\x00" and len(r["key"]) > 5 for r in tombstones)
    assert len(direct_records) == 300 and unframed(direct_records) == unframed(sql_records)


def test_a_table_that_doubled_since_it_was_counted_goes_to_the_spark_sql_path(broker, spark, kafka_env, db, tmp_path, monkeypatch):
    """Each scan task reads at most twice the rows counted when planning: a read that finds more
    (here the count is made to say 100 of 300 rows) stops, and the batch goes to the Spark SQL
    path, which delivers every row; nothing was produced first."""
    from dataclasses import replace as replaced

    from dpone_dagster.sources.sql.extract import SqlBatchSource

    create_orders(db)
    plan = SqlBatchSource.plan
    monkeypatch.setattr(SqlBatchSource, "plan", lambda self, spark, stored: replaced(plan(self, spark, stored), total=100))
    dst = unique_topic("sqld_grown")
    create_topic(broker.bootstrap_servers, dst, 2)
    result = run_pipeline(parse_manifest(manifest_text(dst, tmp_path, "{mode: full_refresh, unique_key: order_id}")), spark, RunRequest(run_id="sqld-grown"))
    assert result.execution_path == "spark_sql"
    assert any("more than 200 rows in one scan task" in n for n in result.notes), result.notes
    assert not kept_directory_exists(spark, result.run_id)
    assert len(consume_raw(broker.bootstrap_servers, dst)) == 300


def test_the_scan_bound_is_twice_the_count_or_a_share_of_the_driver_bound():
    from dpone_dagster.engine.direct_sql import MAX_HASHED_ROWS, scan_bound

    assert scan_bound(1_000, 4) == 2_000
    assert scan_bound(0, 1) == 0
    assert scan_bound(None, 4) == MAX_HASHED_ROWS // 4
    assert scan_bound(None, 0) == MAX_HASHED_ROWS


def test_speculation_on_a_cluster_sends_a_sql_batch_to_the_spark_sql_path(monkeypatch, tmp_path):
    """With speculative tasks two attempts of one scan task could each keep their own read of the
    table in Spark's storage: on a cluster the batch goes to the Spark SQL path (one host keeps
    files named by the task, written whole once)."""
    from types import SimpleNamespace

    from dpone_dagster.engine import direct_sql
    from dpone_dagster.spark.session import speculates

    def session(value: str) -> Any:
        return SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: value if key == "spark.speculation" else default))

    assert speculates(session("true")) and speculates(session(" TRUE ")) and not speculates(session("false"))
    m = parse_manifest(manifest_text("t", tmp_path, "{mode: incremental_merge, unique_key: order_id}"))
    planned = SimpleNamespace(boundary=SimpleNamespace(empty=False, total=10))
    monkeypatch.setattr(direct_sql, "speculates", lambda spark: True)
    for one_host, refused in ((False, True), (True, False)):
        monkeypatch.setattr(direct_sql, "one_host", lambda spark, one_host=one_host: one_host)
        reason = direct_sql.refusal(m, planned, object())
        assert (reason is not None and "spark.speculation" in reason) == refused, reason


def test_a_task_counts_the_rows_of_its_hashes_that_may_repeat():
    import numpy as np

    from dpone_dagster.direct.keys import TaskHashes

    hashes = TaskHashes.of([np.array([5, 3, 5, 9], np.uint64), np.array([5, 7], np.uint64)])
    assert hashes.rows_of(np.array([5, 7], np.uint64)) == 4  # 5 three times, 7 once
    assert hashes.rows_of(np.array([3], np.uint64)) == 1 and hashes.rows_of(np.zeros(0, np.uint64)) == 0
    assert sum(part.rows_of(np.array([5, 9], np.uint64)) for part in hashes.split(3)) == 4


def outcome_of(result: Any) -> dict[str, Any]:
    """What a run reports, but for what differs between any two runs and the path it took."""
    data = result.as_dict()
    for field_name in ("run_id", "execution_path", "started_at", "finished_at", "executors", "lag_before", "lag_after"):
        data.pop(field_name)
    data["timings"] = sorted(data["timings"])
    return data


@pytest.mark.parametrize("case", ["an empty table", "a cdc read of no changes"])
def test_a_batch_with_nothing_to_read_is_judged_on_the_direct_path_as_on_the_spark_sql_path(broker, spark, kafka_env, db, tmp_path, monkeypatch, case):
    """An incremental read of an empty table (counted empty when planning), or a CDC read (not
    counted) that finds no change: the direct path judges the empty batch itself, reports what the
    Spark SQL path reports, produces nothing and stores the same watermark."""
    cdc = case.startswith("a cdc")
    if cdc:
        fake_mssql_cdc(spark, monkeypatch, [])
    else:
        create_orders(db, rows=0)
    quality = "quality:\n  checks:\n    - {type: min_rows, threshold: 1}\n    - {type: not_null, columns: [order_id]}\n"

    def one(path: str, dst: str) -> tuple[dict[str, Any], Any]:
        create_topic(broker.bootstrap_servers, dst, 2)
        text = manifest_text(dst, tmp_path / path, "{mode: cdc, unique_key: order_id}" if cdc else "{mode: incremental_append, unique_key: order_id}", quality=quality)
        if cdc:
            text = text.replace("type: postgres", "type: mssql").replace("{schema: public, name: orders}", "{schema: dbo, name: orders}")
            text = text.replace("{incremental_column: updated_at, batch_size: 100}", "{}")
        manifest = parse_manifest(text)
        result = run_pipeline(manifest, spark)
        assert result.execution_path == path, result.notes
        assert result.status == "success" and result.messages_produced == 0 == len(consume_raw(broker.bootstrap_servers, dst, expected=0))
        return outcome_of(result), open_manifest_state_store(manifest).load_watermark(manifest.name)

    both = on_both_paths(monkeypatch, tmp_path, one, {"dst": "sqld_empty"})
    outcomes, stored = {path: both[path][0] for path in both}, {path: both[path][1] for path in both}
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert stored["direct"] == stored["spark_sql"]
    assert [(g["passed"], g["skipped"]) for g in outcomes["direct"]["gates"]] == [(True, True)] * 2, outcomes["direct"]["gates"]
