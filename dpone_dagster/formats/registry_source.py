"""Registry-framed source values (avro, json_schema, protobuf) decoded into Arrow columns in the
direct path's tasks, with the schemas the driver fetched (sources/kafka.RegistryPlan): the same
decoder as the Spark SQL path (spark/registry_codec.RecordDecoder), without the JVM; Avro batches
of one writer schema column by column (formats/avro_columns.py), protobuf batches of flat messages
likewise (formats/protobuf_columns.py) and JSON Schema batches of flat payloads by Arrow's JSON
reader, where they give the same result.

A value the decoder cannot read raises Undecodable: a bad record (a wrong magic byte, a payload
that does not decode, of another type or record) is set aside by the task, with the decoder's
reason, and judged by the bad-record policy; an id outside the plan stops the task, for the
driver to fetch the batch's ids by id (as the Spark SQL path fetches them) and scan again; a value
that does not fit the payload schema takes the batch to the Spark SQL path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from dpone_dagster.formats import avro_columns, protobuf_columns

if TYPE_CHECKING:
    from dpone_dagster.sources.kafka import RegistryPlan

_decoders: dict[Any, Any] = {}  # one decoder per plan in a worker (it keeps the parsed schemas)
_column_readers: dict[Any, avro_columns.Reader | protobuf_columns.Reader | None] = {}  # one per schema and payload in a worker


class Undecodable(Exception):
    """A value the task decoder does not read; the message says why. `bad_record`: the Spark SQL
    path's decoder marks it corrupt with that reason too; else the batch is left to that path."""

    def __init__(self, reason: str, bad_record: bool = False):
        super().__init__(reason)
        self.bad_record = bad_record


def schema_ids(values: pa.Array) -> set[int]:
    """The schema ids framed in `values` (those whose first byte is the magic byte 0, as the Spark
    SQL path reads them; null values, tombstones, have none)."""
    framed = values.filter(pc.greater_equal(pc.fill_null(pc.binary_length(values), 0), 5))
    framed = framed.filter(pc.equal(pc.binary_slice(framed, 0, 1), b"\x00"))
    return {int.from_bytes(v, "big") for v in pc.unique(pc.binary_slice(framed, 1, 5)).to_pylist()}


def unplanned_ids(plan: RegistryPlan, values: pa.Array) -> set[int]:
    """The schema ids framed in `values` that the plan neither holds nor knows to be missing
    from the registry."""
    return schema_ids(values) - set(plan.schemas) - plan.missing


def reasons(plan: RegistryPlan, raw: pa.RecordBatch, schema: pa.Schema) -> list[str | None]:
    """Why the decoder does not read each value of `raw` (None for one it reads), as the Spark SQL
    path's decoder says it ("... at partition@offset")."""
    decoder = _decoder(plan)
    partitions, offsets = raw.column("partition").to_pylist(), raw.column("offset").to_pylist()
    return [
        None if value is None else decoder.decode(value, f"{partition}@{offset}")[1]
        for value, partition, offset in zip(raw.column("value").to_pylist(), partitions, offsets, strict=True)
    ]


def arrow_schema(payload: StructType) -> pa.Schema | None:
    """The Arrow types the values are decoded into: those the Spark SQL path's decoder builds
    (spark/registry_codec.decode_registry), so that both paths hold the same values; None for a
    payload Arrow cannot hold."""
    from pyspark.sql.pandas.types import to_arrow_type

    from dpone_dagster.schema.values import nullable_schema

    try:
        struct = to_arrow_type(nullable_schema(payload), timezone="UTC")
    except Exception:  # noqa: BLE001 - a type without an Arrow form: the Spark SQL path decodes it
        return None
    return pa.schema(list(struct))


def decode_values(plan: RegistryPlan, raw: pa.RecordBatch, schema: pa.Schema) -> list[pa.Array]:
    """One array per field of `schema` (the payload's Arrow schema), aligned with the batch's
    values; a null value (a tombstone) gives nulls. Avro values of one schema are read column by
    column (formats/avro_columns.py), JSON Schema values of flat payloads by Arrow's JSON reader,
    when they read them exactly as the record decoder would; other batches record by record."""
    values = raw.column("value")
    if plan.fmt == "json_schema":
        columns = _json_columns(plan, values, schema)
    else:
        reader = _column_reader(plan, values, schema)
        columns = reader.decode(values) if reader is not None else None
    return columns if columns is not None else decode_records(plan, raw, schema)


def decode_records(plan: RegistryPlan, raw: pa.RecordBatch, schema: pa.Schema) -> list[pa.Array]:
    """`decode_values` record by record, with the Spark SQL path's decoder."""
    decoder = _decoder(plan)
    rows: list[dict[str, Any] | None] = []
    partitions, offsets = raw.column("partition").to_pylist(), raw.column("offset").to_pylist()
    for value, partition, offset in zip(raw.column("value").to_pylist(), partitions, offsets, strict=True):
        if value is None:
            rows.append(None)
            continue
        row, reason = decoder.decode(value, f"{partition}@{offset}")
        if reason is not None:  # an id outside the plan is fetched first (unplanned_ids), unless the registry lacks it
            raise Undecodable(reason, bad_record=not reason.startswith("unknown schema id") or bool(schema_ids(pa.array([value])) & plan.missing))
        rows.append(row)
    try:
        struct = pa.array(rows, type=pa.struct(list(schema)))
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise Undecodable(f"a value that does not fit the payload schema: {exc}") from exc
    return struct.flatten()


