"""Time-window partitions → offsets, backfills (one run per key and single-run ranges) and
sensors, through a real Dagster instance, the embedded broker and the shared Spark session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic
from dagster import DagsterInstance, build_sensor_context, materialize
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.assets.partitions import is_closed, partitions_def_for, window_for_key
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.manifest.models import TimeWindowPartitions
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource
from dpone_dagster.sensors import build_source_sensor
from dpone_dagster.sources.kafka import TimeWindow


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


# Records of partition 0, in write order. Hour 02 has no data; 01:00:00.000 sits exactly on a
# boundary (it belongs to hour 01); a late record stamped 00:45 is written during hour 01.
RECORDS = [
    ("a", "2024-03-01T00:00:00"),
    ("b", "2024-03-01T00:30:00"),
    ("c", "2024-03-01T00:59:59.999"),
    ("d", "2024-03-01T01:00:00"),
    ("e", "2024-03-01T01:10:00"),
    ("late", "2024-03-01T00:45:00"),
    ("f", "2024-03-01T01:50:00"),
    ("g", "2024-03-01T03:05:00"),
]
EXPECTED = {
    "2024-03-01-00:00": ["a", "b", "c"],
    "2024-03-01-01:00": ["d", "e", "f", "late"],
    "2024-03-01-02:00": [],
    "2024-03-01-03:00": ["g"],
}


def manifest_text(src: str, dst: str, state: Path, sensor: str = "") -> str:
    return f"""
name: hourly_{src}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    read_mode: time_window
    partitions: {{granularity: hourly, start: "2024-03-01T00:00:00"}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append, unique_key: id}}
