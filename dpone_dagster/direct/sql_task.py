"""Executor side of the direct path of a SQL source: the rows Spark reads (JDBC, bcp, pyodbc) come
to the Python task of their partition once; it writes each row's message by the one rule
(shape/message.py), keeps the messages in a file of its executor and reports counts and key
hashes (scan). Once the driver has judged the whole batch, tasks produce the kept files (produce).
The rows never return to the JVM: handing them back costs more than the whole encoding
(docs/performance.md).

Nothing can read a SQL partition again and be sure of the same rows, so a kept file that is gone
fails its produce task (the driver only takes this path where every task runs on its own host).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from dpone_dagster import columns as C
from dpone_dagster.direct.keys import TaskHashes, in_sorted, is_candidate, keyed_hashes
from dpone_dagster.direct.outgoing import SENT_KEY, outgoing, sent_size
from dpone_dagster.direct.spill import SpillWriter, remove_file, run_directory, sweep_stale_spills
from dpone_dagster.shape import headers as message_headers
from dpone_dagster.shape import message
from dpone_dagster.shape.headers import HeaderSpec
from dpone_dagster.sinks import json_encode
from dpone_dagster.sinks.json_encode import NumberKey
from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches

MESSAGES = pa.schema([("key", pa.binary()), ("value", pa.binary())])
ORDER = "order"  # a kept message's source order, where keys that repeat are settled
LISTED_CHUNK = 100_000  # listed messages one ordered produce holds at a time


@dataclass(frozen=True)
class SqlSettings:
    run_id: str
    pipeline: str  # its files are apart from another pipeline's of the same run id (one Dagster run)
    names: tuple[str, ...]  # the payload columns
    rule: message.MessageRule
    hashed: bool  # the driver needs key hashes (keys that repeat)
    max_message_bytes: int
    header_bytes: int = 0  # the static headers' bytes, in every message
    value_frame_bytes: int = 0  # what a registry frame adds to a value (a tombstone's stays null)
    key_frame_bytes: int = 0  # what a registry frame adds to a key, when keys are encoded
    value_prefix: bytes = b""  # the frame, once the schema is registered (set before producing)
    key_prefix: bytes = b""  # the key subject's frame, for registry-encoded keys
    headers: HeaderSpec | None = None
    # keep_last | keep_first: each kept message keeps its row's source order (columns.ORDER), so
    # that the driver settles keys that repeat (candidate_records) as the Spark SQL path would.
    keep: str | None = None
    # Keys that repeat are all published (an append, duplicate_policy: allow): each kept message
    # keeps its row's source order too, so that the driver orders their messages (produce_listed).
    ordered: bool = False
    # Rows one task may scan (engine/direct_sql.scan_bound): past them it stops and refuses the
    # batch (the driver sends it to the Spark SQL path), so the key hashes and candidate rows the
    # driver gathers, and the scan's time bound, stay bounded.
    max_rows: int | None = None
    # Keyed rows whose hashes one task reports (engine/direct_sql.MAX_TASK_HASHES): past them it
    # reports none (`unhashed`), and Spark settles the keys that repeat.
    max_hashes: int | None = None
    # Row numbers of messages over message.max.bytes one task lists (engine/direct_sql
    # .MAX_OVERSIZED_LISTED): past them it lists none, and the driver hands the batch over.
    max_oversized_listed: int | None = None
    # Numbers Java 17 may print otherwise than the shortest digits, as Spark printed them
    # (spark/printed_numbers.py): the scan met them without a text and the driver had Spark print them.
    spark_numbers: Mapping[NumberKey, str] = field(default_factory=dict)

    @property
    def keeps_order(self) -> bool:
        return self.keep is not None or self.ordered


@dataclass(frozen=True)
class SqlReport:
    """What one scan task tells the driver."""

    path: str  # the kept messages' file ("" where Spark keeps them)
    rows: int = 0
    deletes: int = 0
    messages: int = 0
    keyless: int = 0  # upserts without their unique key
    keyless_deletes: int = 0  # deletes without a key to make their tombstone of
    oversized: int = 0  # messages over message.max.bytes
    oversized_rows: tuple[int, ...] = ()  # their row numbers among the kept messages (all, or none past the bound)
    refused: str | None = None  # a value the rule does not write
    hashes: TaskHashes | None = None
    partition: int = 0  # the Spark partition scanned; kept messages are named by it
    unhashed: bool = False  # more keyed rows than the task hashes (max_hashes): none reported
    numbers: frozenset[NumberKey] = frozenset()  # numbers met without Spark's text (written as 0.0 meanwhile)


def scan(settings: SqlSettings, partition: int, batches: Iterator[pa.RecordBatch]) -> SqlReport:
    """Write the messages of one Spark partition's rows into its file on this host; never raises
    for a row (the report says what the driver must judge)."""
    path = spill_path(settings, partition)
    sweep_stale_spills(settings.run_id)  # what killed runs of any pipeline left on this host
    written = messages_of(settings, batches)
    with SpillWriter(path, MESSAGES) as spill:
        while True:
            try:
                spill.write(next(written))
            except StopIteration as done:
                return replace(done.value, path=path, partition=partition)


def messages_of(settings: SqlSettings, batches: Iterator[pa.RecordBatch]) -> Generator[pa.RecordBatch, None, SqlReport]:
    """Each row's message by the one rule, batch by batch as kept (key, value, and the source
    order and sent key where kept); returns the report of the rows (without path or partition).
    Where the messages are kept is the caller's: a file of this host, or Spark's storage."""
    rows = deletes = messages = keyless = keyless_deletes = oversized = 0
    oversized_rows: list[int] = []  # few (each is over message.max.bytes), and bounded
    hashes: list[np.ndarray] = []
    refused, unhashed = None, False
    rule, names = settings.rule, list(settings.names)
    with json_encode.spark_numbers(settings.spark_numbers, collect=True) as numbers:
        for batch in batches:
            rows += batch.num_rows
            if refused is None and len(numbers.unknown or ()) > json_encode.MAX_UNPRINTED:
                refused = json_encode.TOO_MANY_UNPRINTED
            if settings.max_rows is not None and rows > settings.max_rows:
                refused = f"more than {settings.max_rows:,} rows in one scan task (twice the rows counted when planning, or a share of the bound where none were)"
                break  # Spark ends the read with the task
            is_delete = deletes_of(batch)
            found = int(pc.sum(is_delete).as_py() or 0)
            deletes += found
            if found and leaves_out_deletes(rule):  # left out (fail: the driver fails the run)
                batch, is_delete = batch.filter(pc.invert(is_delete)), is_delete.filter(pc.invert(is_delete))
            if refused is not None or not batch.num_rows:
                continue
            columns = [batch.column(n) for n in names]
            try:
                key, value = message.key_and_value(rule, columns, names, is_delete, None)
                sent_key = message.registry_key(rule, columns, names)
            except message.Unwritable as exc:
                refused = str(exc)
                continue
            missing = key.null_count
            if missing:  # judged by the driver as the Spark SQL path judges them (engine/stages/shape.py)
                upserts = int(pc.sum(pc.and_(pc.is_null(key), pc.invert(is_delete))).as_py() or 0)
                tombstones = missing - upserts if rule.deletes == "tombstone" else 0
                keyless += upserts if rule.key_columns is not None else 0
                keyless_deletes += tombstones  # the rest are delete events, published unsettled
            sizes = pc.add(sent_size(key if sent_key is None else sent_key, settings.key_frame_bytes), sent_size(value, settings.value_frame_bytes))
            over = pc.greater(sizes, settings.max_message_bytes - settings.header_bytes).to_numpy(zero_copy_only=False)
            oversized += int(over.sum())
            if settings.max_oversized_listed is None or oversized <= settings.max_oversized_listed:
                oversized_rows.extend(int(r) + messages for r in np.flatnonzero(over))
            else:
                oversized_rows.clear()
            if settings.hashed and not unhashed:
                if settings.max_hashes is not None and messages + batch.num_rows > settings.max_hashes:
                    unhashed, hashes = True, []
                else:
                    hashes.append(keyed_hashes(key))  # keys are told apart by their text, as on the Spark SQL path
            kept, kept_names = [key, value], list(MESSAGES.names)
            if settings.keeps_order:
                kept, kept_names = [*kept, batch.column(C.ORDER)], [*kept_names, ORDER]
            if sent_key is not None:
                kept, kept_names = [*kept, sent_key], [*kept_names, SENT_KEY]
            yield pa.RecordBatch.from_arrays(kept, names=kept_names)
            messages += batch.num_rows
    hashed = TaskHashes.of(hashes) if settings.hashed and not unhashed and refused is None else None
    return SqlReport(
        "", rows, deletes, messages, keyless, keyless_deletes, oversized, tuple(oversized_rows), refused, hashed,
        unhashed=unhashed, numbers=frozenset(numbers.unknown or ()),
    )


def deletes_of(batch: pa.RecordBatch) -> pa.Array:
    """Which rows are deletes (an op of `delete`; a null op is not) (pure)."""
    return pc.fill_null(pc.equal(batch.column(C.OP), C.DELETE), False)


def leaves_out_deletes(rule: message.MessageRule) -> bool:
    """Deletes get no message: skipped, or counted for the driver to fail the run."""
    return rule.deletes in ("skip", "fail")


def kept_rows(rule: message.MessageRule, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The read rows the scan keeps a message of, each batch with the row number of its first, as
    `messages_of` numbers the kept messages (pure)."""
    row = 0
    for batch in batches:
        if leaves_out_deletes(rule):
            batch = batch.filter(pc.invert(deletes_of(batch)))
        yield row, batch
        row += batch.num_rows


