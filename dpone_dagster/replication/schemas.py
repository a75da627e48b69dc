"""schema_mapping: value schemas of the source registry re-registered in the target registry, and
the id map {source id: target id} the tasks use to rewrite the wire-format header (driver only).

Registry ids are per registry, so a replicated Confluent-framed value would point at an unrelated
(or missing) schema on the target side. The driver finds the ids the planned ranges use (one JVM
pass over the ranges), registers each schema under the target topic's subject, and ships the map
to the tasks; executors never contact a registry.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.boundary import ReadTask
from dpone_dagster.manifest.models import SchemaRegistryOptions
from dpone_dagster.replication.plan import PartitionPlan
from dpone_dagster.schema.registry import ensure_registered, registry_client, subject_name
from dpone_dagster.sources.kafka_reader import ReaderSettings, read_ranges


def value_schema_ids(
    spark: SparkSession, plans: list[PartitionPlan], source_config: dict[str, Any], group_id: str
) -> dict[str, list[int]]:
    """Source topic -> schema ids of its framed values in the planned ranges."""
    tasks = [ReadTask(i, p.topic, p.partition, p.start, p.end) for i, p in enumerate(x for x in plans if x.size)]
    if not tasks:
        return {}
    raw = read_ranges(spark, tasks, ReaderSettings(source_config, group_id))
    value = F.col("value")
    framed = (F.length(value) >= 5) & (F.hex(F.substring(value, 1, 1)) == "00")
    rows = (
        raw.where(value.isNotNull())
        .select(
            "topic",
            F.when(framed, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")).alias("id"),
        )
        .distinct()
        .collect()
    )
    out: dict[str, list[int]] = {}
    for row in rows:
        if row["id"] is None:
            raise RunFailed(
                f"schema_mapping: topic '{row['topic']}' holds values that are not in the Schema Registry wire "
                "format; turn schema_mapping off for it"
            )
        out.setdefault(row["topic"], []).append(int(row["id"]))
    return {topic: sorted(ids) for topic, ids in out.items()}


def _record_fullname(schema_type: str, schema_str: str, options: SchemaRegistryOptions) -> str | None:
    if options.record_name:
        return f"{options.record_namespace}.{options.record_name}" if options.record_namespace else options.record_name
    if schema_type == "AVRO":
        try:
            data = json.loads(schema_str)
        except ValueError:
            return None
        if isinstance(data, dict) and data.get("name"):
            name = str(data["name"])
            return name if "." in name or not data.get("namespace") else f"{data['namespace']}.{name}"
    return None


def schema_id_maps(
    ids_by_topic: dict[str, list[int]],
    targets: dict[str, str],
    source_registry: dict[str, Any],
    target_registry: dict[str, Any],
    options: SchemaRegistryOptions,
) -> dict[str, dict[int, int]]:
    """Source topic -> {source schema id: target schema id}, registering in the target as needed."""
    source = registry_client(source_registry)
    target = registry_client(target_registry)
    maps: dict[str, dict[int, int]] = {}
    for topic, ids in sorted(ids_by_topic.items()):
        mapping: dict[int, int] = {}
        for schema_id in ids:
            try:
                schema = source.get_schema(schema_id)
            except Exception as exc:
                raise RunFailed(f"schema_mapping: schema id {schema_id} used in '{topic}' is unknown to the source registry: {exc}") from None
            if schema.references:
                raise ConfigError(
                    f"schema_mapping: schema id {schema_id} of '{topic}' has references; replicating referenced "
                    "schemas is not supported yet"
                )
            schema_type = schema.schema_type or "AVRO"
            subject = subject_name(
                options.subject_name_strategy, targets[topic], _record_fullname(schema_type, schema.schema_str, options)
            )
            mapping[schema_id] = ensure_registered(target, subject, schema.schema_str, schema_type, options.auto_register_schemas)
        maps[topic] = mapping
    return maps