def _column_reader(plan: RegistryPlan, values: pa.Array, schema: pa.Schema) -> Any:
    """The column reader of the batch's one schema (avro_columns / protobuf_columns), built once per
    schema and payload in a worker; None for a batch of several schemas (read record by record), an
    id the plan lacks or of another type, or a schema the reader does not cover."""
    ids = schema_ids(values)
    if len(ids) != 1:
        return None
    [schema_id] = ids
    registered = plan.schemas.get(schema_id)
    if registered is None or registered[0].upper() != ("AVRO" if plan.fmt == "avro" else "PROTOBUF"):
        return None
    references = tuple((plan.references or {}).get(schema_id, ()))
    key = (plan.fmt, schema_id, registered[1], references, schema)
    if key not in _column_readers:
        _column_readers.clear()
        try:
            _column_readers[key] = _build_reader(plan.fmt, schema_id, registered[1], references, schema)
        except Exception:  # noqa: BLE001 - a schema the runtime does not build: the record decoder judges it
            _column_readers[key] = None
    return _column_readers[key]


def _build_reader(fmt: str, schema_id: int, schema_str: str, references: tuple, schema: pa.Schema) -> Any:
    if fmt == "avro":
        return avro_columns.reader(schema_id, schema_str, schema)
    from dpone_dagster.schema.protobuf import message_class_from_schema

    return protobuf_columns.reader(schema_id, message_class_from_schema(schema_str, [0], references), schema)


# Payload types Arrow's JSON reader yields exactly as the record decoder (json.loads, then
# schema/values.to_spark_value) does, where it reads a value at all: it refuses what the record
# decoder converts (1.0 for an integer, a number for a string), and parses doubles correctly rounded.
_JSON_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_())


def _json_columns(plan: RegistryPlan, values: pa.Array, schema: pa.Schema) -> list[pa.Array] | None:
    """JSON Schema values read by Arrow's JSON reader (spark/arrow_json.py, one object per value),
    or None: a payload of other types, a value not framed with a JSON schema of the subject, or a
    batch the reader does not read as the record decoder would."""
    from dpone_dagster.spark import arrow_json

    if any(field.type not in _JSON_TYPES for field in schema) or not _framed(values, plan, "JSON"):
        return None
    # An explicit stop: binary_slice without one fails on some sliced arrays (pyarrow 26).
    columns = arrow_json.decode_values(pc.binary_slice(values, 5, (1 << 31) - 1), schema)
    if columns is None:
        return None
    for column in columns:
        if column.type == pa.float64() and _differs_in_doubles(column):
            return None
    return columns


def _differs_in_doubles(column: pa.Array) -> bool:
    """Doubles json.loads may read otherwise: -0 (the integer 0 there), and anything not finite
    (Arrow reads Inf, -NaN and integers past the double range, which json.loads refuses)."""
    doubles = column.fill_null(1.0).to_numpy(zero_copy_only=False)
    return bool(((doubles == 0.0) & np.signbit(doubles)).any() or not np.isfinite(doubles).all())


def _framed(values: pa.Array, plan: RegistryPlan, schema_type: str) -> bool:
    """Every non-null value framed (magic byte 0, then a schema id) with a schema of `schema_type`
    the plan holds."""
    present = values.drop_null() if values.null_count else values
    if not len(present):
        return True
    if not pc.all(pc.greater_equal(pc.binary_length(present), 5)).as_py():
        return False
    if not pc.all(pc.equal(pc.binary_slice(present, 0, 1), pa.scalar(b"\x00", present.type))).as_py():
        return False
    return all(_readable(plan.schemas.get(i), schema_type) for i in schema_ids(present))


def _readable(registered: tuple[str, str] | None, schema_type: str) -> bool:
    """A registered schema of `schema_type` the record decoder reads values with (a JSON Schema:
    one whose title it finds)."""
    if registered is None or registered[0].upper() != schema_type:
        return False
    if schema_type != "JSON":
        return True
    from dpone_dagster.schema.json_schema import json_schema_title

    try:
        json_schema_title(registered[1])
    except Exception:  # noqa: BLE001 - the record decoder refuses every value of such a schema
        return False
    return True


def _decoder(plan: RegistryPlan) -> Any:
    from dpone_dagster.schema.values import nullable_schema
    from dpone_dagster.spark.registry_codec import RecordDecoder

    key = (plan.fmt, tuple(sorted(plan.schemas.items())), tuple(sorted((plan.references or {}).items())), plan.schema.json())
    if key not in _decoders:
        _decoders.clear()
        _decoders[key] = RecordDecoder(plan.fmt, plan.schemas, nullable_schema(plan.schema), plan.references)
    return _decoders[key]