state: {{type: local, path: {state}}}
{sensor}
"""


@pytest.fixture
def hourly(broker, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("hsrc")
    create_topic(bs, src, 2)
    produce_json(bs, src, [{"id": r[0]} for r in RECORDS], partition=0, timestamps=[ms(r[1]) for r in RECORDS])
    # Partition 1 holds one record in hour 03 only.
    produce_json(bs, src, [{"id": "p1"}], partition=1, timestamps=[ms("2024-03-01T03:30:00")])
    return src


def resources():
    return {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }


def new_sink(bs: str) -> str:
    dst = unique_topic("hdst")
    create_topic(bs, dst, 1)
    return dst


def keys_in(bs: str, topic: str) -> list[str]:
    return sorted(r["value"]["id"] for r in consume_all(bs, topic))


def test_partitions_definition_and_window_mapping():
    m = parse_manifest(manifest_text("s", "d", Path("/tmp/x")))
    pdef = partitions_def_for(m)
    assert pdef is not None and pdef.get_first_partition_key() == "2024-03-01-00:00"
    window = window_for_key(pdef, "2024-03-01-05:00")
    assert (window.start.isoformat(), window.end.isoformat()) == ("2024-03-01T05:00:00+00:00", "2024-03-01T06:00:00+00:00")
    settings = TimeWindowPartitions(allowed_lateness_seconds=600)
    end = datetime(2024, 3, 1, 6, tzinfo=UTC)
    assert not is_closed(TimeWindow(window.start, end), settings, datetime(2024, 3, 1, 6, 5, tzinfo=UTC))
    assert is_closed(TimeWindow(window.start, end), settings, datetime(2024, 3, 1, 6, 10, tzinfo=UTC))
    daily = parse_manifest(manifest_text("s", "d", Path("/tmp/x")).replace("granularity: hourly", "granularity: daily"))
    assert partitions_def_for(daily).get_first_partition_key() == "2024-03-01"


def test_one_run_per_partition_reads_exactly_its_window(broker, spark, hourly, tmp_path):
    bs = broker.bootstrap_servers
    instance = DagsterInstance.ephemeral()
    for key, expected in EXPECTED.items():
        dst = new_sink(bs)
        asset = build_manifest_asset(parse_manifest(manifest_text(hourly, dst, tmp_path)))
        result = materialize([asset], instance=instance, resources=resources(), partition_key=key)
        assert result.success
        got = keys_in(bs, dst)
        assert got == sorted(expected + (["p1"] if key.endswith("03:00") else [])), key
        event = instance.get_latest_materialization_event(asset.key)
        assert event.dagster_event.partition == key
        meta = event.asset_materialization.metadata
        assert meta["rows_extracted"].value == len(got)
        assert json.loads(json.dumps(meta["offset_ranges_by_partition"].value))[key]


def test_rematerializing_a_partition_reads_the_same_offsets_and_keys(broker, spark, hourly, tmp_path):
    bs = broker.bootstrap_servers
    instance = DagsterInstance.ephemeral()
    dst = new_sink(bs)
    asset = build_manifest_asset(parse_manifest(manifest_text(hourly, dst, tmp_path)))
    ranges = []
    for _ in range(2):
        materialize([asset], instance=instance, resources=resources(), partition_key="2024-03-01-01:00")
        meta = instance.get_latest_materialization_event(asset.key).asset_materialization.metadata
        ranges.append(meta["offset_ranges"].value)
    assert ranges[0] == ranges[1] == [{"partition": 0, "start": 3, "end": 7}, {"partition": 1, "start": 0, "end": 0}]
    out = keys_in(bs, dst)
    assert out == sorted(EXPECTED["2024-03-01-01:00"] * 2)  # same set of keys twice


def test_single_run_range_backfill_records_offsets_per_key(broker, spark, hourly, tmp_path):
    bs = broker.bootstrap_servers
    instance = DagsterInstance.ephemeral()
    dst = new_sink(bs)
    asset = build_manifest_asset(parse_manifest(manifest_text(hourly, dst, tmp_path)))
    tags = {ASSET_PARTITION_RANGE_START_TAG: "2024-03-01-00:00", ASSET_PARTITION_RANGE_END_TAG: "2024-03-01-03:00"}
    result = materialize([asset], instance=instance, resources=resources(), tags=tags)
    assert result.success
    assert keys_in(bs, dst) == sorted([*sum(EXPECTED.values(), []), "p1"])
    by_key = instance.get_latest_materialization_event(asset.key).asset_materialization.metadata[
        "offset_ranges_by_partition"
    ].value
    assert by_key["2024-03-01-00:00"] == [{"partition": 0, "start": 0, "end": 3}, {"partition": 1, "start": 0, "end": 0}]
    assert by_key["2024-03-01-01:00"][0] == {"partition": 0, "start": 3, "end": 7}
    assert by_key["2024-03-01-02:00"][0] == {"partition": 0, "start": 7, "end": 7}
    assert by_key["2024-03-01-03:00"] == [{"partition": 0, "start": 7, "end": 8}, {"partition": 1, "start": 0, "end": 1}]
    # Every key of the range is materialized.
    materialized = instance.get_materialized_partitions(asset.key)
    assert set(EXPECTED) <= materialized


def test_an_open_window_is_refused(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("open")
    create_topic(bs, src, 1)
    text = manifest_text(src, new_sink(bs), tmp_path).replace('start: "2024-03-01T00:00:00"', 'start: "2024-03-01T00:00:00", allowed_lateness_seconds: 100000000')
    asset = build_manifest_asset(parse_manifest(text))
    result = materialize([asset], resources=resources(), partition_key="2024-03-01-00:00", raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "not closed yet" in failure.event_specific_data.error.message


def test_cli_partition_and_partition_range(broker, hourly, tmp_path):
    """`dagster asset materialize --partition KEY` and `--partition-range A...B` in a subprocess."""
    bs = broker.bootstrap_servers
    dst = new_sink(bs)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "hourly.yaml").write_text(manifest_text(hourly, dst, tmp_path / "state"))
    env = {
        **os.environ,
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs,
        "DAGSTER_HOME": str(tmp_path),
        "DPONE_MANIFESTS_DIR": str(manifests),
        "DPONE_SPARK_CONF": json.dumps({"spark.master": "local[2]"}),
    }
    base = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "dpone_dagster.definitions", "--select", f"hourly_{hourly}"]
    single = subprocess.run([*base, "--partition", "2024-03-01-00:00"], env=env, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    assert keys_in(bs, dst) == ["a", "b", "c"]
    ranged = subprocess.run(
        [*base, "--partition-range", "2024-03-01-01:00...2024-03-01-03:00"], env=env, capture_output=True, text=True, timeout=300
    )
    assert ranged.returncode == 0, ranged.stderr[-3000:]
    assert keys_in(bs, dst) == sorted(["a", "b", "c", "d", "e", "f", "late", "g", "p1"])


# --------------------------------------------------------------------------- sensors


def offsets_manifest(src: str, dst: str, state: Path, min_new: int = 3) -> str:
    return f"""
