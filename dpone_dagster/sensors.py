"""Sensors on upstream topics: one per manifest with a Kafka source.

- offsets mode: a run request once `min_new_messages` wait beyond the stored offsets. The waiting
  data is named by a fingerprint of the stored offsets and the watermarks (tag
  `dpone/waiting_data`), so it changes whenever a run commits or new data arrives; the decision
  always compares against the stored offsets (never against the cursor), so a failed run can never
  make the sensor skip data. A failed run is asked for again with no new data, like a window below.
- time_window mode: a run request for every closed window (allowed lateness passed) that holds
  data and is not materialized, from the oldest window still watched (the cursor; on the first
  tick `catch_up_windows` back, and never further back than that) on, at most 24 per tick. A
  window whose run failed is requested again after a backoff
  (`retry_backoff_seconds`, doubled per failure) until `max_attempts` runs failed; run key
  `<pipeline>:<partition key>:<attempt>`, tags `dpone/attempt`, `dpone/max_attempts`,
  `dpone/backoff_seconds`, `dpone/requested_at`. A window that any run is materializing (UI, CLI,
  a range backfill, a schedule: Dagster's planned materializations per partition) is not
  requested; a requested run that starts after another run materialized its window produces
  nothing (assets/requested.py). A window retention has taken records of (on_retention_gap:
  fail) is reported once, in the skip reason and as `windows_lost_to_retention` on the asset,
  and left behind: newer windows go on.
Both modes leave a failed run alone while Dagster's run retries have it (`dagster/will_retry`), and
for good when it failed on its data (`dagster/retry_on_asset_or_op_failure: false`, see
assets/retries.py): the same data would fail the same way.
Every tick records an observation of the source topic asset: watermarks and lag in messages.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from dagster._core.storage.partition_status_cache import AssetPartitionStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG

from dpone_dagster.assets.factory import source_asset_key
from dpone_dagster.assets.partitions import partition_settings, partitions_def_for, window_for_key
from dpone_dagster.assets.requested import REQUESTED_AT
from dpone_dagster.assets.retries import RETRY_ON_FAILURE_TAG, WILL_RETRY_TAG
from dpone_dagster.engine.lag import SourceLag, source_lag
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.resources.kafka import KafkaResource
from dpone_dagster.sources.kafka import KafkaBatchSource

MAX_WINDOWS_PER_TICK = 24


class HasInstance(Protocol):
    """A sensor's or a schedule's evaluation context: the instance is all the decisions read."""

    @property
    def instance(self) -> DagsterInstance: ...
PIPELINE_TAG = "dpone/pipeline"
FINGERPRINT_TAG = "dpone/waiting_data"  # offsets mode: which stored offsets and watermarks a run was asked for


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
        return _offset_requests(context, manifest, lag, observation)

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


def _offset_requests(
    context: SensorEvaluationContext, manifest: Manifest, lag: SourceLag, observation: AssetObservation
) -> SensorResult:
    waiting = lag.as_dict()
    cursor = json.dumps(waiting["high_watermarks"], sort_keys=True)
    if lag.new_messages < manifest.dagster.sensor.min_new_messages:
        return SensorResult(
            skip_reason=f"{lag.new_messages} new message(s) < min_new_messages "
            f"{manifest.dagster.sensor.min_new_messages}",
            asset_events=[observation],
            cursor=cursor,
        )
    # The waiting data: unchanged until a run commits or new records arrive.
    fingerprint = hashlib.sha256(
        json.dumps([waiting["stored_offsets"], waiting["high_watermarks"]], sort_keys=True).encode()
    ).hexdigest()[:16]
    decision = _attempt(context, manifest, {FINGERPRINT_TAG: fingerprint}, f"{manifest.name}:{fingerprint}", datetime.now(UTC))
    if isinstance(decision, str):
        return SensorResult(skip_reason=f"{lag.new_messages} new message(s): {decision}", asset_events=[observation], cursor=cursor)
    return SensorResult(run_requests=[decision], asset_events=[observation], cursor=cursor)


def _window_requests(
    context: SensorEvaluationContext, manifest: Manifest, config: dict, observation: AssetObservation
) -> SensorResult:
    decision = window_requests(context, manifest, config, context.cursor)
    events = [observation]
    if decision.lost:  # reported once: the cursor moves past them
        events.append(
            AssetObservation(
                asset_key=AssetKey([manifest.name]),
                metadata={"windows_lost_to_retention": MetadataValue.json(decision.lost), "pipeline": manifest.name},
            )
        )
    if decision.requests:
        return SensorResult(run_requests=decision.requests, asset_events=events, cursor=decision.cursor)
    return SensorResult(skip_reason=decision.reason, asset_events=events, cursor=decision.cursor)


class WindowDecision(NamedTuple):
    requests: list[RunRequest]
    reason: str  # why nothing (more) is requested
    cursor: str | None  # the oldest window still watched
    lost: list[str]  # windows retention took part of (on_retention_gap: fail), left behind


def window_requests(context: HasInstance, manifest: Manifest, config: dict, cursor: str | None) -> WindowDecision:
    """Runs for the closed windows (lateness passed) that hold data and are neither materialized
    nor being materialized, from the oldest window still watched on; or why none."""
    settings = partition_settings(manifest)
    partitions_def = partitions_def_for(manifest)
    assert settings is not None and partitions_def is not None
    options = manifest.dagster.sensor
    now = datetime.now(UTC)
    closed = partitions_def.get_partition_keys(current_time=now - timedelta(seconds=settings.allowed_lateness_seconds))
    if not closed:
        return WindowDecision([], "no closed window yet", cursor, [])
    since = _since(cursor, closed, options.catch_up_windows)
    watched = closed[closed.index(since):]
    asset_key = AssetKey([manifest.name])
    materialized = context.instance.get_materialized_partitions(asset_key)
    pending = [k for k in watched if k not in materialized]
    # Planned materializations of any launcher (UI, CLI, a range backfill, a schedule), per partition.
    status = context.instance.get_status_by_partition(asset_key, pending, partitions_def) or {}
    in_progress = {k for k, s in status.items() if s == AssetPartitionStatus.IN_PROGRESS}
    lost = _lost_to_retention(manifest, config, partitions_def, pending)
    sizes = _window_sizes(manifest, config, partitions_def, watched, [k for k in pending if k not in lost])
    requests, waiting = [], []
    if lost:
        waiting.append(
            f"window(s) {lost} can no longer be read: retention removed records of them (on_retention_gap: fail); "
            "left behind, newer windows go on (materialize them by hand with on_retention_gap: warn to read what is left)"
        )
    for key in [k for k in pending if sizes.get(k)][:MAX_WINDOWS_PER_TICK]:
        if key in in_progress:
            waiting.append(f"{key}: a run materializing it is under way")
            continue
        decision = _attempt(context, manifest, {PARTITION_NAME_TAG: key}, f"{manifest.name}:{key}", now, partition_key=key)
        if isinstance(decision, str):
            waiting.append(f"{key}: {decision}")
        else:
            requests.append(decision)
    reason = "; ".join(waiting) if waiting else f"no closed window with data left to materialize since {since}"
    settled = materialized | set(lost)  # a window retention took is reported once, then left behind
    return WindowDecision(requests, reason, json.dumps({"since": _settled_until(watched, settled, sizes)}), lost)


def _lost_to_retention(manifest: Manifest, config: dict, partitions_def: Any, pending: list[str]) -> list[str]:
    """Pending windows a run would refuse because retention removed records of them (their start
    is before the oldest instant every partition still holds; on_retention_gap: fail)."""
    assert isinstance(manifest.source, KafkaSource)
    if not pending or manifest.source.options.retention_gap_policy != "fail":
        return []
    complete_since = KafkaBatchSource(manifest, config).complete_since_ms()
    if complete_since is None:
        return []
    return [k for k in pending if window_for_key(partitions_def, k).start_ms < complete_since]


def _since(cursor: str | None, closed: list[str], catch_up: int) -> str:
    """The oldest window still watched: the cursor's, never more than `catch_up` closed windows
    back (the first tick's horizon; older windows are left to backfills, which also bounds the
    lookups of one tick)."""
    horizon = max(0, len(closed) - catch_up)
    if cursor:
        try:
            since = json.loads(cursor).get("since")
        except (ValueError, AttributeError):
            since = cursor  # a cursor of an earlier sensor version: the last window it evaluated
        if since in closed:
            return closed[max(horizon, closed.index(since))]
    return closed[horizon]


def _window_sizes(
    manifest: Manifest, config: dict, partitions_def: Any, watched: list[str], pending: list[str]
) -> dict[str, int]:
    """Offsets each pending window holds, planned as a run would plan it (recorded ranges first)."""
    if not pending:
        return {}
    from dpone_dagster.engine.time_windows import load_recorded
    from dpone_dagster.state.open import open_manifest_state_store

    span = watched[watched.index(pending[0]) : watched.index(pending[-1]) + 1]
    store = open_manifest_state_store(manifest)
    try:
        recorded = load_recorded(manifest, store)
    finally:
        store.close()
    windows = [window_for_key(partitions_def, k) for k in span]
    boundary = KafkaBatchSource(manifest, config).plan({}, windows, recorded)
    return {key: sum(r["end"] - r["start"] for r in w["partitions"]) for key, w in zip(span, boundary.windows, strict=True)}


def _attempt(
    context: HasInstance,
    manifest: Manifest,
    work: dict[str, str],
    run_key: str,
    now: datetime,
    partition_key: str | None = None,
) -> RunRequest | str:
    """The next run of one piece of work (a window, or the data waiting in offsets mode; `work`
    are the tags that name it), or why not now: a run of it is under way, Dagster is retrying
    its failed run, its last run failed on its data, its attempts are used up, or the backoff
    after its last failure has not passed."""
    options = manifest.dagster.sensor
    records = context.instance.get_run_records(
        filters=RunsFilter(tags={**work, PIPELINE_TAG: manifest.name}), limit=options.max_attempts + 1
    )
    if any(not r.dagster_run.is_finished for r in records):
        return "a run is under way"
    failures = [r for r in records if r.dagster_run.status == DagsterRunStatus.FAILURE]
    if records and records[0].dagster_run.status == DagsterRunStatus.FAILURE:
        latest = records[0].dagster_run.tags
        if latest.get(WILL_RETRY_TAG) == "true":
            return "Dagster is retrying its failed run"
        if latest.get(RETRY_ON_FAILURE_TAG) == "false":
            return "its last run failed on its data (quality gate or bad record), not retried; fix and materialize by hand"
    if len(failures) >= options.max_attempts:
        return f"gave up after {len(failures)} failed run(s) (max_attempts {options.max_attempts}); materialize it by hand"
    backoff = options.retry_backoff_seconds * 2 ** (len(failures) - 1) if failures else 0
    if failures:
        ended = max(r.end_time or r.create_timestamp.timestamp() for r in failures)
        left = ended + backoff - now.timestamp()
        if left > 0:
            return f"retry {len(failures) + 1} in {int(left) + 1}s (backoff {backoff}s)"
    attempt = len(failures) + 1
    return RunRequest(
        run_key=f"{run_key}:{attempt}",
        partition_key=partition_key,
        tags={
            **({} if partition_key else work),
            PIPELINE_TAG: manifest.name,
            REQUESTED_AT: f"{now.timestamp():.3f}",  # a window materialized since is not produced again
            "dpone/attempt": str(attempt),
            "dpone/max_attempts": str(options.max_attempts),
            "dpone/backoff_seconds": str(backoff),
        },
    )


def _settled_until(watched: list[str], materialized: Any, sizes: dict[str, int]) -> str:
    """The first watched window that may still need a run. A window is settled once materialized,
    or when it is empty and a later window is materialized: its offsets are then bounded by that
    window's recorded start, and records appended later land after it."""
    later_materialized = False
    unsettled = watched[-1]
    for key in reversed(watched):
        done = key in materialized or (later_materialized and sizes.get(key) == 0)
        later_materialized = later_materialized or key in materialized
        if not done:
            unsettled = key
    return unsettled


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
