"""Build Dagster assets from manifests: one asset per manifest (key = manifest name), with its
source as an upstream external asset. Materializing the asset runs the shared engine."""


from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.automation import automation_condition
from dpone_dagster.assets.partitions import is_closed, partition_settings, partitions_def_for, window_for_key
from dpone_dagster.assets.requested import superseded
from dpone_dagster.assets.retries import refuse_retry, tag_retry_budget
from dpone_dagster.engine.locks import dagster_pool
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import DponeError, is_retryable
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.quality.results import check_names
from dpone_dagster.redact import redact_mapping, redact_text
from dpone_dagster.resources.kafka import KafkaResource
from dpone_dagster.resources.schema_registry import SchemaRegistryResource
from dpone_dagster.sources.kafka import TimeWindow

COMMITTED_OFFSETS = "dpone/committed_offsets"
# The topic the committed offsets belong to: offsets of another topic must never be a start point.
SOURCE_TOPIC = "dpone/source_topic"


def source_asset_keys(manifest: Manifest) -> list[AssetKey]:
    """The upstream topic(s) or table: kafka/<topic> per topic (a pattern is one asset), or
    <type>/<schema>/<table>."""
    source = manifest.source
    if not isinstance(source, KafkaSource):
        return [AssetKey([source.type, source.table.schema_, source.table.name])]
    if source.topics:
        return [AssetKey(["kafka", topic]) for topic in source.topics]
    if source.topic_pattern:
        return [AssetKey(["kafka", "pattern", "".join(c if c.isalnum() or c in "_-" else "_" for c in source.topic_pattern)])]
    return [AssetKey(["kafka", source.topic])]


def source_asset_key(manifest: Manifest) -> AssetKey:
    return source_asset_keys(manifest)[0]


def source_asset_specs(manifest: Manifest) -> list[AssetSpec]:
    source = manifest.source
    kind = "kafka" if isinstance(source, KafkaSource) else source.type
    specs = []
    for key in source_asset_keys(manifest):
        what = f"Kafka topic(s) {'/'.join(key.path[1:])}" if kind == "kafka" else f"{source.type} table {source.table.qualified}"
        specs.append(AssetSpec(key=key, description=f"{what} (read by dpone manifests)", kinds={kind}, group_name="sources"))
    return specs


def build_manifest_asset(manifest: Manifest, manifest_path: Path | None = None, upstream: AssetKey | None = None):
    """The asset that runs `manifest`. Its metadata names the sink topic it writes. `upstream`
    replaces the source asset when another manifest produces the source topic."""
    sink = manifest.sink
    description = manifest.description or (
        f"{manifest.source.type} → Kafka topic {sink.topic} ({sink.strategy.mode}, {sink.options.message_format})"
    )

    partitions_def = partitions_def_for(manifest)
    asset_key = AssetKey([manifest.name])
    check_specs = quality_check_specs(manifest, asset_key)

    spec = AssetSpec(
        key=asset_key,
        deps=[upstream] if upstream else source_asset_keys(manifest),
        description=description,
        group_name=manifest.dagster.group_name,
        kinds={"kafka", "spark"},
        metadata={
            "sink_topic": sink.topic,
            "strategy": sink.strategy.mode,
            "manifest": str(manifest_path) if manifest_path else manifest.name,
        },
        partitions_def=partitions_def,
        automation_condition=automation_condition(manifest),
        # Selecting checks alone runs them without materializing the asset.
        skippable=True,
    )

    @multi_asset(
        name=manifest.name,
        specs=[spec],
        backfill_policy=_backfill_policy(manifest) if partitions_def else None,
        # One slot per pool (dagster.yaml): runs that share offsets (one pipeline, or one topic and
        # consumer group) never overlap.
        pool=dagster_pool(manifest),
        check_specs=check_specs,
        # The asset without some checks, or checks without the asset, as Dagster users select them.
        can_subset=True,
    )
    def _materialize(
        context: AssetExecutionContext, pyspark: LazyPySparkResource, kafka: KafkaResource, schema_registry: SchemaRegistryResource
    ):
        keys, windows = _partition_windows(context, manifest)
        stale = superseded(context, asset_key, keys)
        if stale is not None:
            context.log.warning(stale)
            return
        selected = {k.name for k in context.selected_asset_check_keys}
        specs = [s for s in check_specs if s.name in selected]
        publish = asset_key in context.selected_asset_keys
        request = RunRequest(
            run_id=f"{context.run_id}-{context.retry_number}",
            windows=windows,
            fallback_offsets=None if windows else last_committed_offsets(context, manifest),
            log=lambda message: context.log.info(redact_text(message)),
            kafka_config=kafka.client_config,
            registry_config=schema_registry.config,
            checks=frozenset(selected),
            publish=publish,
        )
        tag_retry_budget(context, manifest)
        try:
            result = run_pipeline(manifest, pyspark.spark_session, request)
        except DponeError as exc:
            if not is_retryable(exc):
                refuse_retry(context)
            # Report the gates that ran, then fail: no materialization a later run could trust.
            yield from check_results(specs, exc.result.gates if exc.result else [], complete=False)
            raise Failure(description=redact_text(str(exc))) from None
        yield from check_results(specs, result.gates, complete=True)
        if not publish:
            return  # checks alone: the batch was judged, nothing was published
        metadata = materialization_metadata(result)
        if keys:
            metadata.update(window_metadata(keys, result))
        yield MaterializeResult(metadata=metadata)

    return _materialize


