"""Schema Registry formats on the Kafka sink: plan the schema evolution against the subject's
latest schema, register the result (when allowed) and encode values (and keys) on Spark.

An Avro subject evolves from its registered schema (`schema.avro_evolution`): names, enums, logical
types, defaults and docs stay as registered, and the values are encoded with exactly the schema
registered. The evolved schema is checked the way the registry will check it
(`schema.avro_compat`) before it is registered. All of this runs before anything is produced: a
breaking change fails the run with nothing written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster.errors import DataRefused
from dpone_dagster.manifest.models import KafkaSink, Manifest
from dpone_dagster.schema import avro, avro_compat, json_schema, protobuf
from dpone_dagster.schema.avro_evolution import evolve_avro_schema
from dpone_dagster.schema.evolution import EvolutionPlan, plan_evolution
from dpone_dagster.schema.registry import (
    ensure_references,
    ensure_registered,
    fetch_latest,
    fetch_versions,
    registry_client,
    registry_errors,
    schema_type_of,
    subject_name,
)
from dpone_dagster.spark.registry_codec import KeyEncoding, apply_routes, encode_registry, key_schema


@dataclass(frozen=True)
class RegistryWritePlan:
    fmt: str
    subject: str
    schema_id: int
    schema_str: str
    evolution: EvolutionPlan | None
    message_indexes: tuple[int, ...] | None = None
    references: tuple[tuple[str, str], ...] = ()
    key: KeyEncoding | None = None
    registered: bool = True  # False: not registered by the run (checks only): ids 0, or those looked up

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.fmt,
            "subject": self.subject,
            "schema_id": self.schema_id if self.registered else None,
            "key_subject_schema_id": self.key.schema_id if self.key and self.registered else None,
            "registered": self.registered,
            "evolution": self.evolution.as_dict() if self.evolution else None,
        }


def record_name(manifest: Manifest) -> tuple[str, str]:
    """Stable Avro/JSON record name and namespace: explicit, or derived from the sink topic."""
    options = manifest.sink.options.schema_registry
    name = options.record_name or avro.safe_name(manifest.sink.topic.replace(".", "_").replace("-", "_"))
    namespace = options.record_namespace or "dpone"
    return name, namespace


def writer_schema_text(fmt: str, schema: StructType, name: str, namespace: str) -> str:
    if fmt == "avro":
        return json.dumps(avro.spark_to_avro(schema, name, namespace))
    return json.dumps(json_schema.spark_to_json_schema(schema, f"{namespace}.{name}"))


def target_schema(fmt: str, schema_str: str) -> StructType:
    return avro.avro_to_spark(schema_str) if fmt == "avro" else json_schema.json_schema_to_spark(schema_str)


def plan_registry_write(manifest: Manifest, source_schema: StructType, registry_config: dict[str, Any], register: bool = True) -> RegistryWritePlan:
    """Evolve the value schema against the subject (or take the protobuf class) and register it;
    `register` False (a checks-only run): planned only, nothing written to the registry."""
    with registry_errors(registry_config):
        client = registry_client(registry_config)
        prepared = _prepare(manifest, source_schema, client)
        return _register(manifest, prepared, client) if register else _checked_unregistered(manifest, prepared, client)


@dataclass(frozen=True)
class PreparedSchema:
    """The value schema a run writes with, planned from the subject (nothing registered yet)."""

    fmt: str
    subject: str
    schema_str: str
    evolution: EvolutionPlan | None
    result: StructType | None  # the schema's fields as Spark types (what the key subject derives from)
    message_indexes: tuple[int, ...] | None = None  # protobuf: the message within its file
    references: tuple[tuple[str, str], ...] = ()  # protobuf: the files it imports (name, schema)


def prepare_registry_schema(manifest: Manifest, source_schema: StructType, registry_config: dict[str, Any]) -> PreparedSchema:
    """The evolved value schema of an Avro or JSON Schema sink, refused when breaking, or a protobuf
    sink's generated message; reads the registry, writes nothing (register it with
    `register_prepared`)."""
    with registry_errors(registry_config):
        return _prepare(manifest, source_schema, registry_client(registry_config))


# What a run into a sink without a registry notes of schema evolution.
NO_REGISTRY = {"target": "no registry: the target side of schema evolution is a no-op"}


def plan_unregistered(manifest: Manifest, prepared: PreparedSchema, registry_config: dict[str, Any]) -> RegistryWritePlan:
    """A checks-only run's plan of a prepared schema: nothing written to the registry; without
    auto_register_schemas the schemas are looked up, as a publishing run looks them up (failing
    where the registry lacks them)."""
    with registry_errors(registry_config):
        return _checked_unregistered(manifest, prepared, registry_client(registry_config))


def _checked_unregistered(manifest: Manifest, prepared: PreparedSchema, client: Any) -> RegistryWritePlan:
    """`plan_unregistered` with a client: with auto-registration ids 0 (the frames keep their
    size) and no registry call; without it the lookups `_register` makes."""
    if not manifest.sink.options.schema_registry.auto_register_schemas:
        return replace(_register(manifest, prepared, client), registered=False)
    key = planned_key(manifest, prepared) if prepared.fmt != "protobuf" else None
    return RegistryWritePlan(
        prepared.fmt, prepared.subject, 0, prepared.schema_str, prepared.evolution, prepared.message_indexes, prepared.references, key, registered=False
    )


def register_prepared(manifest: Manifest, prepared: PreparedSchema, registry_config: dict[str, Any]) -> RegistryWritePlan:
    """Register a prepared value schema (and the key subject's, for registry-encoded keys)."""
    with registry_errors(registry_config):
        return _register(manifest, prepared, registry_client(registry_config))


def _register(manifest: Manifest, prepared: PreparedSchema, client: Any) -> RegistryWritePlan:
    auto = manifest.sink.options.schema_registry.auto_register_schemas
    if prepared.fmt == "protobuf":  # the imported files first, then the message's file
        message_class = protobuf.load_message_class(manifest.sink.options.schema_registry.protobuf_message or "")
        refs = ensure_references(client, protobuf.dependency_files(message_class), auto)
        references = [refs[name] for name in protobuf.direct_imports(message_class) if name in refs]
        schema_id = ensure_registered(client, prepared.subject, prepared.schema_str, "PROTOBUF", auto, references)
        return RegistryWritePlan(
            "protobuf", prepared.subject, schema_id, prepared.schema_str, None, prepared.message_indexes, prepared.references
        )
    schema_id = ensure_registered(client, prepared.subject, prepared.schema_str, schema_type_of(prepared.fmt), auto)
    key = _key_encoding(manifest, client, prepared)
    return RegistryWritePlan(prepared.fmt, prepared.subject, schema_id, prepared.schema_str, prepared.evolution, key=key)


def _prepare(manifest: Manifest, source_schema: StructType, client: Any) -> PreparedSchema:
    sink: KafkaSink = manifest.sink
    options = sink.options.schema_registry
    fmt = sink.options.message_format
    if fmt == "protobuf":
        return _prepare_protobuf(manifest)
    name, namespace = record_name(manifest)
    fullname = f"{namespace}.{name}"
    subject = subject_name(options.subject_name_strategy, sink.topic, fullname)
    latest = fetch_latest(client, subject)
    target = target_schema(fmt, latest.schema.schema_str) if latest is not None else None
    versions = [v.schema.schema_str for v in fetch_versions(client, subject)] if latest is not None else []
    history = tuple(target_schema(fmt, text) for text in versions[:-1])
    if sink.options.schema_evolution:
        evolution = plan_evolution(source_schema, target, options.compatibility, sink.options.on_type_change, history)
        evolution.raise_if_breaking(subject)
        result = evolution.result_schema
    else:
        evolution, result = None, target or source_schema
    if latest is None:
        schema_str = writer_schema_text(fmt, result, name, namespace)
    elif evolution is None or not evolution.changed:
        schema_str = latest.schema.schema_str  # nothing to change: write with the registered schema
    elif fmt == "avro":
        schema_str, evolution = _evolved_avro(subject, latest.schema.schema_str, versions, evolution)
    else:
        schema_str = writer_schema_text(fmt, result, name, namespace)
    return PreparedSchema(fmt, subject, schema_str, evolution, result)


def _evolved_avro(subject: str, registered: str, versions: list[str], evolution: EvolutionPlan) -> tuple[str, EvolutionPlan]:
    """The registered Avro schema with the plan's changes, refused (nothing registered, nothing
    produced) when the registry would refuse it under the plan's compatibility mode."""
    evolved = evolve_avro_schema(registered, evolution.result_schema)
    if evolved == json.loads(registered):
        return registered, evolution
    issues = avro_compat.compatibility_issues(evolved, versions or [registered], evolution.compatibility)
    evolution = evolution.with_breaking([_issue(text) for text in issues])
    evolution.raise_if_breaking(subject)
    return json.dumps(evolved), evolution


def _issue(text: str) -> tuple[str, str]:
    path, _, why = text.partition(": ")
    return path, f"the registered Avro schema cannot take this change: {why}"


def _prepare_protobuf(manifest: Manifest) -> PreparedSchema:
    """The generated message class a protobuf sink writes with (no evolution: the class is the schema)."""
    from dpone_dagster.errors import ConfigError

    sink = manifest.sink
    options = sink.options.schema_registry
    if not options.protobuf_message:
        raise ConfigError(
            "sink.options.schema_registry.protobuf_message: message_format protobuf needs the generated "
            "message class, e.g. protobuf_message: 'mypkg.orders_pb2:Order' (importable on the driver)"
        )
    message_class = protobuf.load_message_class(options.protobuf_message)
    subject = subject_name(options.subject_name_strategy, sink.topic, message_class.DESCRIPTOR.full_name)
    files = tuple((f.name, f.schema_str) for f in protobuf.dependency_files(message_class))
    return PreparedSchema(
        "protobuf", subject, protobuf.schema_string(message_class), None, None, tuple(protobuf.message_indexes(message_class)), files
    )


def encodes_keys(sink: KafkaSink) -> bool:
    """Keys are registry-encoded: key.format avro | json_schema, keyed by the unique key, beside
    an Avro or JSON Schema value. Such a key is the record of the key columns, so a delete
    without them (a source tombstone) has none (pure)."""
    options = sink.options
    return options.key.format in ("avro", "json_schema") and options.key.mode == "unique_key" and options.message_format in ("avro", "json_schema")


def planned_key(manifest: Manifest, prepared: PreparedSchema) -> KeyEncoding | None:
    """The `-key` subject's schema of registry-encoded keys (key.format avro | json_schema, keyed
    by the unique key, beside an Avro or JSON Schema value), id 0 until registered; None when
    keys are not registry-encoded (pure)."""
    sink = manifest.sink
    key_format = sink.options.key.format
    if not encodes_keys(sink) or prepared.result is None:
        return None
    columns = sink.strategy.unique_key_columns
    name, namespace = record_name(manifest)
    key_text = writer_schema_text(key_format, key_schema(prepared.result, columns), f"{name}_key", namespace)
    return KeyEncoding(key_format, 0, key_text, tuple(columns))


def _key_encoding(manifest: Manifest, client: Any, prepared: PreparedSchema) -> KeyEncoding | None:
    key = planned_key(manifest, prepared)
    if key is None:
        return None
    subject = subject_name("topic", manifest.sink.topic, None, is_key=True)
    schema_id = ensure_registered(
        client, subject, key.schema_str, schema_type_of(key.fmt), manifest.sink.options.schema_registry.auto_register_schemas
    )
    return replace(key, schema_id=schema_id)


def encode_messages(keyed: DataFrame, plan: RegistryWritePlan, payload: list[str], tombstone_column: str) -> DataFrame:
    """Replace the `value` column (and `key` for registry keys) with Confluent-framed bytes."""
    if plan.evolution is not None:
        keyed = apply_routes(keyed, plan.evolution)
        payload = [f.name for f in plan.evolution.result_schema.fields if f.name in keyed.columns]
    if plan.fmt == "avro":
        refuse_unknown_symbols(keyed, plan, payload, tombstone_column)
    return encode_registry(
        keyed,
        plan.fmt,
        plan.schema_id,
        plan.schema_str,
        payload,
        null_value_column=tombstone_column,
        message_indexes=plan.message_indexes,
        references=plan.references,
        key=plan.key,
    )


def refuse_unknown_symbols(df: DataFrame, plan: RegistryWritePlan, columns: list[str], tombstone_column: str) -> None:
    """Values of top-level enum fields that are not symbols of the registered enum cannot be
    encoded; one Spark job finds them before anything is produced (the producer tasks would fail
    part-way otherwise). Enums nested deeper are checked when each value is encoded."""
    enums = {c: e for c, e in avro.enum_fields(plan.schema_str).items() if c in columns}
    if not enums:
        return
    live = df.where(~F.coalesce(F.col(tombstone_column), F.lit(False)))
    bad = {c: F.col(c).isNotNull() & ~F.col(c).cast("string").isin(*symbols) for c, (_, symbols) in enums.items()}
    row = live.select(
        *[F.count(F.when(cond, 1)).alias(f"n_{i}") for i, cond in enumerate(bad.values())],
        *[F.first(F.when(cond, F.col(c).cast("string")), ignorenulls=True).alias(f"v_{i}") for i, (c, cond) in enumerate(bad.items())],
    ).first()
    problems = [
        f"{column}: {row[f'n_{i}']} value(s) such as {row[f'v_{i}']!r} are not symbols of enum {enums[column][0]} "
        f"{list(enums[column][1])}"
        for i, column in enumerate(bad)
        if row is not None and row[f"n_{i}"]
    ]
    if problems:
        raise DataRefused(
            f"values do not fit the {f'registered schema id {plan.schema_id}' if plan.registered else 'planned schema'} of subject {plan.subject!r}: "
            + "; ".join(problems)
            + ". Nothing was produced. Map the values to the enum's symbols in the source, or add the symbols "
            "to the enum in the registry (a compatible change) first"
        )
