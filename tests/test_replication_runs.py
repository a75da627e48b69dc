"""Exactly-once replication through the engine, the CLI state view and Dagster: offsets land only
in the control topic (with the records' transaction), reruns resume there, gates run first.

The embedded broker does not hide aborted records from read_committed consumers (see
TEST-ENVIRONMENT notes), so these tests assert on committed runs and on the control topic; the
visibility tests against a real Kafka are in test_replication.py (skipped without one)."""

from __future__ import annotations

import json

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic
from dagster import AssetKey, DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.cli import main
from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.replication.control_topic import read_committed_offsets
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource


def manifest_text(src: str, dst: str, control: str, tmp_path, quality: str = "", state: str = "") -> str:
    return f"""
name: k2k_eos
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    replication:
      tracing_headers: true
      control_topic: {{name: {control}, commit_group: grp_{src}}}
{state or f"state: {{type: local, path: {tmp_path}}}"}
{quality}
"""


@pytest.fixture
def topics(broker, kafka_env):
    src, dst, control = unique_topic("esrc"), unique_topic("edst"), unique_topic("ctl")
    create_topic(broker.bootstrap_servers, src, 2)
    create_topic(broker.bootstrap_servers, dst, 2)
    return src, dst, control


def test_exactly_once_run_commits_offsets_with_the_records_and_resumes(broker, spark, topics, tmp_path, capsys):
    src, dst, control = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"n": i} for i in range(6)], partition=0, key="a")
    produce_json(bs, src, [{"n": i} for i in range(6, 10)], partition=1, key="b")
    m = parse_manifest(manifest_text(src, dst, control, tmp_path))
    first = run_pipeline(m, spark)
    assert first.messages_produced == 10 and first.committed_offsets == {0: 6, 1: 4}
    out = consume_all(bs, dst)
    assert sorted(r["value"]["n"] for r in out) == list(range(10))
    assert all(r["headers"]["dpone.trace.source_topic"] == src for r in out)
    assert {r["partition"] for r in out if r["key"] == "b"} == {1}  # partition kept
    options = m.sink.options.replication.control_topic
    assert read_committed_offsets({"bootstrap.servers": bs}, options, f"grp_{src}", [src]) == {(src, 0): 6, (src, 1): 4}

    produce_json(bs, src, [{"n": 10}], partition=1, key="b")
    second = run_pipeline(m, spark)
    assert second.messages_produced == 1 and second.committed_offsets == {0: 6, 1: 5}

    # `dpone state show` reads the control topic when state.type is kafka_control_topic.
    path = tmp_path / "eos.yaml"
    path.write_text(manifest_text(src, dst, control, tmp_path, state="state: {type: kafka_control_topic}"))
    assert main(["state", "show", str(path), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["offsets"] == {f"{src}:0": 6, f"{src}:1": 5}


def test_a_failing_gate_stops_before_any_transaction(broker, spark, topics, tmp_path):
    src, dst, control = topics
    produce_json(broker.bootstrap_servers, src, [{"n": 1}, {"n": None}], partition=0)
    quality = "quality: {mode: fail, checks: [{type: not_null, columns: [n]}]}"
    m = parse_manifest(manifest_text(src, dst, control, tmp_path, quality))
    with pytest.raises(RunFailed, match="quality gate"):
        run_pipeline(m, spark)
    assert consume_all(broker.bootstrap_servers, dst) == []


def test_dagster_materialization_of_a_replication(broker, spark, topics, tmp_path):
    src, dst, control = topics
    produce_json(broker.bootstrap_servers, src, [{"n": 1}, {"n": 2}], partition=1)
    asset = build_manifest_asset(parse_manifest(manifest_text(src, dst, control, tmp_path)))
    instance = DagsterInstance.ephemeral()
    resources = {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }
    assert materialize([asset], instance=instance, resources=resources).success
    metadata = instance.get_latest_materialization_event(AssetKey(["k2k_eos"])).asset_materialization.metadata
    assert metadata["messages_produced"].value == 2
    assert metadata["dpone/committed_offsets"].value == {"0": 0, "1": 2}
