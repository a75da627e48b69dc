"""Sensors on upstream topics: one per manifest with a Kafka source.

- offsets mode: a run request once `min_new_messages` wait beyond the stored offsets. The run key
  is derived from the stored offsets and the watermarks, so it changes whenever a run commits or
  new data arrives; the decision always compares against the stored offsets (never against the
  cursor), so a failed run can never make the sensor skip data.
- time_window mode: a run request per newly closed window that holds data (run key
  `<pipeline>:<partition key>`); the cursor is the last window evaluated.
Every tick records an observation of the source topic asset: watermarks and lag in messages.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dpone_dagster.assets.factory import source_asset_key
from dpone_dagster.assets.partitions import partition_settings, partitions_def_for, window_for_key
from dpone_dagster.engine.lag import SourceLag, source_lag
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.resources.kafka import KafkaResource
from dpone_dagster.sources.kafka import KafkaBatchSource

MAX_WINDOWS_PER_TICK = 24


def build_source_sensor(manifest: Manifest) -> SensorDefinition | None:
    if not isinstance(manifest.source, KafkaSource) or not manifest.dagster.sensor.enabled:
        return None
    if not manifest.source.topic:
        return None  # several topics / a pattern: schedule the replication instead
    options = manifest.dagster.sensor
    asset_key = AssetKey([manifest.name])
    windowed = partition_settings(manifest) is not None

    @sensor(
        name=f"{manifest.name}_on_{_safe(manifest.source.topic)}",
        asset_selection=[asset_key],
        minimum_interval_seconds=options.minimum_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING if options.running_by_default else DefaultSensorStatus.STOPPED,
        description=f"Watches Kafka topic {manifest.source.topic} and requests runs of {manifest.name}",
    )
    def _sensor(context: SensorEvaluationContext, kafka: KafkaResource) -> SensorResult | SkipReason:
        config = kafka.client_config(manifest.source)
        lag = source_lag(manifest, config)
        observation = _observation(manifest, lag)
        if windowed:
            return _window_requests(context, manifest, config, observation)
        return _offset_requests(manifest, lag, observation)

    return _sensor


def _observation(manifest: Manifest, lag: SourceLag) -> AssetObservation:
    return AssetObservation(
        asset_key=source_asset_key(manifest),
        metadata={
            "lag_messages": MetadataValue.int(lag.new_messages),
            "high_watermarks": MetadataValue.json(lag.as_dict()["high_watermarks"]),
            "stored_offsets": MetadataValue.json(lag.as_dict()["stored_offsets"]),
            "pipeline": manifest.name,
        },
    )


def _offset_requests(manifest: Manifest, lag: SourceLag, observation: AssetObservation) -> SensorResult:
    cursor = json.dumps(lag.as_dict()["high_watermarks"], sort_keys=True)
    if lag.new_messages < manifest.dagster.sensor.min_new_messages:
        return SensorResult(
            skip_reason=f"{lag.new_messages} new message(s) < min_new_messages "
            f"{manifest.dagster.sensor.min_new_messages}",
            asset_events=[observation],
            cursor=cursor,
        )
    fingerprint = hashlib.sha256(
        json.dumps([lag.as_dict()["stored_offsets"], lag.as_dict()["high_watermarks"]], sort_keys=True).encode()
    ).hexdigest()[:16]
    request = RunRequest(run_key=f"{manifest.name}:{fingerprint}", tags={"dpone/pipeline": manifest.name})
    return SensorResult(run_requests=[request], asset_events=[observation], cursor=cursor)


def _window_requests(
    context: SensorEvaluationContext, manifest: Manifest, config: dict, observation: AssetObservation
) -> SensorResult:
    settings = partition_settings(manifest)
    partitions_def = partitions_def_for(manifest)
    assert settings is not None and partitions_def is not None
    now = datetime.now(UTC)
    closed = partitions_def.get_partition_keys(current_time=now - timedelta(seconds=settings.allowed_lateness_seconds))
    if not closed:
        return SensorResult(skip_reason="no closed window yet", asset_events=[observation])
    if context.cursor:
        candidates = [k for k in closed if window_for_key(partitions_def, k).start >= window_for_key(partitions_def, context.cursor).end]
    else:
        candidates = closed[-1:]  # first tick: start with the newest closed window, no history
    candidates = candidates[:MAX_WINDOWS_PER_TICK]
    if not candidates:
        return SensorResult(skip_reason="no newly closed window", asset_events=[observation])
    source = KafkaBatchSource(manifest, config)
    windows = [window_for_key(partitions_def, k) for k in candidates]
    boundary = source.plan({}, windows)
    requests = []
    for key, window in zip(candidates, boundary.windows, strict=True):
        if sum(r["end"] - r["start"] for r in window["partitions"]) > 0:
            requests.append(
                RunRequest(run_key=f"{manifest.name}:{key}", partition_key=key, tags={"dpone/pipeline": manifest.name})
            )
    return SensorResult(run_requests=requests, asset_events=[observation], cursor=candidates[-1])


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
