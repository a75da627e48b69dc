"""Quality gates inside real runs: a failing gate in fail mode produces nothing and advances nothing
(sink topic, state table, Dagster instance); warn mode publishes and shows the failure; every check
type including a Great Expectations expectation; reconciliation; artifacts and metrics files."""

from __future__ import annotations

import json

import psycopg2
import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic
from dagster import AssetKey, DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.engine.stages import load as load_stage
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.delivery import DeliveryStats
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.observability.artifacts import list_runs, show_run
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource


def manifest(src: str, dst: str, quality: str, state: str, artifacts: str = "") -> str:
    return f"""
name: gated
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {{group_id: g_{src}}}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
{state}
quality:
{quality}
{artifacts}
"""


POSTGRES_STATE = "state: {type: postgres, connection_id: postgres_state}"


@pytest.fixture
def topics(broker, kafka_env):
    src, dst = unique_topic("qsrc"), unique_topic("qdst")
    create_topic(broker.bootstrap_servers, src, 2)
    create_topic(broker.bootstrap_servers, dst, 1)
    rows = [{"order_id": i, "status": "paid" if i % 4 else "lost", "amount": float(i)} for i in range(20)]
    produce_json(broker.bootstrap_servers, src, rows[:10], partition=0)
    produce_json(broker.bootstrap_servers, src, rows[10:], partition=1)
    return src, dst


def resources():
    return {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }


def stored_offsets(pg: dict, group: str) -> list[tuple[int, int]]:
    with psycopg2.connect(**pg) as conn, conn.cursor() as cur:
        cur.execute('select "partition", "offset" from etl_state.etl_kafka_offsets where group_id = %s order by 1', (group,))
        return cur.fetchall()


def test_failing_gate_in_fail_mode_blocks_everything(broker, spark, topics, pg_env, pg_database):
    src, dst = topics
    quality = """  mode: fail
  checks:
    - {type: min_rows, threshold: 1}
    - {type: accepted_values, column: status, values: [paid, shipped]}"""
    asset = build_manifest_asset(parse_manifest(manifest(src, dst, quality, POSTGRES_STATE)))
    instance = DagsterInstance.ephemeral()
    result = materialize([asset], instance=instance, resources=resources(), raise_on_error=False)
    assert not result.success
    # Nothing produced, nothing stored, no materialization a later run could trust.
    assert consume_all(broker.bootstrap_servers, dst) == []
    assert stored_offsets(pg_database, f"g_{src}") == []
    assert instance.get_latest_materialization_event(AssetKey(["gated"])) is None
    with psycopg2.connect(**pg_database) as conn, conn.cursor() as cur:
        cur.execute("select status, error from etl_state.dpone_state where pipeline = 'gated' order by started_at desc limit 1")
        status, error = cur.fetchone()
    assert status == "failed" and "accepted_values_status" in error
    # The check results were recorded, with the observed value and failing rows.
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["min_rows"].passed
    failed = evaluations["accepted_values_status"]
    assert not failed.passed and failed.metadata["observed"].value == "5"
    assert {row["status"] for row in failed.metadata["failing_sample"].value} == {"lost"}


def test_warn_mode_publishes_and_shows_the_failure(broker, spark, topics, tmp_path):
    src, dst = topics
    quality = """  mode: warn
  checks:
    - {type: not_null, columns: [order_id, amount]}
    - {type: unique, columns: [order_id]}
    - {type: accepted_values, column: status, values: [paid]}
    - {type: freshness, max_age_seconds: 3600}
    - {type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, min_value: 0, max_value: 10}}
    - {type: source_target_count, tolerance_pct: 0}"""
    state = f"state: {{type: local, path: {tmp_path}}}"
    asset = build_manifest_asset(parse_manifest(manifest(src, dst, quality, state)))
    instance = DagsterInstance.ephemeral()
    result = materialize([asset], instance=instance, resources=resources())
    assert result.success
    assert len(consume_all(broker.bootstrap_servers, dst)) == 20
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {
        "not_null_order_id_amount",
        "unique_order_id",
        "accepted_values_status",
        "freshness",
        "ge_expect_column_values_to_be_between_amount",
        "source_target_count",
    }
    assert evaluations["not_null_order_id_amount"].passed and evaluations["unique_order_id"].passed
    assert evaluations["freshness"].passed
    assert not evaluations["accepted_values_status"].passed
    assert evaluations["accepted_values_status"].severity.value == "WARN"
    ge = evaluations["ge_expect_column_values_to_be_between_amount"]
    assert not ge.passed and ge.metadata["observed"].value == "9"  # amounts 11..19 are out of range
    assert evaluations["source_target_count"].passed
    assert instance.get_latest_materialization_event(AssetKey(["gated"])) is not None


