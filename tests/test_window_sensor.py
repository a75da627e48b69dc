"""The time-window sensor against a real Dagster instance: it requests closed windows with data
that are not materialized, requests a failed window again (bounded attempts, backoff in the tags)
and covers a catch-up horizon on its first tick. Runs are real runs in that instance."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conftest import consume_all, create_topic, produce_json, unique_topic
from dagster import DagsterInstance, Definitions, build_sensor_context, materialize
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

    def launch(self, request) -> bool:
        """Run what the sensor asked for, in the same instance (as the daemon would)."""
        result = materialize(
            [self.asset], instance=self.instance, resources=resources(), partition_key=request.partition_key,
            tags=request.tags, raise_on_error=False,
        )
        return result.success


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
