"""`dagster.automation.on_cron` on a time-window asset, evaluated by Dagster's own automation
evaluation (the code the daemon's automation sensor runs) against a real instance at chosen
times: a tick requests only closed windows (allowed lateness passed) that are neither
materialized nor in progress, never the whole history again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    evaluate_automation_conditions,
)
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset, source_asset_specs
from dpone_dagster.assets.partitions import partitions_def_for
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource

KEY = AssetKey(["automated_windows"])


def manifest_text(state: Path, lateness_s: int = 600, catch_up: int = 24, timezone: str = "UTC", cron: str = "0 * * * *") -> str:
    return f"""
name: automated_windows
source:
  type: kafka
  connection_id: kafka_cluster
  topic: src
  options:
    read_mode: time_window
    partitions: {{granularity: hourly, start: "2024-01-01T00:00:00", timezone: {timezone}, allowed_lateness_seconds: {lateness_s}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: dst}}
state: {{type: local, path: {state}}}
dagster: {{sensor: {{enabled: false, catch_up_windows: {catch_up}}}, automation: {{on_cron: "{cron}", timezone: {timezone}}}}}
"""


class Automated:
    """One manifest's definitions, a real instance, and the automation cursor between ticks."""

    def __init__(self, text: str):
        self.manifest = parse_manifest(text)
        self.asset = build_manifest_asset(self.manifest)
        self.defs = Definitions(
            assets=[*source_asset_specs(self.manifest), self.asset],
            resources={"pyspark": LazyPySparkResource(spark_config={}), "kafka": KafkaResource(), "schema_registry": SchemaRegistryResource()},
        )
        self.instance = DagsterInstance.ephemeral()
        self.cursor = None

    def evaluate(self, hour: int, minute: int, day: datetime = datetime(2024, 3, 1, tzinfo=UTC)) -> list[str]:
        return self.evaluate_at(day.replace(hour=hour, minute=minute))

    def evaluate_at(self, moment: datetime) -> list[str]:
        result = evaluate_automation_conditions(self.defs, self.instance, evaluation_time=moment, cursor=self.cursor)
        self.cursor = result.cursor
        return sorted(k for k in result.get_requested_partitions(KEY) if k is not None)

    def materialized(self, keys: list[str]) -> None:
        for key in keys:
            self.instance.report_runless_asset_event(AssetMaterialization(asset_key=KEY, partition=key))

    def queued_range_run(self, first: str, last: str) -> None:
        """A run of a range of windows as a range backfill or the UI creates it (queued, not
        started): Dagster records its planned materializations per partition."""
        job = self.defs.resolve_implicit_global_asset_job_def()
        self.instance.create_run_for_job(
            job_def=job,
            asset_selection=frozenset({KEY}),
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
        )


def test_a_cron_tick_requests_closed_windows_once(tmp_path):
    automated = Automated(manifest_text(tmp_path))
    assert automated.evaluate(9, 30) == []  # no tick passed yet
    # 10:05: the 09:00 window closes at 10:10 (lateness 600 s): not requested; the 24 closed
    # windows before it are, and nothing older (catch_up_windows 24), out of 1,450 since January.
    first = automated.evaluate(10, 5)
    assert len(first) == 24 and first[0] == "2024-02-29-09:00" and first[-1] == "2024-03-01-08:00"
    automated.materialized(first)
    assert automated.evaluate(10, 15) == []  # the same tick: nothing more
    # The next tick asks for the window that closed since, and only that one.
    assert automated.evaluate(11, 5) == ["2024-03-01-09:00"]
    automated.materialized(["2024-03-01-09:00"])
    assert automated.evaluate(11, 30) == []


def test_windows_in_progress_and_failed_ones(tmp_path):
    automated = Automated(manifest_text(tmp_path, catch_up=3))
    automated.evaluate(9, 30)
    assert automated.evaluate(10, 5) == ["2024-03-01-06:00", "2024-03-01-07:00", "2024-03-01-08:00"]
    automated.materialized(["2024-03-01-06:00", "2024-03-01-07:00"])  # 08:00 failed: still missing
    # A range run of 08:00-09:00 is queued (a backfill): in progress, not requested again.
    automated.queued_range_run("2024-03-01-08:00", "2024-03-01-09:00")
    status = automated.instance.get_status_by_partition(KEY, ["2024-03-01-08:00", "2024-03-01-10:00"], partitions_def_for(automated.manifest))
    assert str(status["2024-03-01-08:00"]) == "AssetPartitionStatus.IN_PROGRESS"
    assert automated.evaluate(12, 5) == ["2024-03-01-10:00"]


def test_each_window_runs_alone_under_automation(tmp_path):
    """The automation daemon groups requested windows by the asset's backfill policy: one window per
    run, so a window that keeps failing never holds back the newer ones."""
    automated = Automated(manifest_text(tmp_path))
    assert automated.asset.backfill_policy.max_partitions_per_run == 1


def test_without_lateness_the_latest_complete_window_is_closed(tmp_path):
    automated = Automated(manifest_text(tmp_path, lateness_s=0, catch_up=2))
    automated.evaluate(9, 30)
    assert automated.evaluate(10, 1) == ["2024-03-01-08:00", "2024-03-01-09:00"]


@pytest.mark.parametrize("first", [datetime(2024, 3, 30, 22, 0, tzinfo=UTC), datetime(2024, 10, 26, 22, 0, tzinfo=UTC)])
def test_no_window_is_requested_before_it_closes_across_a_daylight_saving_change(tmp_path, first):
    """Europe/Berlin hourly windows, lateness 300 s, a tick every 10 minutes through the night the
    clocks change: every window requested has ended at least the lateness before the tick."""
    automated = Automated(manifest_text(tmp_path, lateness_s=300, catch_up=3, timezone="Europe/Berlin", cron="*/10 * * * *"))
    partitions_def = partitions_def_for(automated.manifest)
    requested = []
    for step in range(0, 8 * 6):
        moment = first + timedelta(minutes=10 * step)
        for key in automated.evaluate_at(moment):
            window = partitions_def.time_window_for_partition_key(key)
            assert window.end + timedelta(seconds=300) <= moment, f"{key} requested at {moment}, open until {window.end}"
            requested.append(key)
        automated.materialized(requested[-3:])
    assert len(set(requested)) >= 6  # the night's windows were requested, late by at most two windows
