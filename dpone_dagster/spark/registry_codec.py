"""Decode and encode Confluent-framed records (avro, json_schema, protobuf) on Spark executors.

Executors never contact the Schema Registry. The driver finds the schema ids of a batch with
`distinct_schema_ids` (a JVM pass), fetches them (`schema.registry.schemas_by_id`), and passes the
schema strings here; they travel to the Python workers inside the pickled mapInArrow closure, as
plain strings and ints. Each task parses a schema once and keeps it for the rest of its records.

`decode_registry` yields exactly the columns of `decode.decode_json`: the payload fields of the
schema, `__dpone__op` (a tombstone is a delete), the source metadata, `__dpone__corrupt` (why a
record could not be decoded: "wrong magic byte 0x7b at 0@17", "unknown schema id 42 at 0@18",
"avro decode error at 0@19: ...") and `__dpone__order`. Records written with any registered
version are projected onto the schema by field name (missing fields are null).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.schema import avro, json_schema, protobuf
from dpone_dagster.schema.evolution import EvolutionPlan
from dpone_dagster.schema.registry import SCHEMA_TYPES
from dpone_dagster.schema.values import nullable_schema, to_spark_value
from dpone_dagster.schema.wire_format import WireFormatError, frame, unframe
from dpone_dagster.spark.decode import decoded_columns, record_op

_PAYLOAD = "__dpone__payload"
_MAX_REASON = 500


# --------------------------------------------------------------------------- driver-side helpers


def distinct_schema_ids(raw: DataFrame, column: str = "value") -> list[int]:
    """Schema ids referenced by framed values (bytes 2..5 where the first byte is 0), JVM side."""
    value = F.col(column)
    framed = raw.where(value.isNotNull() & (F.length(value) >= 5) & (F.hex(F.substring(value, 1, 1)) == "00"))
    ids = framed.select(F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long").alias("id")).distinct()
    return sorted(int(row["id"]) for row in ids.collect())


def writer_schema(fmt: str, schema_str: str, message_indexes: Sequence[int] | None = None,
                  references: Sequence[tuple[str, str]] = ()) -> T.StructType:
    """The Spark view of a registered schema (what encoding conforms rows to)."""
    if fmt == "avro":
        return avro.avro_to_spark(schema_str)
    if fmt == "json_schema":
        return json_schema.json_schema_to_spark(schema_str)
    if fmt == "protobuf":
        cls = protobuf.message_class_from_schema(schema_str, message_indexes or [0], references)
        return protobuf.message_to_spark(cls)
    raise ConfigError(f"message_format {fmt!r} does not use the Schema Registry")


def refuse_unknown_columns(target: T.StructType, payload_columns: Sequence[str], schema_id: int) -> None:
    """A payload column the registered schema `target` does not hold fails the run, on every path
    (its values would be dropped)."""
    unknown = [c for c in payload_columns if c not in target.names]
    if unknown:
        raise ConfigError(
            f"column(s) {unknown} are not in the registered schema id {schema_id}; plan the schema "
            "evolution (sink.options.schema_evolution) so that they are added, or drop them"
        )


def key_schema(schema: T.StructType, columns: Sequence[str]) -> T.StructType:
    """The struct of the key columns (to build the `-key` subject's schema)."""
    by_name = {f.name: f for f in schema.fields}
    missing = [c for c in columns if c not in by_name]
    if missing:
        raise ConfigError(f"key column(s) {missing} are not in the batch (columns: {list(by_name)})")
    return T.StructType([by_name[c] for c in columns])


def apply_routes(df: DataFrame, plan: EvolutionPlan) -> DataFrame:
    """Move routed columns' values to their `__dpone__nc__` variant and null the original."""
    result = {f.name: f for f in plan.result_schema.fields}
    for column, variant in plan.routes:
        df = df.withColumn(variant, F.col(column)).withColumn(column, F.lit(None).cast(result[column].dataType))
    return df


# --------------------------------------------------------------------------- per-record codecs (pure)


class _WrongRecord(Exception):
    """A record of another type than the expected one (topics carrying several record types)."""


class RecordDecoder:
    """Decode framed values of one format with the schemas the driver shipped (one per task).

    With `expected_record` (an Avro record full name, a JSON Schema title or a protobuf message full
    name), a record of any other type is corrupt instead of being projected onto the schema.
    """

    def __init__(
        self,
        fmt: str,
        schemas: Mapping[int, tuple[str, str]],
        schema: T.StructType,
        references: Mapping[int, Sequence[tuple[str, str]]] | None = None,
        expected_record: str | None = None,
    ):
        if fmt not in SCHEMA_TYPES:
            raise ConfigError(f"message_format {fmt!r} does not use the Schema Registry")
        self.fmt = fmt
        self.schemas = schemas
        self.schema = schema
        self.references = references or {}
        self.expected_record = expected_record
        self._parsed: dict[Any, tuple[str | None, Any]] = {}

    def decode(self, value: bytes, where: str) -> tuple[dict[str, Any] | None, str | None]:
        """(row, None) or (None, reason) for one non-null value; `where` is "partition@offset"."""
        try:
            schema_id, indexes, payload = unframe(value, with_indexes=self.fmt == "protobuf")
        except WireFormatError as exc:
            return None, f"{exc.reason} at {where}"
        registered = self.schemas.get(schema_id)
        if registered is None:
            return None, f"unknown schema id {schema_id} at {where}"
        schema_type, schema_str = registered
        if schema_type.upper() != SCHEMA_TYPES[self.fmt]:
            return None, f"schema id {schema_id} is {schema_type}, expected {SCHEMA_TYPES[self.fmt]} at {where}"
        try:
            return self._decode(schema_id, schema_str, indexes, payload), None
        except _WrongRecord as exc:
            return None, f"{exc} at {where}"
        except Exception as exc:  # any payload problem marks this record corrupt, never the batch
            return None, f"{self.fmt} decode error at {where}: {exc}"[:_MAX_REASON]

    def _decode(self, schema_id: int, schema_str: str, indexes: list[int] | None, payload: bytes) -> dict[str, Any]:
        if self.fmt == "avro":
            parsed = self._reader(schema_id, lambda: (avro.avro_fullname(schema_str), avro.parse_avro_schema(schema_str)))
            datum = avro.read_avro(payload, parsed)
            if not isinstance(datum, Mapping):
                raise ValueError(f"the value is a {type(datum).__name__}, not a record")
            return avro.from_avro_datum(datum, self.schema)
        if self.fmt == "json_schema":
            self._reader(schema_id, lambda: (json_schema.json_schema_title(schema_str), None))
            obj = json_schema.decode_json(payload)
            if not isinstance(obj, Mapping):
                raise ValueError(f"the value is a JSON {type(obj).__name__}, not an object")
            return json_schema.from_json_value(obj, self.schema)
        key = (schema_id, tuple(indexes or [0]))

        def build() -> tuple[str | None, Any]:
            cls = protobuf.message_class_from_schema(schema_str, list(key[1]), self.references.get(schema_id, ()))
            return cls.DESCRIPTOR.full_name, cls

        cls = self._reader(key, build)
        return protobuf.message_to_row(cls.FromString(payload), self.schema)

    def _reader(self, key: Any, build: Any) -> Any:
        """Parse a schema once per task; check its record name against `expected_record`."""
        if key not in self._parsed:
            self._parsed[key] = build()
        name, parsed = self._parsed[key]
        if self.expected_record and name != self.expected_record:
            raise _WrongRecord(f"record {name} is not the expected {self.expected_record}")
        return parsed


class RecordEncoder:
    """Encode rows (Arrow `to_pylist` dicts) into framed values of one registered schema."""

    def __init__(
        self,
        fmt: str,
        schema_id: int,
        schema_str: str,
        message_indexes: Sequence[int] | None = None,
        references: Sequence[tuple[str, str]] = (),
    ):
        self.fmt = fmt
        self.schema_id = schema_id
        self.indexes = list(message_indexes or [0]) if fmt == "protobuf" else None
        self.schema = writer_schema(fmt, schema_str, self.indexes, references)
        if fmt == "avro":
            self._avro = avro.parse_avro_schema(schema_str)
        elif fmt == "protobuf":
            self.message_class = protobuf.message_class_from_schema(schema_str, self.indexes or [0], references)

    def encode(self, row: Mapping[str, Any]) -> bytes:
        # Conform to the registered types first: int -> long/double, decimal rescale, UTC, nulls.
        values = to_spark_value(row, self.schema, enforce_nullability=self.fmt != "protobuf")
        if self.fmt == "avro":
            payload = avro.write_avro(avro.to_avro_datum(values, self.schema), self._avro)
        elif self.fmt == "json_schema":
            payload = json_schema.encode_json(json_schema.to_json_value(values, self.schema))
        else:
            payload = protobuf.row_to_message(values, self.message_class).SerializeToString()
        return frame(self.schema_id, payload, self.indexes)


# --------------------------------------------------------------------------- decode (Spark)


def decode_registry(
    raw: DataFrame,
    fmt: str,
    schemas: Mapping[int, tuple[str, str]],
    spark_schema: T.StructType,
    references: Mapping[int, Sequence[tuple[str, str]]] | None = None,
    expected_record: str | None = None,
) -> DataFrame:
    """Raw Kafka records -> payload columns of `spark_schema` + dpone metadata (see module doc).

    `references`: protobuf imports per schema id (`schema.registry.references_by_id`);
    `expected_record`: see `RecordDecoder`."""
    payload_schema = nullable_schema(spark_schema)
    out_schema = T.StructType(
        [*raw.schema.fields, T.StructField(_PAYLOAD, payload_schema, True), T.StructField(C.CORRUPT, T.StringType(), True)]
    )
    # Plain data only in the closure: dicts of str/int, a StructType.
    shipped = {int(k): (str(v[0]), str(v[1])) for k, v in schemas.items()}
    shipped_refs = {int(k): tuple(v) for k, v in (references or {}).items()}

    def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = RecordDecoder(fmt, shipped, payload_schema, shipped_refs, expected_record)
        arrow_type = to_arrow_type(payload_schema, timezone="UTC")
        for batch in batches:
            yield _decode_batch(batch, decoder, arrow_type)

    decoded = raw.mapInArrow(decode_batches, out_schema)
    payload = F.col(_PAYLOAD)
    value = F.col("value")
    payload_fields = [f for f in spark_schema.fields if f.name != C.OP]
    op_text = payload.getField(C.OP) if any(f.name == C.OP for f in spark_schema.fields) else F.lit(None)
    op = record_op(value, op_text)
    return decoded.select(*decoded_columns(payload, payload_fields, op, F.col(C.CORRUPT)))


def _decode_batch(batch: pa.RecordBatch, decoder: RecordDecoder, arrow_type: pa.DataType) -> pa.RecordBatch:
    values = batch.column("value").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    rows: list[dict[str, Any] | None] = []
    reasons: list[str | None] = []
    for value, partition, offset in zip(values, partitions, offsets, strict=True):
        if value is None:  # tombstone: a delete without payload
            rows.append(None)
            reasons.append(None)
            continue
        row, reason = decoder.decode(value, f"{partition}@{offset}")
        rows.append(row)
        reasons.append(reason)
    payload = _to_arrow(rows, arrow_type, reasons, [f"{p}@{o}" for p, o in zip(partitions, offsets, strict=True)])
    return pa.RecordBatch.from_arrays(
        [*batch.columns, payload, pa.array(reasons, pa.string())],
        names=[*batch.schema.names, _PAYLOAD, C.CORRUPT],
    )


def _to_arrow(rows: list[Any], arrow_type: pa.DataType, reasons: list[str | None], where: list[str]) -> pa.Array:
    """Build the payload column; a row Arrow still refuses becomes corrupt instead of failing the batch."""
    try:
        return pa.array(rows, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        for i, row in enumerate(rows):
            if row is None:
                continue
            try:
                pa.array([row], type=arrow_type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                rows[i] = None
                reasons[i] = f"value does not fit the schema at {where[i]}: {exc}"[:_MAX_REASON]
        return pa.array(rows, type=arrow_type)


# --------------------------------------------------------------------------- encode (Spark)


@dataclass(frozen=True)
class KeyEncoding:
    """Registry-encoded keys (key.format avro | json_schema) under the `-key` subject's schema."""

    fmt: str
    schema_id: int
    schema_str: str
    columns: tuple[str, ...]
    message_indexes: tuple[int, ...] | None = field(default=None)


def encode_registry(
    df: DataFrame,
    fmt: str,
    schema_id: int,
    schema_str: str,
    payload_columns: Sequence[str],
    null_value_column: str | None = None,
    message_indexes: Sequence[int] | None = None,
    references: Sequence[tuple[str, str]] = (),
    key: KeyEncoding | None = None,
    value_column: str = "value",
    key_column: str = "key",
) -> DataFrame:
    """`df` with `value_column` (and `key_column` when `key` is given) replaced by framed bytes.

    The value is `payload_columns` encoded with the registered schema `schema_id`; fields of the
    schema missing from the columns are written as null (or their default). Rows where the boolean
    `null_value_column` is true get a null value (tombstones; the caller decides which). A key is
    null when all its columns are null. An encoding error fails the task: a sink never drops rows.
    """
    target = writer_schema(fmt, schema_str, message_indexes, references)
    refuse_unknown_columns(target, payload_columns, schema_id)
    if key is not None and key.fmt not in ("avro", "json_schema", "protobuf"):
        raise ConfigError(f"key.format {key.fmt!r} is not a registry format")
    replaced = {value_column} | ({key_column} if key is not None else set())
    kept = [f for f in df.schema.fields if f.name not in replaced]
    out_fields = [*kept, T.StructField(value_column, T.BinaryType(), True)]
    if key is not None:
        out_fields.append(T.StructField(key_column, T.BinaryType(), True))
    out_schema = T.StructType(out_fields)
    kept_names = [f.name for f in kept]
    out_names = out_schema.names
    value_names = list(payload_columns)
    key_columns = list(key.columns) if key is not None else []
    spec = (fmt, int(schema_id), str(schema_str), list(message_indexes or []) or None, tuple(references))

    def encode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        encoder = RecordEncoder(*spec)
        key_encoder = (
            RecordEncoder(key.fmt, key.schema_id, key.schema_str, key.message_indexes) if key is not None else None
        )
        for batch in batches:
            yield _encode_batch(
                batch, encoder, key_encoder, key_columns, value_names, null_value_column, kept_names, out_names
            )

    return df.mapInArrow(encode_batches, out_schema)


def _encode_batch(
    batch: pa.RecordBatch,
    encoder: RecordEncoder,
    key_encoder: RecordEncoder | None,
    key_columns: list[str],
    value_names: list[str],
    null_value_column: str | None,
    kept_names: list[str],
    out_names: list[str],
) -> pa.RecordBatch:
    rows = _rows(batch, value_names)
    emit_null = batch.column(null_value_column).to_pylist() if null_value_column else [False] * batch.num_rows
    values = [None if skip else _encode_row(encoder, row, "value") for row, skip in zip(rows, emit_null, strict=True)]
    arrays = [batch.column(name) for name in kept_names] + [pa.array(values, pa.binary())]
    if key_encoder is not None:
        keys = [
            None if all(v is None for v in row.values()) else _encode_row(key_encoder, row, "key")
            for row in _rows(batch, key_columns)
        ]
        arrays.append(pa.array(keys, pa.binary()))
    return pa.RecordBatch.from_arrays(arrays, names=out_names)


def _rows(batch: pa.RecordBatch, names: list[str]) -> list[dict[str, Any]]:
    columns = {name: batch.column(name).to_pylist() for name in names}
    return [{name: columns[name][i] for name in names} for i in range(batch.num_rows)]


def _encode_row(encoder: RecordEncoder, row: Mapping[str, Any], what: str) -> bytes:
    try:
        return encoder.encode(row)
    except Exception as exc:
        raise ValueError(
            f"cannot encode the {what} with registered schema id {encoder.schema_id} ({encoder.fmt}): {exc}"
        ) from exc
