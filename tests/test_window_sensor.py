"""The time-window sensor against a real Dagster instance: it requests closed windows with data
that are not materialized, requests a failed window again (bounded attempts, backoff in the tags)
and covers a catch-up horizon on its first tick. Runs are real runs in that instance."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conftest import consume_all, create_topic, produce_json, unique_topic
from dagster import AssetRecordsFilter, DagsterInstance, Definitions, build_sensor_context, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset, source_asset_specs
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource
from dpone_dagster.sensors import build_source_sensor

KEY_FORMAT = "%Y-%m-%d-%H:%M"


def resources():
    return {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }


def manifest_text(src: str, dst: str, state: Path, sensor: str) -> str:
    return f"""
name: sensed_{src}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    read_mode: time_window
    partitions: {{granularity: hourly, start: "2024-01-01T00:00:00", allowed_lateness_seconds: 60}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}}}
state: {{type: local, path: {state}}}
dagster: {{sensor: {{{sensor}}}}}
"""


def hours_ago(n: int, minute: int = 10) -> datetime:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return now - timedelta(hours=n) + timedelta(minutes=minute)


def key_of(moment: datetime) -> str:
    return moment.replace(minute=0).strftime(KEY_FORMAT)


class Sensed:
    """One manifest, its sensor and asset, and one Dagster instance that holds the runs."""

    def __init__(self, text: str):
        self.manifest = parse_manifest(text)
        self.sensor = build_source_sensor(self.manifest)
        self.asset = build_manifest_asset(self.manifest)
        self.defs = Definitions(assets=[*source_asset_specs(self.manifest), self.asset], sensors=[self.sensor], resources=resources())
        self.instance = DagsterInstance.ephemeral()
        self.cursor: str | None = None

    def tick(self):
        context = build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs, resources={"kafka": KafkaResource()})
        data = self.sensor.evaluate_tick(context)
        self.cursor = data.cursor or self.cursor
        return data

    def launch(self, request, tags: dict[str, str] | None = None) -> bool:
        """Run what the sensor asked for, in the same instance (as the daemon would)."""
        result = materialize(
            [self.asset], instance=self.instance, resources=resources(), partition_key=request.partition_key,
            tags={**request.tags, **(tags or {})}, raise_on_error=False,
        )
        return result.success

    def launch_as_sensor(self, request) -> bool:
        """As the daemon launches a sensor's request: with the sensor's name tag."""
        return self.launch(request, {"dagster/sensor_name": self.sensor.name})


def test_a_failed_window_is_requested_again_until_it_materializes(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ssrc"), unique_topic("sdst")  # the sink topic does not exist yet
    create_topic(bs, src, 2)
    stamp = hours_ago(3)
    produce_json(bs, src, [{"id": "a"}, {"id": "b"}], partition=0, timestamps=[int(stamp.timestamp() * 1000)] * 2)
    sensed = Sensed(manifest_text(src, dst, tmp_path, "retry_backoff_seconds: 0, max_attempts: 3"))

    first = sensed.tick()
    [request] = first.run_requests
    assert request.partition_key == key_of(stamp)
    assert request.run_key == f"{sensed.manifest.name}:{key_of(stamp)}:1"
    assert request.tags["dpone/attempt"] == "1" and request.tags["dpone/max_attempts"] == "3"
    assert first.asset_events[0].metadata["lag_messages"].value == 2  # nothing materialized yet
    assert not sensed.launch(request)  # sink topic missing: the run fails

    second = sensed.tick()
    [retry] = second.run_requests
    assert retry.partition_key == key_of(stamp) and retry.tags["dpone/attempt"] == "2"
    assert retry.run_key != request.run_key
    assert not sensed.launch(retry)

    create_topic(bs, dst, 1)  # the fault is fixed
    third = sensed.tick()
    [last] = third.run_requests
    assert last.tags["dpone/attempt"] == "3"
    assert sensed.launch(last)
    assert sorted(r["value"]["id"] for r in consume_all(bs, dst)) == ["a", "b"]
    assert key_of(stamp) in sensed.instance.get_materialized_partitions(sensed.asset.key)

    settled = sensed.tick()
    assert settled.run_requests == []
    assert settled.asset_events[0].metadata["lag_messages"].value == 0  # behind the window's end
    assert json.loads(settled.cursor)["since"] > key_of(stamp)


def test_attempts_are_bounded_and_backoff_waits(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ssrc"), unique_topic("sdst")
    create_topic(bs, src, 1)
    stamp = hours_ago(2)
    produce_json(bs, src, [{"id": "a"}], partition=0, timestamps=[int(stamp.timestamp() * 1000)])

    waiting = Sensed(manifest_text(src, dst, tmp_path / "w", "retry_backoff_seconds: 3600, max_attempts: 3"))
    [request] = waiting.tick().run_requests
    assert not waiting.launch(request)
    held = waiting.tick()
    assert held.run_requests == []
    assert f"{key_of(stamp)}: retry 2 in" in held.skip_message and "backoff 3600s" in held.skip_message

    bounded = Sensed(manifest_text(src, dst, tmp_path / "b", "retry_backoff_seconds: 0, max_attempts: 1"))
    [request] = bounded.tick().run_requests
    assert not bounded.launch(request)
    gave_up = bounded.tick()
    assert gave_up.run_requests == [] and "gave up after 1 failed run(s)" in gave_up.skip_message


def test_first_tick_covers_the_catch_up_horizon(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("ssrc")
    create_topic(bs, src, 1)
    stamps = [hours_ago(30), hours_ago(5), hours_ago(3), hours_ago(0, minute=0)]  # the last: not closed
    produce_json(bs, src, [{"id": str(i)} for i in range(4)], partition=0, timestamps=[int(s.timestamp() * 1000) for s in stamps])
    sensed = Sensed(manifest_text(src, "unused", tmp_path, "catch_up_windows: 24"))
    data = sensed.tick()
    assert [r.partition_key for r in data.run_requests] == [key_of(stamps[1]), key_of(stamps[2])]
    wide = Sensed(manifest_text(src, "unused", tmp_path / "wide", "catch_up_windows: 48"))
    assert [r.partition_key for r in wide.tick().run_requests] == [key_of(s) for s in stamps[:3]]


def test_a_window_being_materialized_by_any_run_is_not_requested_again(broker, spark, kafka_env, tmp_path):
    """A range run (as a backfill or the UI creates it) of two windows is queued: the sensor asks
    for neither. Once it is gone, the sensor asks for both; a UI run then materializes one before
    the sensor's run of it starts: that run produces nothing, and the window's records are in the
    target once."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ssrc"), unique_topic("sdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    first, second = hours_ago(3), hours_ago(2)
    produce_json(bs, src, [{"id": "a"}], partition=0, timestamps=[int(first.timestamp() * 1000)])
    produce_json(bs, src, [{"id": "b"}], partition=0, timestamps=[int(second.timestamp() * 1000)])
    sensed = Sensed(manifest_text(src, dst, tmp_path, "retry_backoff_seconds: 0"))
    job = sensed.defs.resolve_implicit_global_asset_job_def()
    backfill = sensed.instance.create_run_for_job(
        job_def=job,
        asset_selection=frozenset({sensed.asset.key}),
        tags={"dagster/asset_partition_range_start": key_of(first), "dagster/asset_partition_range_end": key_of(second)},
    )
    held = sensed.tick()
    assert held.run_requests == []
    assert f"{key_of(first)}: a run materializing it is under way" in held.skip_message
    assert f"{key_of(second)}: a run materializing it is under way" in held.skip_message

    sensed.instance.report_run_canceled(backfill)
    requests = {r.partition_key: r for r in sensed.tick().run_requests}
    assert sorted(requests) == [key_of(first), key_of(second)]
    # A person materializes the first window from the UI while the sensor's run waits in the queue.
    assert materialize([sensed.asset], instance=sensed.instance, resources=resources(), partition_key=key_of(first)).success
    # The daemon launches the sensor's runs with the sensor's name tag (added here as it would).
    for key in (key_of(first), key_of(second)):
        assert sensed.launch_as_sensor(requests[key])
    assert sorted(r["value"]["id"] for r in consume_all(bs, dst)) == ["a", "b"]  # "a" once
    runs_of_first = {
        r.run_id for r in sensed.instance.fetch_materializations(AssetRecordsFilter(asset_key=sensed.asset.key, asset_partitions=[key_of(first)]), limit=10).records
    }
    assert len(runs_of_first) == 1


def test_windows_retention_removed_are_reported_once_and_newer_ones_go_on(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Records of the two oldest watched windows are gone (the log start is past them): under
    on_retention_gap: fail a run would refuse them. The sensor reports them once (skip reason and
    the asset's metadata), moves on and requests the newer window; the next tick does not report
    them again. The embedded broker never runs retention and cannot delete records, so the log
    start the sensor reads is raised (the one fake here, as in the fault suite)."""
    from dpone_dagster.kafka import inspect
    from dpone_dagster.kafka.boundary import Watermarks

    bs = broker.bootstrap_servers
    src, dst = unique_topic("ssrc"), unique_topic("sdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    stamps = [hours_ago(5), hours_ago(5, minute=20), hours_ago(4), hours_ago(4, minute=20), hours_ago(3)]
    produce_json(bs, src, [{"id": str(i)} for i in range(5)], partition=0, timestamps=[int(s.timestamp() * 1000) for s in stamps])
    real = inspect.verified_watermarks

    def retention_removed_up_to_3(consumer, topic, partitions):
        return {p: Watermarks(max(w.low, 3), w.high) for p, w in real(consumer, topic, partitions).items()}

    monkeypatch.setattr(inspect, "verified_watermarks", retention_removed_up_to_3)
    sensed = Sensed(manifest_text(src, dst, tmp_path, "retry_backoff_seconds: 0, catch_up_windows: 6"))
    data = sensed.tick()
    assert [r.partition_key for r in data.run_requests] == [key_of(stamps[4])]
    [report] = [e for e in data.asset_events if e.asset_key == sensed.asset.key]
    lost = report.metadata["windows_lost_to_retention"].value  # and the empty watched windows before them
    assert {key_of(stamps[0]), key_of(stamps[2])} <= set(lost) and max(lost) == key_of(stamps[2])
    assert json.loads(data.cursor)["since"] > lost[-1]
    assert sensed.launch(data.run_requests[0])
    assert [r["value"]["id"] for r in consume_all(bs, dst)] == ["4"]
    again = sensed.tick()
    assert again.run_requests == [] and not any(e.asset_key == sensed.asset.key for e in again.asset_events)
