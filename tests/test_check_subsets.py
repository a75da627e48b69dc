"""Asset checks are subsettable: the asset without some checks, or checks alone (the batch judged,
nothing published)."""

from __future__ import annotations

from conftest import consume_all, create_topic, produce_json, unique_topic, write_manifest
from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.manifest import load_manifest
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource


def test_asset_checks_can_be_selected_apart_from_the_asset(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("sub_src"), unique_topic("sub_dst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}, {"order_id": 2}], partition=0)
    path = write_manifest(tmp_path / "m.yaml", f"""
name: subset_pipe
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
state: {{type: local, path: {tmp_path / "state"}}}
quality:
  mode: fail
  checks: [{{type: min_rows, threshold: 100}}, {{type: unique, columns: [order_id]}}]
""")
    asset = build_manifest_asset(load_manifest(path), path)
    key = AssetKey(["subset_pipe"])
    resources = {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }
    instance = DagsterInstance.ephemeral()

    # A check alone: evaluated on the pending batch, no materialization, nothing published.
    alone = materialize(
        [asset], instance=instance, resources=resources, selection=AssetSelection.checks(AssetCheckKey(key, "unique_order_id"))
    )
    assert alone.success
    evaluations = alone.get_asset_check_evaluations()
    assert [(e.check_name, e.passed) for e in evaluations] == [("unique_order_id", True)]
    assert alone.get_asset_materialization_events() == [] and consume_all(bs, dst) == []

    # The asset without its failing min_rows check: published, only the unique check reported.
    selection = AssetSelection.assets(key).without_checks() | AssetSelection.checks(AssetCheckKey(key, "unique_order_id"))
    run = materialize([asset], instance=instance, resources=resources, selection=selection)
    assert run.success
    assert [e.check_name for e in run.get_asset_check_evaluations()] == ["unique_order_id"]
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [1, 2]