def test_source_target_count_catches_a_delivery_mismatch(broker, spark, topics, tmp_path, monkeypatch):
    """The broker acknowledges everything it is sent, so the mismatch is injected by wrapping the
    real producer's statistics (one acknowledged message fewer) of the Spark SQL path."""
    src, dst = topics
    monkeypatch.setenv("DPONE_DIRECT_PATH", "off")
    real_produce = load_stage.produce

    def short_produce(messages, settings, records):
        stats = real_produce(messages, settings, records)
        return DeliveryStats(stats.delivered - 1, 0, stats.tombstones, stats.bytes, stats.partitions, stats.errors)

    monkeypatch.setattr(load_stage, "produce", short_produce)
    quality = "  mode: fail\n  checks:\n    - {type: source_target_count, tolerance_pct: 1}"
    text = manifest(src, dst, quality, f"state: {{type: local, path: {tmp_path}}}")
    with pytest.raises(RunFailed, match=r"reconciliation failed .*source_target_count") as caught:
        run_pipeline(parse_manifest(text), spark)
    [gate] = caught.value.result.gates
    assert gate["observed"] == 5.0 and not gate["passed"]  # 1 of 20 = 5% > 1%
    from dpone_dagster.state.local import LocalStateStore

    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{src}") == {}


def test_empty_incremental_batch_skips_min_rows(broker, spark, topics, tmp_path):
    src, dst = topics
    quality = "  mode: fail\n  checks:\n    - {type: min_rows, threshold: 1}"
    m = parse_manifest(manifest(src, dst, quality, f"state: {{type: local, path: {tmp_path}}}"))
    assert run_pipeline(m, spark).messages_produced == 20
    empty = run_pipeline(m, spark)  # no new data: not a failure
    assert empty.status == "success" and empty.gates[0]["skipped"] and empty.gates[0]["description"] == "no new data"


def test_run_artifacts_and_metrics(broker, spark, topics, tmp_path):
    src, dst = topics
    quality = "  mode: fail\n  checks:\n    - {type: min_rows, threshold: 1}\n    - {type: source_target_count, tolerance_pct: 0}"
    artifacts = f"observability: {{artifacts: {{enabled: true, path: {tmp_path}/runs}}}}"
    m = parse_manifest(manifest(src, dst, quality, f"state: {{type: local, path: {tmp_path}/state}}", artifacts))
    result = run_pipeline(m, spark)
    record = show_run(f"{tmp_path}/runs", result.run_id)
    assert record["pipeline"] == "gated" and record["status"] == "success"
    assert record["counts"]["messages_produced"] == 20 and record["counts"]["rows_extracted"] == 20
    assert record["boundary"]["partitions"] and record["errors"] == []
    assert {g["name"] for g in record["gates"]} == {"min_rows", "source_target_count"}
    assert set(record["timings"]) >= {"plan", "extract", "quality_pre", "shape", "load", "quality_post", "commit"}
    plan_md = (tmp_path / "runs" / result.run_id / "plan.md").read_text()
    assert plan_md.startswith("# Plan: gated")
    metrics = json.loads((tmp_path / "runs" / result.run_id / "metrics.json").read_text())
    assert metrics["messages"] == 20 and metrics["rows"] == 20
    assert metrics["lag_before"] == 20 and metrics["lag_after"] == 0
    assert metrics["throughput_msgs_per_s"] > 0
    assert [r["run_id"] for r in list_runs(f"{tmp_path}/runs")] == [result.run_id]
