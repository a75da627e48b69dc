"""The Dagster code location: manifests become assets, materializing one runs the engine on the
real broker and Spark, and later runs fall back to the offsets recorded in Dagster metadata."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic, write_manifest
from dagster import AssetKey, DagsterInstance, Definitions, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import COMMITTED_OFFSETS, SOURCE_TOPIC, build_manifest_asset
from dpone_dagster.definitions import build_definitions
from dpone_dagster.manifest import ManifestError, load_manifest
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource

REPO = Path(__file__).resolve().parents[1]


def manifest_yaml(name: str, src: str, dst: str, state_path: Path | str, **strategy: str) -> str:
    extra = "".join(f", {k}: {v}" for k, v in strategy.items())
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id{extra}}}
  options:
    create_topic: {{enabled: true, partitions: 2}}
state: {{type: local, path: {state_path}}}
"""


def orders(ids: range) -> list[dict[str, Any]]:
    return [{"order_id": i, "amount": i * 2.0} for i in ids]


def resources() -> dict[str, Any]:
    # getOrCreate hands back the session-wide Spark session the `spark` fixture started.
    return {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }


def manifest_asset(path: Path):
    """The asset build_definitions makes for `path`, without the code location's bound resources."""
    return build_manifest_asset(load_manifest(path), path)


def metadata_values(result, key: AssetKey) -> dict[str, Any]:
    events = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    assert len(events) == 1
    return {k: v.value for k, v in events[0].materialization.metadata.items()}


# --------------------------------------------------------------------------- loading