def candidate_records(files: list[tuple[int, str]], candidates: np.ndarray) -> pa.Table | None:
    """The kept messages of `files` (partition, path) whose key hash is a candidate (direct/keys.py,
    sorted): their key, file (partition), row number in it and source order (where kept); what
    the driver settles repeated keys on."""
    found = [
        picked
        for partition, path in files
        for row, batch in kept_batches(path)
        if (picked := candidates_in(batch, partition, np.arange(row, row + batch.num_rows), candidates)) is not None
    ]
    return pa.concat_tables(found) if found else None


def candidates_in(batch: pa.RecordBatch, partition: int, rows: np.ndarray, candidates: np.ndarray) -> pa.Table | None:
    """The messages of one kept batch (`rows`: their row numbers) whose key hash is a candidate,
    as `candidate_records` gives them (pure)."""
    chosen = np.flatnonzero(is_candidate(batch.column("key"), candidates))
    if not len(chosen):
        return None
    picked = batch.take(pa.array(chosen))
    columns = {"key": picked.column("key"), "file": pa.array(np.full(len(chosen), partition, np.int32)), "row": pa.array(rows[chosen], pa.int64())}
    if ORDER in picked.schema.names:
        columns[ORDER] = picked.column(ORDER)
    return pa.table(columns)


