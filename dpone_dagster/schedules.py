"""Time-driven runs, next to (or instead of) the sensor on the source topic.

- `dagster.schedule`: a Dagster schedule `<name>_schedule`. Offsets mode: one run per tick, which
  reads whatever has arrived since the stored offsets (an empty run when nothing has). Time-window
  mode: the same decisions as the sensor (sensors.window_requests): every closed window, lateness
  passed, that holds data and is not materialized, within `sensor.catch_up_windows`, with failed
  windows retried under the sensor's attempts and backoff.
- `dagster.automation.on_cron`: a declarative automation condition on the asset
  (assets/automation.py), evaluated by the daemon's automation sensor.

Use a sensor to follow new data as it arrives, a schedule for fixed times (and to fill missing
windows of a partitioned asset), an automation condition where the rest of the Dagster project
is already driven by declarative automation.
"""

from __future__ import annotations

from dagster import (
    AssetKey,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from dpone_dagster.assets.partitions import partition_settings
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.resources.kafka import KafkaResource
from dpone_dagster.sensors import PIPELINE_TAG, window_requests


def build_schedule(manifest: Manifest) -> ScheduleDefinition | None:
    options = manifest.dagster.schedule
    if options is None:
        return None
    asset_key = AssetKey([manifest.name])
    windowed = partition_settings(manifest) is not None

    @schedule(
        name=f"{manifest.name}_schedule",
        cron_schedule=options.cron,
        execution_timezone=options.timezone,
        target=[asset_key],
        default_status=DefaultScheduleStatus.RUNNING if options.running_by_default else DefaultScheduleStatus.STOPPED,
        description=f"Runs {manifest.name} at {options.cron} ({options.timezone})",
    )
    def _schedule(context: ScheduleEvaluationContext, kafka: KafkaResource) -> list[RunRequest] | SkipReason:
        tags = {PIPELINE_TAG: manifest.name, "dpone/schedule": options.cron}
        if not windowed:
            return [RunRequest(tags=tags)]
        assert isinstance(manifest.source, KafkaSource)
        decision = window_requests(context, manifest, kafka.client_config(manifest.source), None)
        if not decision.requests:
            return SkipReason(decision.reason)
        return [RunRequest(run_key=r.run_key, partition_key=r.partition_key, tags={**r.tags, **tags}) for r in decision.requests]

    return _schedule
