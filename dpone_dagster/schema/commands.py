"""`dpone schema infer` and `dpone schema physical-plan`: read-only views of a manifest's schemas.

infer: the source schema from a sample (JSON: inferred types, nullability, confidence = share of
non-null values that have the chosen type, empty strings counted apart from nulls; registry
formats: the registered schema). physical-plan: for the Kafka sink, the subject, the schema that
would be registered and the evolution actions against the subject's latest version.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.types import StructType

from dpone_dagster.connections import resolve_kafka
from dpone_dagster.errors import ConfigError
from dpone_dagster.kafka.boundary import Boundary
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.schema.inference import field_stats, infer_schema


def _source(manifest: Manifest):
    from dpone_dagster.sources.kafka import KafkaBatchSource

    if not isinstance(manifest.source, KafkaSource):
        raise ConfigError("schema infer reads Kafka sources; SQL sources take their schema from the database")
    connection = resolve_kafka(manifest.source)
    registry = connection.schema_registry_config() if manifest.source.options.message_format != "json" else None
    return KafkaBatchSource(manifest, connection.client_config(), registry)


def _whole_topic(source) -> Boundary:
    """Sample what the topic holds now (the whole retained log), not only what the next run reads."""
    from dpone_dagster.kafka import inspect
    from dpone_dagster.kafka.boundary import plan_offset_ranges

    consumer = inspect.make_consumer(source.client_config, source.group_id)
    try:
        partitions = inspect.topic_partitions(consumer, source.topic)
        watermarks = inspect.verified_watermarks(consumer, source.topic, partitions)
    finally:
        consumer.close()
    return plan_offset_ranges(source.topic, watermarks, {}, "earliest")


def infer(manifest: Manifest) -> dict[str, Any]:
    return _infer(manifest)[0]


def _infer(manifest: Manifest) -> tuple[dict[str, Any], StructType]:
    source = _source(manifest)
    fmt = source.options.message_format
    if source.options.schema_ is not None:
        from dpone_dagster.spark.session import get_spark

        get_spark({"spark.master": "local[1]"})  # Spark's own parser reads the declared types
        schema = source._schema([], "flat")
        return {"topic": source.topic, "method": "declared in source.options.schema", "fields": _declared(schema)}, schema
    if fmt != "json":
        return _registry_infer(source)
    boundary = _whole_topic(source)
    values = source.sample_values(boundary) if boundary.total else []
    envelope = source.resolve_envelope(values)
    rows = [v["data"] if envelope == "dpone" else v for v in values if isinstance(v, dict)]
    if envelope == "dpone":
        rows = [r for r in rows if isinstance(r, dict)]
    schema = infer_schema(rows)
    stats = field_stats(rows)
    fields = []
    for f in schema.fields:
        s = stats.get(f.name)
        seen = s.seen if s else 0
        non_null = seen - (s.nulls if s else 0)
        dominant = max(s.types.values()) if s and s.types else 0
        empty = sum(1 for r in rows if r.get(f.name) == "")
        fields.append(
            {
                "name": f.name,
                "type": f.dataType.simpleString(),
                "nullable": (s is None) or s.nulls > 0 or seen < len(rows),
                "null_ratio": round(1 - non_null / len(rows), 4) if rows else None,
                "empty_strings": empty,
                "confidence": round(dominant / non_null, 4) if non_null else 0.0,
                "observed_types": dict(s.types) if s else {},
            }
        )
    summary = {"topic": source.topic, "method": f"sampled {len(rows)} record(s)", "envelope": envelope, "fields": fields}
    return summary, schema


def _registry_infer(source) -> tuple[dict[str, Any], StructType]:
    from dpone_dagster.schema.registry import collect_references, fetch_latest, registry_client, subject_name

    fmt = source.options.message_format
    client = registry_client(source.registry_config or {})
    subject = subject_name("topic", source.topic, None)
    latest = fetch_latest(client, subject, fmt)
    if latest is None:
        raise ConfigError(f"subject {subject!r} has no registered schema; produce with a registry serializer first")
    files: dict[str, str] = {}  # protobuf imports: executors and this view rebuild descriptors from them
    if fmt == "protobuf" and latest.schema.references:
        collect_references(client, latest.schema.references, files, "PROTOBUF")
    schema = source.registry_schema(
        fmt,
        {latest.schema_id: (latest.schema.schema_type, latest.schema.schema_str)},
        {latest.schema_id: tuple(files.items())},
    )
    summary = {
        "topic": source.topic,
        "method": f"registered schema {subject} version {latest.version} (id {latest.schema_id})",
        "fields": _declared(schema, confidence=1.0),
    }
    return summary, schema


def _declared(schema: StructType, confidence: float | None = None) -> list[dict[str, Any]]:
    return [
        {"name": f.name, "type": f.dataType.simpleString(), "nullable": f.nullable, "confidence": confidence}
        for f in schema.fields
    ]


def physical_plan(manifest: Manifest) -> dict[str, Any]:
    from dpone_dagster.manifest.rules import REGISTRY_FORMATS
    from dpone_dagster.sinks.registry import record_name, writer_schema_text

    inferred, source_schema = _infer(manifest)
    sink = manifest.sink
    fmt = sink.options.message_format
    out: dict[str, Any] = {
        "sink_topic": sink.topic,
        "message_format": fmt,
        "key": sink.options.key.model_dump(),
        "source_schema": inferred,
    }
    if fmt not in REGISTRY_FORMATS:
        out["target"] = "JSON objects (no registry): schema evolution on the target side is a no-op"
        return out
    if fmt == "protobuf":
        out["target"] = f"protobuf message {sink.options.schema_registry.protobuf_message} (schema from the class)"
        return out
    from dpone_dagster.schema.evolution import plan_evolution
    from dpone_dagster.schema.registry import fetch_latest, registry_client, subject_name
    from dpone_dagster.sinks.registry import target_schema

    options = sink.options.schema_registry
    name, namespace = record_name(manifest)
    subject = subject_name(options.subject_name_strategy, sink.topic, f"{namespace}.{name}")
    config = resolve_kafka(sink).schema_registry_config()
    latest = fetch_latest(registry_client(config), subject) if config else None
    target = target_schema(fmt, latest.schema.schema_str) if latest else None
    evolution = plan_evolution(source_schema, target, options.compatibility, sink.options.on_type_change)
    out.update(
        {
            "subject": subject,
            "latest_version": latest.version if latest else None,
            "evolution": evolution.as_dict(),
            "schema_to_register": json.loads(writer_schema_text(fmt, evolution.result_schema, name, namespace)),
            "auto_register_schemas": options.auto_register_schemas,
        }
    )
    return out


def render(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, default=str)
    lines = []
    schema = data.get("source_schema", data)
    lines += [f"# Source schema of {schema['topic']}", "", f"Method: {schema['method']}", ""]
    lines += ["| field | type | nullable | confidence |", "|---|---|---|---|"]
    for f in schema["fields"]:
        lines.append(f"| {f['name']} | {f['type']} | {f['nullable']} | {f.get('confidence')} |")
    if "sink_topic" in data:
        lines += ["", f"# Physical plan for {data['sink_topic']} ({data['message_format']})", ""]
        for key in ("target", "subject", "latest_version", "auto_register_schemas"):
            if key in data:
                lines.append(f"- **{key}**: `{data[key]}`")
        if "evolution" in data:
            lines += ["", "Evolution actions:", ""]
            lines += [f"- {a['kind']} `{a['path']}`: {a['detail']}" for a in data["evolution"]["actions"]] or ["- none"]
            lines += ["", "Schema to register:", "", "```json", json.dumps(data["schema_to_register"], indent=2), "```"]
    return "\n".join(lines)
