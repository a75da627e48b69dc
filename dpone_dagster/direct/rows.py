"""Executor side of the checks Spark SQL judges on a direct-path batch (engine/direct_checks.py):
a task reads its slices again and yields their decoded rows with the columns the Spark SQL path's
decoder gives every record (spark/decode.decoded_columns), so that a check — Great Expectations
included — sees the same columns on either path."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster import columns as C
from dpone_dagster.direct import task
from dpone_dagster.direct.progress import Slice
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


def judged_rows(
    settings: task.DirectSettings, slices: list[Slice], left_out: dict[int, np.ndarray], skip_deletes: bool
) -> Iterator[pa.RecordBatch]:
    """The decoded records of `slices` without the source offsets `left_out` (per partition: those
    the scan set aside, and for the rows as published those left out after it), and without the
    deletes when they are skipped."""
    schema = rows_schema(settings.schema)
    for piece in slices:
        for whole in task.records(settings, piece, left_out.get(piece[1])):
            for raw, columns, is_delete in _decoded(settings, whole):
                if skip_deletes:
                    kept = pc.invert(is_delete)
                    raw, columns, is_delete = raw.filter(kept), [c.filter(kept) for c in columns], is_delete.filter(kept)
                yield pa.RecordBatch.from_arrays([*columns, *_metadata(raw, is_delete)], schema=schema)


def _decoded(settings: task.DirectSettings, raw: pa.RecordBatch) -> Iterator[tuple[pa.RecordBatch, list[pa.Array], pa.Array]]:
    """`raw` decoded as the scan decoded it. The reader may group the records otherwise than in
    the scan, and the decoder takes a batch whole or not at all: a batch it refuses is decoded in
    halves (every record here was decoded by the scan)."""
    try:
        yield task.decoded(settings, raw)
    except task.Refused:
        if raw.num_rows < 2:
            raise
        half = raw.num_rows // 2
        yield from _decoded(settings, raw.slice(0, half))
        yield from _decoded(settings, raw.slice(half))


def _metadata(raw: pa.RecordBatch, is_delete: pa.Array) -> list[pa.Array]:
    stamps = raw.column("timestamp")
    n = raw.num_rows
    return [
        pc.if_else(is_delete, C.DELETE, C.UPSERT),
        raw.column("topic"),
        raw.column("partition"),
        raw.column("offset"),
        pc.cast(pc.multiply(stamps, 1000), pa.timestamp("us", "UTC")),
        raw.column("key"),
        raw.column("headers"),
        pa.nulls(n, pa.string()),
        pa.StructArray.from_arrays([stamps, raw.column("partition"), raw.column("offset")], fields=list(ORDER)),
    ]
