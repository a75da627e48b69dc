"""Values of a batch encoded with a registered Avro, JSON Schema or protobuf schema, unframed (the
Confluent frame with the schema id is added when the id is known: engine/direct_registry.py).

Column-wise where the batch's types match the schema: Avro by formats/avro_arrow.py, JSON Schema
by the JSON encoder in the flavour of the codec's `json.dumps`, protobuf in the wire format
(formats/protobuf_wire.py) or rows through the message's constructor (formats/protobuf_values.py). Otherwise row by row with the registry
codec's record encoder, which converts values as the Spark SQL path does."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pyarrow as pa
from pyspark.sql.types import ArrayType, BooleanType, DataType, DoubleType, LongType, StringType, StructType

from dpone_dagster.formats import protobuf_values, protobuf_wire
from dpone_dagster.formats.avro_arrow import Unsupported, encode_records
from dpone_dagster.schema.wire_format import frame
from dpone_dagster.sinks import json_encode

FORMATS = ("avro", "json_schema", "protobuf")


class Unencodable(Exception):
    """A value the registered schema cannot take (an enum symbol it lacks, a null it forbids)."""


def encode_values(
    fmt: str,
    columns: list[pa.Array],
    names: list[str],
    schema_str: str,
    message_indexes: tuple[int, ...] | None = None,
    references: tuple[tuple[str, str], ...] = (),
) -> pa.Array:
    """Each row of `columns` (named `names`) as the unframed `fmt` bytes of `schema_str` (protobuf:
    the message `message_indexes` of that file, which imports `references`)."""
    rows = len(columns[0]) if columns else 0
    try:
        if fmt == "avro":
            return encode_records(dict(zip(names, columns, strict=True)), _parsed(schema_str), rows)
        if fmt == "json_schema" and _json_columns_match(columns, names, _json_schema_struct(schema_str)):
            return json_encode.encode_object(columns, names, json_encode.PYTHON).cast(pa.binary())
    except (Unsupported, json_encode.Unencodable):
        pass
    encoder = _row_encoder(fmt, schema_str, message_indexes, references)
    if fmt == "protobuf" and columns:
        encoded = protobuf_wire.encode_columns(columns, names, encoder.message_class)
        if encoded is None:
            encoded = protobuf_values.encode_rows(columns, names, encoder.message_class)
        if encoded is not None:
            return encoded
    head = len(frame(0, b"", encoder.indexes))  # what the encoder puts in front of each value
    out = []
    for row in pa.Table.from_arrays(columns, names=names).to_pylist():
        try:
            out.append(encoder.encode(row)[head:])
        except Exception as exc:  # noqa: BLE001 - the run's path decides what a bad value means
            raise Unencodable(f"a value the registered {fmt} schema cannot take: {exc}") from exc
    return pa.array(out, pa.binary())


def _json_columns_match(columns: list[pa.Array], names: list[str], schema: StructType) -> bool:
    """Whether the schema's fields are the columns, in order, of the same types, all nullable (so
    the codec writes every field, nulls as null, values unconverted)."""
    if [f.name for f in schema.fields] != names:
        return False
    return all(f.nullable and _same_type(c.type, f.dataType) for c, f in zip(columns, schema.fields, strict=True))


def _same_type(arrow: pa.DataType, spark: DataType) -> bool:
    if isinstance(spark, LongType):
        return pa.types.is_int64(arrow)
    if isinstance(spark, DoubleType):
        return pa.types.is_float64(arrow)
    if isinstance(spark, BooleanType):
        return pa.types.is_boolean(arrow)
    if isinstance(spark, StringType):
        return pa.types.is_string(arrow)
    if isinstance(spark, ArrayType):
        return pa.types.is_list(arrow) and spark.containsNull and _same_type(arrow.value_type, spark.elementType)
    if isinstance(spark, StructType):
        children = [arrow.field(i) for i in range(arrow.num_fields)] if pa.types.is_struct(arrow) else []
        return [c.name for c in children] == spark.names and all(
            f.nullable and _same_type(c.type, f.dataType) for c, f in zip(children, spark.fields, strict=True)
        )
    return False


@lru_cache(maxsize=8)
def _parsed(schema_str: str) -> dict[str, Any]:
    return json.loads(schema_str)


@lru_cache(maxsize=8)
def _json_schema_struct(schema_str: str) -> StructType:
    from dpone_dagster.schema.json_schema import json_schema_to_spark

    return json_schema_to_spark(schema_str)


@lru_cache(maxsize=8)
def _row_encoder(fmt: str, schema_str: str, message_indexes: tuple[int, ...] | None, references: tuple[tuple[str, str], ...]) -> Any:
    from dpone_dagster.spark.registry_codec import RecordEncoder

    return RecordEncoder(fmt, 0, schema_str, message_indexes, references)  # the id is in the frame, added later