name: sensed_{src}
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}}}
state: {{type: local, path: {state}}}
dagster: {{sensor: {{min_new_messages: {min_new}}}}}
"""


def tick(manifest, cursor=None):
    sensor_def = build_source_sensor(manifest)
    defs = build_definitions_for(manifest, sensor_def)
    context = build_sensor_context(instance=DagsterInstance.ephemeral(), cursor=cursor, definitions=defs, resources={"kafka": KafkaResource()})
    return sensor_def.evaluate_tick(context)


def build_definitions_for(manifest, sensor_def):
    from dagster import Definitions

    from dpone_dagster.assets.factory import source_asset_specs

    return Definitions(assets=[*source_asset_specs(manifest), build_manifest_asset(manifest)], sensors=[sensor_def], resources=resources())


def test_offsets_sensor_requests_a_run_once_enough_messages_wait(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("sens")
    create_topic(bs, src, 2)
    dst = new_sink(bs)
    manifest = parse_manifest(offsets_manifest(src, dst, tmp_path))

    empty = tick(manifest)
    assert empty.run_requests == [] and "0 new message(s)" in empty.skip_message
    [observation] = empty.asset_events
    assert observation.asset_key.path == ["kafka", src] and observation.metadata["lag_messages"].value == 0

    produce_json(bs, src, [{"n": 1}, {"n": 2}], partition=0)
    assert tick(manifest).run_requests == []  # 2 < min_new_messages 3
    produce_json(bs, src, [{"n": 3}], partition=1)
    data = tick(manifest)
    [request] = data.run_requests
    assert request.run_key.startswith(f"sensed_{src}:")
    assert data.asset_events[0].metadata["lag_messages"].value == 3
    assert json.loads(data.cursor) == {"0": 2, "1": 1}
    # The same situation gives the same run key (Dagster de-duplicates it) ...
    assert tick(manifest).run_requests[0].run_key == request.run_key

    # ... after a successful run the lag is gone; new data gives a new key.
    from dpone_dagster.engine.run import run_pipeline

    run_pipeline(manifest, spark)
    assert tick(manifest).run_requests == []
    produce_json(bs, src, [{"n": i} for i in range(3)], partition=0)
    assert tick(manifest).run_requests[0].run_key != request.run_key


def test_time_window_sensor_watches_no_further_back_than_its_catch_up_horizon(broker, spark, hourly, tmp_path):
    """The hourly fixture's windows (March 2024) are far older than the horizon (24 windows): a
    cursor pointing at them, in either form, is clamped to it, so they are left to backfills (the
    requests inside the horizon are tested in test_window_sensor.py)."""
    bs = broker.bootstrap_servers
    manifest = parse_manifest(manifest_text(hourly, new_sink(bs), tmp_path))
    closed = partitions_def_for(manifest).get_partition_keys(current_time=datetime.now(UTC) - timedelta(seconds=300))
    for cursor in (json.dumps({"since": "2024-03-01-00:00"}), "2024-03-01-01:00", None):
        data = tick(manifest, cursor=cursor)
        assert data.run_requests == []
        assert json.loads(data.cursor) == {"since": closed[-24]}