def _backfill_policy(manifest: Manifest) -> BackfillPolicy:
    """A range backfill reads all its windows in one run (offsets are recorded per key). Under
    declarative automation each window runs alone: the automation daemon would group the missing
    windows into one range run, which a single window that keeps failing (its data, retention)
    would fail at every tick, holding back every newer window."""
    return BackfillPolicy.multi_run(1) if manifest.dagster.automation is not None else BackfillPolicy.single_run()


def window_metadata(keys: list[str], result: RunResult) -> dict[str, Any]:
    """Per partition key: the offset ranges read (frozen from then on) and the late records."""
    windows = dict(zip(keys, result.boundary.get("windows", []), strict=True))
    return {
        "offset_ranges_by_partition": MetadataValue.json({key: w["partitions"] for key, w in windows.items()}),
        "late_records": MetadataValue.int(int(result.boundary.get("late_records", 0))),
        "late_records_by_partition": MetadataValue.json({key: w.get("late_records", 0) for key, w in windows.items()}),
        "frozen_partition_keys": MetadataValue.json(sorted(key for key, w in windows.items() if w.get("frozen"))),
    }


def quality_check_specs(manifest: Manifest, asset_key: AssetKey) -> list[AssetCheckSpec]:
    """One asset check per manifest quality check; blocking (downstream waits) in fail mode."""
    blocking = manifest.quality.mode == "fail"
    return [
        AssetCheckSpec(
            name,
            asset=asset_key,
            blocking=blocking,
            description=f"{check.type} ({'pre-publish gate' if check.type != 'source_target_count' else 'post-publish reconciliation'}, {manifest.quality.mode} mode)",
        )
        for name, check in zip(check_names(manifest.quality.checks), manifest.quality.checks, strict=True)
    ]


def check_results(specs: list[AssetCheckSpec], gates: list[dict[str, Any]], complete: bool):
    """Dagster check results from the engine's gate results. On success (`complete`) a check the
    run never reached (e.g. reconciliation when nothing was produced) is reported as skipped."""
    by_name = {g["name"]: g for g in gates}
    for spec in specs:
        gate = by_name.get(spec.name)
        if gate is None:
            if complete:
                yield AssetCheckResult(check_name=spec.name, passed=True, metadata={"skipped": "not evaluated: nothing was produced"})
            continue
        yield AssetCheckResult(
            check_name=spec.name,
            passed=bool(gate["passed"]),
            severity=AssetCheckSeverity.ERROR if gate["severity"] == "fail" else AssetCheckSeverity.WARN,
            description=redact_text(gate["description"]),
            metadata={
                "observed": MetadataValue.text(str(gate["observed"])),
                "threshold": MetadataValue.text(str(gate["threshold"])),
                "phase": gate["phase"],
                "skipped": gate["skipped"],
                "failing_sample": MetadataValue.json(redact_mapping(gate["failing_sample"])),
                **({"observed_value": MetadataValue.float(float(gate["observed"]))} if isinstance(gate["observed"], int | float) else {}),
            },
        )