def without(batch: pa.RecordBatch, rows: np.ndarray, dropped: np.ndarray | None) -> pa.RecordBatch:
    """The kept batch whose row numbers are `rows`, but those `dropped` (sorted) (pure)."""
    if dropped is None or not len(dropped):
        return batch
    return batch.filter(pa.array(~in_sorted(rows, dropped)))


def produce(settings: SqlSettings, producer: ProducerSettings, files: list[tuple[int, str]], left_out: dict[int, np.ndarray] | None = None) -> Iterator[pa.RecordBatch]:
    """Produce the kept messages of `files` (partition, path) but the rows `left_out` (per
    partition: row numbers, sorted); yields the delivery statistics (sinks/kafka.py). A file that
    is gone fails the task: its rows cannot be read again as they were judged."""

    def messages() -> Iterator[pa.RecordBatch]:
        for partition, path in files:
            dropped = (left_out or {}).get(partition)
            for row, batch in kept_batches(path):
                batch = without(batch, np.arange(row, row + batch.num_rows), dropped)
                if batch.num_rows:
                    yield sent(settings, batch)

    try:
        yield from produce_batches(producer, messages())
    finally:
        for _, path in files:
            remove_file(path)


def produce_listed(settings: SqlSettings, producer: ProducerSettings, paths: list[str], files: np.ndarray, rows: np.ndarray) -> Iterator[pa.RecordBatch]:
    """Produce the kept messages listed, in the order listed (the i-th: row `rows[i]` of file
    `paths[files[i]]`) from one producer, so that each key's messages keep that order on their
    partition; yields the delivery statistics. A chunk of the list at a time is read from the
    memory-mapped files, so a long list holds no more. The files stay: the rest is produced next."""
    with contextlib.ExitStack() as stack:
        readers = [ipc.open_file(stack.enter_context(pa.memory_map(_existing(path)))) for path in paths]
        starts = [np.cumsum([0] + [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]) for reader in readers]

        def messages() -> Iterator[pa.RecordBatch]:
            for begin in range(0, len(rows), LISTED_CHUNK):
                chunk_files, chunk_rows = files[begin : begin + LISTED_CHUNK], rows[begin : begin + LISTED_CHUNK]
                taken, positions = [], []
                for index in np.unique(chunk_files):
                    listed = np.flatnonzero(chunk_files == index)
                    batch_of = np.searchsorted(starts[index], chunk_rows[listed], side="right") - 1
                    for b in np.unique(batch_of):
                        inside = listed[batch_of == b]
                        taken.append(readers[index].get_batch(int(b)).take(pa.array(chunk_rows[inside] - starts[index][b])))
                        positions.append(inside)
                found = pa.Table.from_batches(taken)
                in_order = found.take(pa.array(np.argsort(np.concatenate(positions), kind="stable")))
                for batch in in_order.to_batches():
                    yield sent(settings, batch)

        yield from produce_batches(producer, messages())


