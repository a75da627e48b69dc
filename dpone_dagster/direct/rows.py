"""Executor side of the checks Spark SQL judges on a direct-path batch (engine/direct_checks.py):
a task yields the decoded rows of its slices (direct/row_form.py), so that a check — Great
Expectations included — sees the same columns on either path.

The scan keeps them in a file per slice when such a check is declared (direct/task.py,
DirectSettings.keep_rows): no second read of the topic, no second decode. A task that finds no
file (another executor of a cluster, a check the scan found it could not measure) reads the slice
again: the offsets are fixed, so the rows are the ones the scan shaped."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from dpone_dagster import columns as C
from dpone_dagster.direct import task
from dpone_dagster.direct.keys import in_sorted
from dpone_dagster.direct.progress import Slice
from dpone_dagster.direct.row_form import as_rows, rows_schema, without


def judged_rows(
    settings: task.DirectSettings, slices: list[Slice], left_out: dict[int, np.ndarray], skip_deletes: bool
) -> Iterator[pa.RecordBatch]:
    """The decoded records of `slices` without the source offsets `left_out` (per partition, sorted:
    those the scan set aside, and for the rows as published those left out after it), and without
    the deletes when they are skipped."""
    for piece in slices:
        dropped = left_out.get(piece[1])
        kept = _kept_rows(settings, piece)
        if kept is None:
            yield from _read_again(settings, piece, dropped, skip_deletes)
            continue
        for rows in kept:
            marks = pa.array(in_sorted(rows.column(C.SOURCE_OFFSET).to_numpy(), dropped)) if dropped is not None and len(dropped) else None
            rows = without(rows, marks, skip_deletes)
            if rows.num_rows:
                yield rows


def _kept_rows(settings: task.DirectSettings, piece: Slice) -> Iterator[pa.RecordBatch] | None:
    """The slice's rows as its scan kept them, or None when this host has no file of them."""
    try:
        source = pa.memory_map(task.rows_path(settings, piece))
    except FileNotFoundError:
        return None

    def batches() -> Iterator[pa.RecordBatch]:
        with source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    return batches()


def _read_again(settings: task.DirectSettings, piece: Slice, left_out: np.ndarray | None, skip_deletes: bool) -> Iterator[pa.RecordBatch]:
    schema = rows_schema(settings.schema)
    for whole in task.records(settings, piece, left_out):
        for raw, columns, is_delete in _decoded(settings, whole):
            rows = without(as_rows(schema, raw, columns, is_delete), None, skip_deletes)
            if rows.num_rows:
                yield rows


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