def test_build_definitions_from_a_directory(tmp_path):
    write_manifest(tmp_path / "a.yaml", manifest_yaml("pipe_a", "topic_a", "out_a", tmp_path / "state"))
    write_manifest(tmp_path / "b.yml", manifest_yaml("pipe_b", "topic_b", "out_b", tmp_path / "state"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    defs = build_definitions(tmp_path)
    graph = defs.resolve_asset_graph()

    assert graph.materializable_asset_keys == {AssetKey(["pipe_a"]), AssetKey(["pipe_b"])}
    assert graph.get_all_asset_keys() == {
        AssetKey(["pipe_a"]),
        AssetKey(["pipe_b"]),
        AssetKey(["kafka", "topic_a"]),
        AssetKey(["kafka", "topic_b"]),
    }
    assert graph.get(AssetKey(["pipe_a"])).parent_keys == {AssetKey(["kafka", "topic_a"])}
    assert graph.get(AssetKey(["pipe_b"])).parent_keys == {AssetKey(["kafka", "topic_b"])}
    assert not graph.get(AssetKey(["kafka", "topic_a"])).is_materializable  # an external source

    spec = next(s for s in defs.resolve_all_asset_specs() if s.key == AssetKey(["pipe_a"]))
    assert spec.metadata["sink_topic"] == "out_a"
    assert spec.metadata["strategy"] == "incremental_merge"
    assert spec.metadata["manifest"] == str(tmp_path / "a.yaml")
    assert spec.group_name == "dpone"

    assert {"pyspark", "kafka", "schema_registry"} <= set(defs.resources)
    assert isinstance(defs.resources["pyspark"], LazyPySparkResource)
    assert isinstance(defs.resources["kafka"], KafkaResource)
    assert isinstance(defs.resources["schema_registry"], SchemaRegistryResource)
    Definitions.validate_loadable(defs)


def test_manifests_sharing_a_source_topic_share_one_source_asset(tmp_path):
    write_manifest(tmp_path / "a.yaml", manifest_yaml("pipe_a", "shared", "out_a", tmp_path / "state"))
    write_manifest(tmp_path / "b.yaml", manifest_yaml("pipe_b", "shared", "out_b", tmp_path / "state"))
    graph = build_definitions(tmp_path).resolve_asset_graph()
    assert [k for k in graph.get_all_asset_keys() if k.path[0] == "kafka"] == [AssetKey(["kafka", "shared"])]
    assert graph.get(AssetKey(["kafka", "shared"])).child_keys == {AssetKey(["pipe_a"]), AssetKey(["pipe_b"])}


def test_definitions_module_loads_the_repo_manifests(monkeypatch):
    monkeypatch.setenv("DPONE_MANIFESTS_DIR", str(REPO / "manifests"))
    module = importlib.reload(importlib.import_module("dpone_dagster.definitions"))
    graph = module.defs.resolve_asset_graph()
    assert AssetKey(["orders_to_dwh"]) in graph.materializable_asset_keys
    assert graph.get(AssetKey(["orders_to_dwh"])).parent_keys == {AssetKey(["kafka", "orders_events"])}
    assert module.manifests_dir() == REPO / "manifests"


def test_an_invalid_manifest_fails_the_load_naming_file_and_field(tmp_path):
    write_manifest(tmp_path / "good.yaml", manifest_yaml("good_pipe", "a", "b", tmp_path / "state"))
    bad = write_manifest(
        tmp_path / "bad.yaml",
        manifest_yaml("bad_pipe", "a", "b", tmp_path / "state").replace("unique_key: order_id", "unique_kye: order_id"),
    )
    with pytest.raises(ManifestError) as info:
        build_definitions(tmp_path)
    message = str(info.value)
    assert str(bad) in message
    assert "sink.strategy.unique_kye" in message and "did you mean 'unique_key'" in message


def test_two_manifests_with_one_name_fail_the_load_naming_both_files(tmp_path):
    first = write_manifest(tmp_path / "a.yaml", manifest_yaml("same_pipe", "a", "b", tmp_path / "state"))
    second = write_manifest(tmp_path / "b.yaml", manifest_yaml("same_pipe", "c", "d", tmp_path / "state"))
    with pytest.raises(ManifestError) as info:
        build_definitions(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{second}: invalid manifest")
    assert f"name: 'same_pipe' is also the name of {first}" in message


# --------------------------------------------------------------------------- materialize


def test_materialize_runs_the_engine_and_later_runs_trust_dagster_metadata(broker, spark, kafka_env, tmp_path):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("dg_src"), unique_topic("dg_dst")
    create_topic(bootstrap, src, 2)
    produce_json(bootstrap, src, orders(range(10)), partition=0)
    produce_json(bootstrap, src, orders(range(100, 110)), partition=1)
    state_dir = tmp_path / "state"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_manifest(manifests / "m.yaml", manifest_yaml("dg_pipe", src, dst, state_dir))
    key = AssetKey(["dg_pipe"])
    assert key in build_definitions(manifests).resolve_asset_graph().materializable_asset_keys
    asset = manifest_asset(manifests / "m.yaml")
    instance = DagsterInstance.ephemeral()

    first = materialize([asset], instance=instance, resources=resources())
    assert first.success
    meta = metadata_values(first, key)
    assert meta["rows_extracted"] == 20 and meta["messages_produced"] == 20
    assert isinstance(meta["rows_extracted"], int) and isinstance(meta["messages_produced"], int)
    assert meta["offset_ranges"] == [
        {"partition": 0, "start": 0, "end": 10},
        {"partition": 1, "start": 0, "end": 10},
    ]
    assert meta[COMMITTED_OFFSETS] == {"0": 10, "1": 10}
    assert meta["dpone/run_id"] == f"{first.run_id}-0"
    assert meta[SOURCE_TOPIC] == src
    out = consume_all(bootstrap, dst)
    assert sorted(int(r["key"]) for r in out) == [*range(10), *range(100, 110)]
    assert {int(r["key"]): r["value"]["amount"] for r in out}[107] == 214.0

    # N more messages: the next materialization reads exactly those.
    produce_json(bootstrap, src, orders(range(10, 13)), partition=0)
    produce_json(bootstrap, src, orders(range(110, 112)), partition=1)
    second = materialize([asset], instance=instance, resources=resources())
    assert second.success
    meta = metadata_values(second, key)
    assert meta["rows_extracted"] == 5 and meta["messages_produced"] == 5
    assert meta["offset_ranges"] == [
        {"partition": 0, "start": 10, "end": 13},
        {"partition": 1, "start": 10, "end": 12},
    ]
    assert meta[COMMITTED_OFFSETS] == {"0": 13, "1": 12}

    # The state store is lost: the run starts from the offsets of the last materialization.
    shutil.rmtree(state_dir)
    produce_json(bootstrap, src, orders(range(13, 17)), partition=0)
    third = materialize([asset], instance=instance, resources=resources())
    assert third.success
    meta = metadata_values(third, key)
    assert meta["rows_extracted"] == 4 and meta["messages_produced"] == 4
    assert meta["offset_ranges"] == [
        {"partition": 0, "start": 13, "end": 17},
        {"partition": 1, "start": 12, "end": 12},
    ]
    assert meta[COMMITTED_OFFSETS] == {"0": 17, "1": 12}

    keys = sorted(int(r["key"]) for r in consume_all(bootstrap, dst))
    assert keys == sorted([*range(17), *range(100, 112)])  # every record once: nothing re-read
    latest = instance.get_latest_materialization_event(key)
    assert latest is not None and latest.run_id == third.run_id


def test_metadata_offsets_of_another_topic_are_not_used(broker, spark, kafka_env, tmp_path):
    """Pointing a manifest at a new topic must not start it from the old topic's offsets."""
    bootstrap = broker.bootstrap_servers
    old, new, dst = unique_topic("dgt_old"), unique_topic("dgt_new"), unique_topic("dgt_dst")
    create_topic(bootstrap, old, 1)
    create_topic(bootstrap, new, 1)
    produce_json(bootstrap, old, orders(range(8)))
    produce_json(bootstrap, new, orders(range(100, 120)))
    path = write_manifest(tmp_path / "m.yaml", manifest_yaml("dgt_pipe", old, dst, tmp_path / "state"))
    key = AssetKey(["dgt_pipe"])
    instance = DagsterInstance.ephemeral()
    first = materialize([manifest_asset(path)], instance=instance, resources=resources())
    assert metadata_values(first, key)[COMMITTED_OFFSETS] == {"0": 8}

    write_manifest(path, manifest_yaml("dgt_pipe", new, dst, tmp_path / "state"))
    second = materialize([manifest_asset(path)], instance=instance, resources=resources())
    meta = metadata_values(second, key)
    assert meta["offset_ranges"] == [{"partition": 0, "start": 0, "end": 20}]
    assert meta["rows_extracted"] == 20
    assert len(consume_all(bootstrap, dst)) == 28


def test_a_failed_run_fails_the_step_and_records_no_materialization(broker, spark, kafka_env, tmp_path):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("dgf_src"), unique_topic("dgf_dst")
    create_topic(bootstrap, src, 1)
    produce_json(bootstrap, src, [{"order_id": 1}, {"order_id": 1}])
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write_manifest(
        manifests / "m.yaml", manifest_yaml("dgf_pipe", src, dst, tmp_path / "state", duplicate_policy="fail")
    )
    key = AssetKey(["dgf_pipe"])
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [manifest_asset(manifests / "m.yaml")],
        instance=instance,
        resources=resources(),
        raise_on_error=False,
    )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert "duplicate_policy: fail" in failure.message
    assert instance.get_latest_materialization_event(key) is None
    assert consume_all(bootstrap, dst) == []




def test_a_manifest_reading_another_manifests_sink_depends_on_its_asset(tmp_path):
    write_manifest(tmp_path / "a.yaml", manifest_yaml("raw_to_clean", "raw", "clean", tmp_path))
    write_manifest(tmp_path / "b.yaml", manifest_yaml("clean_to_mart", "clean", "mart", tmp_path))
    graph = build_definitions(tmp_path).resolve_asset_graph()
    assert graph.get(AssetKey(["clean_to_mart"])).parent_keys == {AssetKey(["raw_to_clean"])}
    assert graph.get(AssetKey(["raw_to_clean"])).parent_keys == {AssetKey(["kafka", "raw"])}


def test_a_manifest_may_declare_a_schedule_or_an_automation_condition(tmp_path):
    write_manifest(
        tmp_path / "s.yaml",
        manifest_yaml("on_schedule", "raw_s", "out_s", tmp_path)
        + 'dagster: {schedule: {cron: "*/15 * * * *", timezone: Europe/Paris}}\n',
    )
    write_manifest(
        tmp_path / "a.yaml", manifest_yaml("on_automation", "raw_a", "out_a", tmp_path) + 'dagster: {automation: {on_cron: "0 * * * *"}}\n'
    )
    defs = build_definitions(tmp_path)
    schedule = defs.resolve_schedule_def("on_schedule_schedule")
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("*/15 * * * *", "Europe/Paris")
    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey(["on_schedule"])).automation_condition is None
    assert "on_cron(0 * * * *, UTC)" in str(graph.get(AssetKey(["on_automation"])).automation_condition.get_label())
    assert defs.resolve_sensor_def("dpone_automation_sensor").default_status.value == "RUNNING"
    with pytest.raises(ManifestError, match="dagster.schedule: .*not a cron expression"):
        write_manifest(tmp_path / "bad.yaml", manifest_yaml("bad", "r", "o", tmp_path) + 'dagster: {schedule: {cron: "hourly"}}\n')
        build_definitions(tmp_path)