def sent(settings: SqlSettings, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Kept messages as the producer sends them."""
    listed = None
    if settings.headers is not None:  # static ones only: SQL rows have no lineage
        listed = message_headers.headers(settings.headers, 0, pa.array(np.zeros(batch.num_rows, np.int64)), None)
    return outgoing(batch, settings.value_prefix, listed, settings.key_prefix)


def kept_batches(path: str) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The kept batches of one file, each with the row number of its first message."""
    row = 0
    with pa.memory_map(_existing(path)) as source:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            yield row, batch
            row += batch.num_rows


def _existing(path: str) -> str:
    if not os.path.exists(path):
        raise RuntimeError(f"the kept messages {path} are gone (another host, or removed): the batch cannot be produced as judged")
    return path


def spill_path(settings: SqlSettings, partition: int) -> str:
    """Under the Spark local directory the task sees (a worker's own, in a Python task)."""
    return os.path.join(run_directory(settings.run_id), f"sql-{settings.pipeline}-{partition}.arrow")


def remove_kept(settings: SqlSettings) -> int:
    """Remove the pipeline's files of the run on this host, partial ones too, and the run's
    directory once empty; how many files went. Run it in a Spark task: a Python worker's Spark
    local directory is not the driver's."""
    directory = run_directory(settings.run_id)
    removed = 0
    try:
        names = [n for n in os.listdir(directory) if n.startswith(f"sql-{settings.pipeline}-")]
    except OSError:
        return 0
    for name in names:
        remove_file(os.path.join(directory, name))
        removed += 1
    try:
        os.rmdir(directory)
    except OSError:  # other files of the run, or gone already
        pass
    return removed

