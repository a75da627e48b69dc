"""Decode raw Kafka records into payload columns on Spark (JVM JSON parsing, no Python per row).

Output: the payload columns of `schema` plus the metadata columns of `dpone_dagster.columns`.
A record whose value does not parse into the schema gets its raw text in `__dpone__corrupt`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dpone_dagster import columns as C

_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": C.CORRUPT}
DELETE_OPS = ("delete", "d", "DELETE", "D")


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


def decode_json(raw: DataFrame, schema: StructType, envelope: str) -> DataFrame:
    """`envelope` is flat or dpone (auto is resolved from the sample before this is called)."""
    text = F.col("value").cast("string")
    payload_fields = [f for f in schema.fields if f.name != C.OP]
    payload_schema = StructType(payload_fields)
    if envelope == "dpone":
        parsed = F.from_json(text, envelope_schema(payload_schema), _JSON_OPTIONS)
        data = parsed.getField("data")
        op_text = parsed.getField("op")
        corrupt = F.coalesce(
            parsed.getField(C.CORRUPT),
            F.when(text.isNotNull() & (op_text.isNull() | (data.isNull() & ~op_text.isin(*DELETE_OPS))), text),
        )
    else:
        flat_schema = with_corrupt_field(schema)
        parsed = F.from_json(text, flat_schema, _JSON_OPTIONS)
        data = parsed
        op_text = parsed.getField(C.OP) if any(f.name == C.OP for f in schema.fields) else F.lit(None)
        corrupt = parsed.getField(C.CORRUPT)
    # Say why, and where (the same shape as the registry decoders' reasons).
    corrupt = F.when(
        corrupt.isNotNull(),
        F.concat(F.lit("value is not JSON matching the schema at "), F.col("partition").cast("string"), F.lit("@"), F.col("offset").cast("string")),
    )
    op = F.when(text.isNull() | op_text.isin(*DELETE_OPS), F.lit(C.DELETE)).otherwise(F.lit(C.UPSERT))
    return raw.select(*decoded_columns(data, payload_fields, op, corrupt))


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
        source_order().alias(C.ORDER),
    ]


def source_order() -> Column:
    """Source order across partitions: record timestamp, then partition and offset."""
    return F.struct(F.col("timestamp").alias("ts"), F.col("partition").alias("p"), F.col("offset").alias("o"))


def top_level_keys(raw: DataFrame, envelope: str) -> list[str]:
    """Every top-level payload key present in the batch (a JVM pass; catches drift the sample missed)."""
    text = F.col("value").cast("string")
    if envelope == "dpone":
        text = F.get_json_object(text, "$.data")
    keys = raw.where(text.startswith("{")).select(F.explode(F.json_object_keys(text)).alias("k")).distinct()
    return sorted(row["k"] for row in keys.collect())


def sample_values_with_keys(raw: DataFrame, envelope: str, keys: list[str], limit: int = 200) -> list[str]:
    """Raw JSON texts of some records that carry any of `keys` (to widen an inferred schema)."""
    text = F.col("value").cast("string")
    probe = F.get_json_object(text, "$.data") if envelope == "dpone" else text
    wanted = F.array(*[F.lit(k) for k in keys])
    rows = raw.where(F.arrays_overlap(F.json_object_keys(probe), wanted)).select(text.alias("t")).limit(limit)
    return [row["t"] for row in rows.collect()]
