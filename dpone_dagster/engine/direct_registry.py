"""The Schema Registry side of a direct-path run into an Avro, JSON Schema or protobuf sink
(engine/direct.py).

The value schema is planned from the subject before the scan — the registry is read, nothing is
written — so that the tasks encode every value with it (unframed). It is registered only once
every gate has passed, just before producing; the produce tasks then put the Confluent frame with
its id (protobuf: and the message indexes) in front of each value; a type change routed to a new
column (on_type_change: new_column) moves the column's values there. Registry-encoded keys
(key.format avro | json_schema) are planned and registered the same way, under the `-key`
subject. A batch whose schema change routes a nested or key column, or has columns the evolved
schema leaves out, goes to the Spark SQL path; columns a schema without evolution lacks fail the run
once registered, as there.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from dpone_dagster.engine.results import RunResult
from dpone_dagster.formats import registry_values
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.schema.values import nullable_schema
from dpone_dagster.schema.wire_format import frame
from dpone_dagster.sinks.registry import (
    NO_REGISTRY,
    PreparedSchema,
    plan_unregistered,
    planned_key,
    prepare_registry_schema,
    register_prepared,
)
from dpone_dagster.spark.registry_codec import KeyEncoding, refuse_unknown_columns, writer_schema

FORMATS = ("json", *registry_values.FORMATS)  # sink formats the direct path writes


def refusal(manifest: Manifest) -> str | None:
    """Why a run cannot take the direct path for its sink's format, from the manifest alone (pure)."""
    options = manifest.sink.options
    if options.message_format not in FORMATS:
        return f"sink message_format {options.message_format}"
    return None


def prepare(manifest: Manifest, payload: StructType, registry_config: dict[str, Any] | None) -> tuple[PreparedSchema | None, str | None]:
    """The value schema to encode with (None for a JSON sink), or why the Spark SQL path writes it."""
    fmt = manifest.sink.options.message_format
    if fmt not in registry_values.FORMATS:
        return None, None
    assert registry_config is not None
    # The decoded batch's fields are all nullable, as Spark's JSON decoder makes them.
    prepared = prepare_registry_schema(manifest, nullable_schema(payload), registry_config)
    if any("." in column for column, _ in routes_of(prepared)):
        return None, "a type change of a nested column routed to a new column (on_type_change: new_column)"
    unknown = sorted(set(payload.names) - set(_writer(prepared).names))
    if unknown and prepared.evolution is not None:  # columns the evolution leaves out: the Spark SQL path drops them
        return None, f"column(s) {unknown} the evolved schema does not hold"
    return prepared, None  # without evolution, unknown columns fail the run once the schema's id is known (register)


def _writer(prepared: PreparedSchema) -> StructType:
    return writer_schema(prepared.fmt, prepared.schema_str, list(prepared.message_indexes or []) or None, prepared.references)


def routes_of(prepared: PreparedSchema | None) -> tuple[tuple[str, str], ...]:
    """The (column, variant) pairs whose values the value schema takes in a new column."""
    return prepared.evolution.routes if prepared is not None and prepared.evolution is not None else ()


def prepare_key(manifest: Manifest, prepared: PreparedSchema | None) -> tuple[KeyEncoding | None, str | None]:
    """The key subject's schema when keys are registry-encoded (id 0 until registered), or why
    the Spark SQL path writes them."""
    # Without unique_key columns the key subject is registered all the same (an empty record) and
    # every key is null, as on the Spark SQL path: no column sets one.
    key = planned_key(manifest, prepared) if prepared is not None else None
    if key is not None and any(column in key.columns for column, _ in routes_of(prepared)):
        return None, "a type change of a registry-encoded key column routed to a new column (on_type_change: new_column)"
    return key, None


def key_format(key: KeyEncoding | None) -> tuple[str, str] | None:
    """What the tasks encode keys with (shape/message.MessageRule.key_format)."""
    return (key.fmt, key.schema_str) if key is not None else None


def key_frame_bytes(key: KeyEncoding | None) -> int:
    return len(frame(0, b"")) if key is not None else 0


def note_unregistered(
    manifest: Manifest, prepared: PreparedSchema | None, registry_config: dict[str, Any] | None, result: RunResult, payload: list[str]
) -> None:
    """What a checks-only run notes of the sink's schema, as the Spark SQL path notes it: planned,
    not registered (looked up without auto_register_schemas; no registry for a JSON sink).
    `payload`: the batch's payload columns, each of which the schema must hold."""
    if prepared is None:
        result.schema_evolution = dict(NO_REGISTRY)
        return
    assert registry_config is not None
    plan = plan_unregistered(manifest, prepared, registry_config)
    result.schema_evolution = plan.as_dict()
    refuse_unknown_columns(_writer(prepared), payload, plan.schema_id)


def register(
    manifest: Manifest, prepared: PreparedSchema, registry_config: dict[str, Any] | None, result: RunResult, payload: list[str]
) -> tuple[bytes, bytes]:
    """Register the prepared schema (and the key subject's); the frames every value and key get
    (no key frame when keys are not registry-encoded). A column of `payload` (the batch's) the
    schema does not hold fails the run here, after registering, as on the Spark SQL path."""
    assert registry_config is not None
    plan = register_prepared(manifest, prepared, registry_config)
    result.schema_evolution = plan.as_dict()
    refuse_unknown_columns(_writer(prepared), payload, plan.schema_id)
    return value_frame(prepared, plan.schema_id), frame(plan.key.schema_id, b"") if plan.key is not None else b""


def value_frame(prepared: PreparedSchema, schema_id: int) -> bytes:
    """The Confluent frame of each value: magic byte, schema id (protobuf: its message indexes)."""
    indexes = list(prepared.message_indexes or [0]) if prepared.fmt == "protobuf" else None
    return frame(schema_id, b"", indexes)
