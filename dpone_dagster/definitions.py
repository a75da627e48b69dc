"""The Dagster code location: every manifest in DPONE_MANIFESTS_DIR (default ./manifests) becomes
an asset, with its source as an upstream external asset, plus the Spark, Kafka and Schema
Registry resources. An invalid manifest fails the load with a message naming the file."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    in_process_executor,
)

from dpone_dagster.assets.factory import build_manifest_asset, source_asset_specs
from dpone_dagster.manifest import ManifestError, discover_manifests, load_manifest
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.manifest.rules import Problem
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource, spark_resource
from dpone_dagster.schedules import build_schedule
from dpone_dagster.sensors import build_source_sensor
from dpone_dagster.spark.session import jdbc_jars


def manifests_dir() -> Path:
    return Path(os.environ.get("DPONE_MANIFESTS_DIR", "manifests"))


def build_definitions(directory: str | Path | None = None) -> Definitions:
    directory = Path(directory) if directory is not None else manifests_dir()
    loaded: list[tuple[Path, Manifest]] = []
    names: dict[str, Path] = {}
    for path in discover_manifests(directory):
        manifest = load_manifest(path)
        if manifest.name in names:  # the asset key: Dagster would only say "Duplicate asset key"
            fix = f"'{manifest.name}' is also the name of {names[manifest.name]}; give each manifest its own name"
            raise ManifestError(str(path), [Problem("name", fix)])
        names[manifest.name] = path
        loaded.append((path, manifest))
    # A manifest that reads a topic another manifest writes depends on that manifest's asset.
    producers = {m.sink.topic: AssetKey([m.name]) for _, m in loaded if m.sink.topic}
    assets: list = []
    sensors: list = []
    schedules: list = []
    sources: dict = {}
    for path, manifest in loaded:
        upstream = producers.get(manifest.source.topic) if isinstance(manifest.source, KafkaSource) else None
        assets.append(build_manifest_asset(manifest, path, upstream if upstream != AssetKey([manifest.name]) else None))
        source_sensor = build_source_sensor(manifest)
        if source_sensor is not None:
            sensors.append(source_sensor)
        manifest_schedule = build_schedule(manifest)
        if manifest_schedule is not None:
            schedules.append(manifest_schedule)
        for spec in source_asset_specs(manifest):  # the topics themselves: sensors record lag on them
            sources.setdefault(spec.key, spec)
    automated = [AssetKey([m.name]) for _, m in loaded if m.dagster.automation is not None]
    if automated:
        # Running from the start: declaring `dagster.automation` is the decision to automate.
        sensors.append(
            AutomationConditionSensorDefinition(
                "dpone_automation_sensor",
                target=AssetSelection.assets(*automated),
                default_status=DefaultSensorStatus.RUNNING,
                minimum_interval_seconds=30,
            )
        )
    return Definitions(
        assets=[*sources.values(), *assets],
        sensors=sensors,
        schedules=schedules,
        resources={
            "pyspark": spark_resource(jdbc_jars([m for _, m in loaded])),
            "kafka": KafkaResource(),
            "schema_registry": SchemaRegistryResource(),
        },
        # One Spark session per run: steps run in the run's process.
        executor=in_process_executor,
    )

defs = build_definitions()
