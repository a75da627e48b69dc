"""Decode raw Kafka records into payload columns on Spark (JVM JSON parsing, no Python per row).

Output: the payload columns of `schema` plus the metadata columns of `dpone_dagster.columns`.
A record whose value does not parse into the schema gets its raw text in `__dpone__corrupt`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dpone_dagster import columns as C
from dpone_dagster.columns import DELETE_OPS, JSON_OK, json_column, reads_decoded

_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": C.CORRUPT}
_PARSED = "__dpone__parsed"


def with_corrupt_field(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(C.CORRUPT, StringType(), True)])


def envelope_schema(data_schema: StructType) -> StructType:
    return StructType(
        [
            StructField("op", StringType(), True),
            StructField("data", data_schema, True),
            StructField("schema_version", StringType(), True),
            StructField(C.CORRUPT, StringType(), True),
        ]
    )


def decode_json(raw: DataFrame, schema: StructType, envelope: str, detect_unknown: bool = False) -> DataFrame:
    """`envelope` is flat, dpone, or auto: decided per record, an object with `op` and `data` is a
    dpone envelope and anything else a flat record (a topic may mix both; the schema sample only
    serves schema inference).

    Rows the read tasks decoded already (`kafka_reader.JSON_OK`) keep their columns (flat records:
    a read task never decodes a record holding a key beyond the schema); the others are parsed
    here. With `detect_unknown`, records holding top-level keys the schema lacks get them in
    `C.UNKNOWN_KEYS` and their text in `C.UNKNOWN_TEXT` (drift past the sample; for an envelope
    the keys of its `data`)."""
    text = F.col("value").cast("string")
    payload_fields = [f for f in schema.fields if f.name != C.OP]
    payload_schema = StructType(payload_fields)
    names = schema.fieldNames()
    prepared = reads_decoded(raw)
    ok = F.col(JSON_OK) if prepared else F.lit(False)
    staged_columns: list[Column] = []
    is_envelope = _is_envelope(text, ok) if envelope == "auto" else F.lit(envelope == "dpone")
    if detect_unknown:
        data_text = F.get_json_object(text, "$.data")
        keys_text = data_text if envelope == "dpone" else F.when(is_envelope, data_text).otherwise(text) if envelope == "auto" else text
        known = F.array(*[F.lit(n) for n in names]) if names else F.array().cast("array<string>")
        unknown = F.array_except(F.json_object_keys(keys_text), known)
        staged_columns.append(F.when(~ok & (F.size(unknown) > 0), unknown).alias(C.UNKNOWN_KEYS))
    if envelope != "dpone":
        # Parsed in a projection of its own and only where the read task did not decode the
        # record; the next projection reads it once per field (Spark does not merge the two).
        flat_wanted = ~ok & ~is_envelope if envelope == "auto" else ~ok
        staged_columns.append(F.when(flat_wanted, F.from_json(text, with_corrupt_field(schema), _JSON_OPTIONS)).alias(_PARSED))
    stage = raw.select("*", *staged_columns) if staged_columns else raw
    if envelope == "flat":
        data, op_text, corrupt = _flat_parts(schema, prepared)
    elif envelope == "dpone":
        data, op_text, corrupt = _envelope_parts(text, payload_schema)
    else:
        flat = _flat_parts(schema, prepared)
        enveloped = _envelope_parts(text, payload_schema)
        data, op_text, corrupt = (F.when(is_envelope, e).otherwise(f) for e, f in zip(enveloped, flat, strict=True))
    drift: list[Column] = []
    if detect_unknown:
        drift = [F.col(C.UNKNOWN_KEYS), F.when(F.col(C.UNKNOWN_KEYS).isNotNull(), text).alias(C.UNKNOWN_TEXT)]
    # Say why, and where (the same shape as the registry decoders' reasons).
    corrupt = F.when(
        corrupt.isNotNull(),
        F.concat(F.lit("value is not JSON matching the schema at "), F.col("partition").cast("string"), F.lit("@"), F.col("offset").cast("string")),
    )
    return stage.select(*decoded_columns(data, payload_fields, record_op(text, op_text), corrupt), *drift)


def is_envelope_value(value: object) -> bool:
    """The per-record rule of `envelope: auto` (pure): a JSON object with `op` and `data`."""
    return isinstance(value, dict) and "op" in value and "data" in value


def _is_envelope(text: Column, ok: Column) -> Column:
    """`is_envelope_value` on Spark: the record's top-level keys hold op and data. Records the read
    tasks decoded are flat (their keys are the flat schema's)."""
    keys = F.json_object_keys(text)
    return F.coalesce(~ok & F.array_contains(keys, "op") & F.array_contains(keys, "data"), F.lit(False))


def _flat_parts(schema: StructType, prepared: bool) -> tuple[Column, Column, Column]:
    """(payload struct, op text, corrupt text) of a flat record parsed into `_PARSED`."""
    names = schema.fieldNames()
    payload_fields = [f for f in schema.fields if f.name != C.OP]
    parsed = F.col(_PARSED)

    def field(name: str) -> Column:
        if not prepared:
            return parsed.getField(name)
        return F.when(F.col(JSON_OK), F.col(json_column(names.index(name)))).otherwise(parsed.getField(name))

    data = F.struct(*[field(f.name).alias(f.name) for f in payload_fields])
    op_text = field(C.OP) if C.OP in names else F.lit(None).cast("string")
    return data, op_text, parsed.getField(C.CORRUPT)


def _envelope_parts(text: Column, payload_schema: StructType) -> tuple[Column, Column, Column]:
    """(payload struct, op text, corrupt text) of a dpone envelope {op, data, schema_version}."""
    parsed = F.from_json(text, envelope_schema(payload_schema), _JSON_OPTIONS)
    data = parsed.getField("data")
    op_text = parsed.getField("op")
    corrupt = F.coalesce(
        parsed.getField(C.CORRUPT),
        F.when(text.isNotNull() & (op_text.isNull() | (data.isNull() & ~op_text.isin(*DELETE_OPS))), text),
    )
    return data, op_text, corrupt


def decoded_in_tasks(raw: DataFrame, schema: StructType) -> DataFrame:
    """`decode_json(raw, schema, "flat")` for a batch whose every record the read tasks decoded
    (`kafka_reader.JSON_OK`, passed on, is true for all): their columns renamed, nothing parsed,
    nothing corrupt, no drift (a read task never decodes a record with keys beyond the schema)."""
    names = schema.fieldNames()
    payload_fields = [f for f in schema.fields if f.name != C.OP]
    data = F.struct(*[F.col(json_column(names.index(f.name))).alias(f.name) for f in payload_fields])
    op_text = F.col(json_column(names.index(C.OP))) if C.OP in names else F.lit(None)
    return raw.select(*decoded_columns(data, payload_fields, record_op(F.col("value"), op_text), F.lit(None).cast("string")), JSON_OK)


def record_op(value: Column, op_text: Column) -> Column:
    """A tombstone (null value) or a delete op is a delete; anything else an upsert."""
    return F.when(value.isNull() | op_text.isin(*DELETE_OPS), F.lit(C.DELETE)).otherwise(F.lit(C.UPSERT))


def decoded_columns(data: Column, payload_fields: list[StructField], op: Column, corrupt: Column) -> list[Column]:
    """The columns every decoder returns: payload fields, then the dpone metadata of the record."""
    return [
        *[data.getField(f.name).alias(f.name) for f in payload_fields],
        op.alias(C.OP),
        F.col("topic").alias(C.SOURCE_TOPIC),
        F.col("partition").alias(C.SOURCE_PARTITION),
        F.col("offset").alias(C.SOURCE_OFFSET),
        F.timestamp_millis(F.col("timestamp")).alias(C.SOURCE_TIMESTAMP),
        F.col("key").alias(C.SOURCE_KEY),
        F.col("headers").alias(C.SOURCE_HEADERS),
        corrupt.alias(C.CORRUPT),
        source_order(F.col("timestamp"), F.col("partition"), F.col("offset")).alias(C.ORDER),
    ]


def source_order(timestamp_ms: Column, partition: Column, offset: Column) -> Column:
    """Source order across partitions: record timestamp, then partition and offset."""
    return F.struct(timestamp_ms.alias("ts"), partition.alias("p"), offset.alias("o"))


def rebuildable_columns(topic: str) -> dict[str, Column]:
    """Metadata of a decoded batch of one topic that other columns determine: the topic itself
    and the source order. Kept batches leave them out and add them back when read (smaller,
    cheaper to build)."""
    order = source_order(F.unix_millis(F.col(C.SOURCE_TIMESTAMP)), F.col(C.SOURCE_PARTITION), F.col(C.SOURCE_OFFSET))
    return {C.SOURCE_TOPIC: F.lit(topic), C.ORDER: order}
