"""Executor side of a SQL batch whose messages Spark keeps (a cluster, or a Spark Connect server
whose tasks may run on hosts other than the one that scanned): the scan task writes its rows'
messages by the one rule (direct/sql_task.messages_of) as rows of a local checkpoint, each with
its partition and row number, and ends with one row that holds its report. The driver judges
the batch from the reports, then tasks produce the checkpoint's messages.

The driver reads the reports only once the checkpoint is complete (Spark computes a part lost
while it is made again, before anything is judged); a part lost after that is never computed
again from the database, whose rows may have changed since the batch was judged: reading it
fails the task, and so the run, before the watermark moves.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa

from dpone_dagster.direct.outgoing import SENT_KEY
from dpone_dagster.direct.sql_task import (
    MESSAGES,
    ORDER,
    SqlSettings,
    candidates_in,
    kept_batches,
    kept_rows,
    messages_of,
    sent,
    without,
)
from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches

FILE, ROW, REPORT = "file", "row", "report"
POSITION = "position"  # a listed message's place in the ordered produce


def kept_columns(settings: SqlSettings) -> list[str]:
    """The checkpoint's columns: partition and row number, the kept message, and the report (set
    on a task's last row only, every other column null there)."""
    order = [ORDER] if settings.keeps_order else []
    sent_key = [SENT_KEY] if sends_registry_keys(settings) else []
    return [FILE, ROW, *MESSAGES.names, *order, *sent_key, REPORT]


def sends_registry_keys(settings: SqlSettings) -> bool:
    return settings.rule.key_format is not None and settings.rule.key_columns is not None


def scan(settings: SqlSettings, schema: pa.Schema, partition: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The checkpoint rows of one partition's messages, then its report's row."""
    written = messages_of(settings, batches)
    row = 0
    while True:
        try:
            kept = next(written)
        except StopIteration as done:
            report = replace(done.value, partition=partition)
            break
        yield positioned(kept, partition, row, schema)
        row += kept.num_rows
    ending = [pa.nulls(1, f.type) for f in schema][:-1] + [pa.array([pickle.dumps(report)], pa.binary())]
    yield pa.RecordBatch.from_arrays(ending, schema=schema)


def positioned(kept: pa.RecordBatch, partition: int, row: int, schema: pa.Schema) -> pa.RecordBatch:
    """Kept messages as rows of `schema`: each with its partition and row number (`row`: the
    first's), the report (where the schema has one) null (pure)."""
    n = kept.num_rows
    columns = {FILE: pa.array(np.full(n, partition, np.int32)), ROW: pa.array(np.arange(row, row + n))}
    columns.update({name: kept.column(name) for name in kept.schema.names})
    return pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) if f.name != REPORT else pa.nulls(n, pa.binary()) for f in schema], schema=schema)


def published_rows(
    settings: SqlSettings, partition: int, batches: Iterator[pa.RecordBatch], left_out: dict[int, np.ndarray] | None, file: str, row: str
) -> Iterator[pa.RecordBatch]:
    """The read rows of one partition that are published, each with its partition and row number
    as the scan numbered its message (columns `file` and `row`): the rows the scan keeps a message
    of, but those `left_out` (per partition, sorted; None: none)."""
    dropped = None if left_out is None else left_out.get(partition)
    for first, batch in kept_rows(settings.rule, batches):
        rows = np.arange(first, first + batch.num_rows)
        numbered = batch.append_column(file, pa.array(np.full(batch.num_rows, partition, np.int32))).append_column(row, pa.array(rows))
        kept = without(numbered, rows, dropped)
        if kept.num_rows:
            yield kept


def file_rows(files: list[tuple[int, str]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of kept files (partition, path) as the checkpoint's rows (without the report):
    what Spark settles keys that repeat on when the files store keeps them."""
    for partition, path in files:
        for row, kept in kept_batches(path):
            yield positioned(kept, partition, row, schema)


def candidates(batches: Iterator[pa.RecordBatch], found: np.ndarray) -> Iterator[pa.RecordBatch]:
    """The checkpoint's messages whose key hash is a candidate, as sql_task.candidate_records
    gives them."""
    for batch in batches:
        if not batch.num_rows:
            continue
        partition = int(batch.column(FILE)[0].as_py())
        picked = candidates_in(batch, partition, batch.column(ROW).to_numpy(), found)
        if picked is not None:
            yield from picked.to_batches()


def produce(settings: SqlSettings, producer: ProducerSettings, batches: Iterator[pa.RecordBatch], left_out: dict[int, np.ndarray]) -> Iterator[pa.RecordBatch]:
    """Produce a partition's messages but the rows `left_out` (per partition, sorted); yields the
    delivery statistics (sinks/kafka.py)."""

    kept = (without(b, b.column(ROW).to_numpy(), left_out.get(int(b.column(FILE)[0].as_py()))) for b in batches if b.num_rows)
    yield from produce_all(settings, producer, kept)


def listed(batches: Iterator[pa.RecordBatch], rows_of: dict[int, tuple[np.ndarray, np.ndarray]]) -> Iterator[pa.RecordBatch]:
    """The messages listed for the ordered produce, each with its place in the list: `rows_of` is
    per partition (row numbers sorted, their places)."""
    for batch in batches:
        if not batch.num_rows:
            continue
        found = rows_of.get(int(batch.column(FILE)[0].as_py()))
        if found is None:
            continue
        rows, places = found
        at = np.searchsorted(rows, batch.column(ROW).to_numpy())
        hit = rows[np.minimum(at, len(rows) - 1)] == batch.column(ROW).to_numpy()
        if hit.any():
            picked = batch.filter(pa.array(hit))
            columns = {POSITION: pa.array(places[at[hit]], pa.int64()), "key": picked.column("key"), "value": picked.column("value")}
            if SENT_KEY in picked.schema.names:
                columns[SENT_KEY] = picked.column(SENT_KEY)
            yield pa.RecordBatch.from_pydict(columns)


def produce_all(settings: SqlSettings, producer: ProducerSettings, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Produce every message as it comes, from one producer (so each key's keep their order)."""
    yield from produce_batches(producer, (sent(settings, b) for b in batches if b.num_rows))
