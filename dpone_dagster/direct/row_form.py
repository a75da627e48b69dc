"""The decoded rows of a direct-path batch in the form the Spark SQL path's decoder gives them
(spark/decode.decoded_columns): the payload columns, then each record's metadata (pure: Arrow
only). The checks Spark SQL judges on a direct-path batch see these columns on either path."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster import columns as C
from dpone_dagster.sources.kafka_reader import RAW_ARROW_SCHEMA

ORDER = pa.struct([("ts", pa.int64()), ("p", pa.int32()), ("o", pa.int64())])


def rows_schema(payload: pa.Schema) -> pa.Schema:
    """The payload fields, then the record's metadata, as spark/decode.decoded_columns names them."""
    metadata = [
        (C.OP, pa.string()),
        (C.SOURCE_TOPIC, pa.string()),
        (C.SOURCE_PARTITION, pa.int32()),
        (C.SOURCE_OFFSET, pa.int64()),
        (C.SOURCE_TIMESTAMP, pa.timestamp("us", "UTC")),
        (C.SOURCE_KEY, pa.binary()),
        (C.SOURCE_HEADERS, RAW_ARROW_SCHEMA.field("headers").type),
        (C.CORRUPT, pa.string()),
        (C.ORDER, ORDER),
    ]
    return pa.schema([*payload, *[pa.field(name, kind) for name, kind in metadata]])


def as_rows(schema: pa.Schema, raw: pa.RecordBatch, columns: list[pa.Array], is_delete: pa.Array) -> pa.RecordBatch:
    """The rows of `raw` (raw records) decoded into `columns` (the `rows_schema` of its payload)."""
    stamps = raw.column("timestamp")
    metadata = [
        pc.if_else(is_delete, C.DELETE, C.UPSERT),
        raw.column("topic"),
        raw.column("partition"),
        raw.column("offset"),
        pc.cast(pc.multiply(stamps, 1000), pa.timestamp("us", "UTC")),
        raw.column("key"),
        raw.column("headers"),
        pa.nulls(raw.num_rows, pa.string()),
        pa.StructArray.from_arrays([stamps, raw.column("partition"), raw.column("offset")], fields=list(ORDER)),
    ]
    return pa.RecordBatch.from_arrays([*columns, *metadata], schema=schema)


def without(rows: pa.RecordBatch, left_out: pa.Array | None, skip_deletes: bool) -> pa.RecordBatch:
    """`rows` without the records whose source offset is `left_out` marks (a boolean mask), and
    without the deletes when they are skipped."""
    if left_out is not None:
        rows = rows.filter(pc.invert(left_out))
    if skip_deletes:
        rows = rows.filter(pc.not_equal(rows.column(C.OP), C.DELETE))
    return rows