def _partition_windows(context: AssetExecutionContext, manifest: Manifest) -> tuple[list[str], list[TimeWindow] | None]:
    """The run's partition keys and their windows; refuses windows that are not closed yet."""
    settings = partition_settings(manifest)
    if settings is None or not (context.has_partition_key or context.has_partition_key_range):
        return [], None
    partitions_def = context.assets_def.partitions_def
    keys = list(context.partition_keys)
    windows = [window_for_key(partitions_def, key) for key in keys]
    now = datetime.now(UTC)
    open_keys = [k for k, w in zip(keys, windows, strict=True) if not is_closed(w, settings, now)]
    if open_keys:
        raise Failure(
            description=f"window(s) {open_keys} are not closed yet (allowed lateness "
            f"{settings.allowed_lateness_seconds}s); run them after they end, or raise "
            "source.options.partitions.allowed_lateness_seconds"
        )
    return keys, windows


def last_committed_offsets(context: AssetExecutionContext, manifest: Manifest) -> dict[int, int] | None:
    """Offsets the latest successful materialization recorded (used when the state store is empty)."""
    event = context.instance.get_latest_materialization_event(AssetKey([manifest.name]))
    materialization = event.asset_materialization if event else None
    if materialization is None:
        return None
    value = materialization.metadata.get(COMMITTED_OFFSETS)
    if value is None:
        return None
    topic = materialization.metadata.get(SOURCE_TOPIC)
    if topic is not None and getattr(topic, "value", topic) != getattr(manifest.source, "topic", None):
        return None  # the manifest reads another topic now
    data = value.value if hasattr(value, "value") else value
    return {int(p): int(o) for p, o in dict(data).items()} or None


def materialization_metadata(result: RunResult) -> dict[str, Any]:
    """Numeric values so the UI plots them over time; offsets as JSON for later runs to read."""
    total_s = sum(result.timings.values()) or 0.0
    load_s = result.timings.get("load", 0.0)
    metadata: dict[str, Any] = {
        "dpone/run_id": result.run_id,
        "rows_extracted": MetadataValue.int(result.rows_extracted),
        "messages_produced": MetadataValue.int(result.messages_produced),
        "tombstones": MetadataValue.int(result.tombstones),
        "duplicates_removed": MetadataValue.int(result.duplicates_removed),
        "bytes_produced": MetadataValue.int(result.bytes_produced),
        "duration_s": MetadataValue.float(round(total_s, 3)),
        "throughput_msgs_per_s": MetadataValue.float(
            round(result.messages_produced / load_s, 1) if load_s > 0 else 0.0
        ),
        "offset_ranges": MetadataValue.json(result.offset_ranges),
        COMMITTED_OFFSETS: MetadataValue.json({str(p): o for p, o in result.committed_offsets.items()}),
        SOURCE_TOPIC: MetadataValue.text(str(result.boundary.get("topic", ""))),
        "sink_partitions": MetadataValue.json(result.sink_partitions),
        "executors": MetadataValue.json(result.executors),
    }
    if result.execution_path:
        metadata["execution_path"] = MetadataValue.text(result.execution_path)
    if result.boundary.get("method") == "replication":  # the asset's sink_topic is empty under a topic mapping
        metadata["target_topics"] = MetadataValue.json(result.target_topics(""))
    for stage, seconds in result.timings.items():
        metadata[f"duration_{stage}_s"] = MetadataValue.float(seconds)
    if result.notes:
        metadata["notes"] = MetadataValue.md("\n".join(f"- {n}" for n in result.notes))
    return metadata

