"""Executor side of the direct path: a Spark task reads its slices of the source, decodes and
shapes every record into the sink's message, and keeps the messages in a file of its executor
(scan); once the driver has judged the whole batch, a task produces them (produce).

Everything a task needs travels as plain data in `DirectSettings`. A produce task that finds no
file for a slice (a retried task on another executor, a cluster that moved it) reads and shapes
that slice again: the offsets are fixed, so the messages are the same.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from dpone_dagster.columns import DELETE_OPS
from dpone_dagster.direct.keys import TaskHashes, in_sorted, is_candidate, keyed_hashes
from dpone_dagster.direct.late import WindowRange, late_records
from dpone_dagster.direct.outgoing import SENT_KEY, outgoing, sent_keys, sent_size
from dpone_dagster.direct.progress import Slice
from dpone_dagster.direct.row_form import as_rows, rows_schema
from dpone_dagster.direct.spark_rows import SparkRows
from dpone_dagster.direct.spill import SpillWriter, remove_file, run_directory, sweep_stale_spills
from dpone_dagster.formats import json_suspects, registry_source
from dpone_dagster.quality import arrow_checks
from dpone_dagster.quality.arrow_checks import RowCheck, Tally
from dpone_dagster.shape import headers as message_headers
from dpone_dagster.shape import message
from dpone_dagster.shape.headers import HeaderSpec
from dpone_dagster.sinks import json_encode
from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches
from dpone_dagster.sources.kafka_reader import ReaderSettings, read_one_range
from dpone_dagster.spark import arrow_json

if TYPE_CHECKING:
    from dpone_dagster.sources.kafka import RegistryPlan

# The shaped messages a scan keeps: the sink's key and value, the source offset and timestamp,
# and the source record's headers when they are replicated.
MESSAGE_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("offset", pa.int64()), ("timestamp", pa.int64())])
SOURCE_HEADERS = "source_headers"
# The records of keys that may repeat, as the driver settles them (candidate_records).
CANDIDATES = pa.schema([("key", pa.binary()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("partition", pa.int32())])


@dataclass(frozen=True)
class DirectSettings:
    reader: ReaderSettings
    schema: pa.Schema  # the payload schema, as the read tasks decode it (spark/arrow_json.py)
    key_columns: tuple[int, ...] | None  # fields of a unique_key; None: no key (null)
    hashed: bool  # the driver needs key hashes (de-duplication, per-key order)
    max_message_bytes: int  # a larger message is a bad record (source.options.on_error)
    run_id: str
    # Which scan of the run's batch this is (engine/direct.copy scans again when the source's plan
    # changes): each has its own spill files, so no task of a later scan takes an earlier one's.
    scan: int = 1
    windows: tuple[WindowRange, ...] = ()  # a time-window read: where late records are counted
    # A registry sink: format, schema, and for protobuf the message indexes and imported files, to
    # encode the values with (unframed).
    value_format: tuple[str, str, tuple[int, ...] | None, tuple[tuple[str, str], ...]] | None = None
    frame_bytes: int = 0  # bytes the frame adds to each value (counted in the size limit)
    value_prefix: bytes = b""  # the frame, once the schema is registered (set before producing)
    # Registry-encoded keys: the key subject's format and schema (shape/message.py), the bytes its
    # frame adds to each key, and the frame once registered.
    key_format: tuple[str, str] | None = None
    key_frame_bytes: int = 0
    key_prefix: bytes = b""
    routes: tuple[tuple[str, str], ...] = ()  # on_type_change: new_column (shape/message.py)
    envelope: tuple[str, str] | None = None  # the dpone envelope's text around each row's JSON
    hash_row: bool = False  # key: the hex SHA-256 of the row's canonical JSON
    headers: HeaderSpec | None = None  # headers the messages carry
    source_envelope: str = "flat"  # flat | dpone: how the source's values are decoded
    # envelope: auto (decided per record by Spark: an object with op and data is an envelope): a
    # value without its data, which the task decoder cannot tell from a null data, is set aside.
    envelope_auto: bool = False
    # What a delete (a tombstone, an envelope with a delete op) becomes: "tombstone", "event" (a
    # dpone envelope with op delete: `delete_envelope`), or, with deletes disabled, "skip" (left
    # out) or "fail" (counted; the run fails before producing).
    deletes: str = "fail"
    delete_envelope: tuple[str, str] | None = None
    # key.mode unique_key: a delete whose key columns give no key takes the source record's key
    # (also when the sink names no unique_key columns, as the Spark SQL path does).
    source_key_for_deletes: bool = False
    # A registry-framed source: the subject's schemas the values are decoded with (None: JSON).
    registry_source: RegistryPlan | None = None
    row_checks: tuple[RowCheck, ...] = ()  # the quality checks measured on the decoded rows
    # late_records: dead_letter: late records are left out of the batch (the driver sends them).
    hold_back_late: bool = False
    # JSON (flat or dpone envelopes): records the task decoder does not read are set aside for the
    # driver to judge with Spark's own decoder (bad records follow source.options.on_error).
    screen_undecodable: bool = False
    # Checks Spark SQL judges are declared: the scan keeps each slice's decoded rows for them
    # (direct/rows.py), in a file beside its messages.
    keep_rows: bool = False
    # Numbers the encoder leaves to Spark's printing, as Spark printed them (json_encode.SparkNumbers).
    spark_numbers: Mapping[json_encode.NumberKey, str] = field(default_factory=dict)
    # Records only Spark's decoder reads, as it decoded them (direct/spark_rows.py).
    spark_rows: SparkRows | None = None

    @property
    def message_rule(self) -> message.MessageRule:
        """How a row becomes its message (shape/message.py)."""
        return message.MessageRule(
            self.key_columns, self.hash_row, self.value_format, self.envelope, self.deletes, self.delete_envelope,
            self.source_key_for_deletes, self.key_format, self.routes,
        )


@dataclass(frozen=True)
class ScanReport:
    """What one scan task tells the driver: counts, and why it stopped, if it did."""

    rows: int
    bytes: int
    refused: str | None  # the batch needs the Spark SQL path
    hashes: TaskHashes | None = None  # of the keys, when the driver needs them
    late: dict[int, int] = field(default_factory=dict)  # late records per window index
    deletes: int = 0  # deletes in the slices (left out of the messages when skipped)
    schema_ids: frozenset[int] = frozenset()  # a registry source: the schema ids its values carry
    checks: Tally | None = None  # the row-level quality checks' measures
    # Where the records left out of the messages are, for the driver to judge as bad records (SET_ASIDE_KEPT).
    set_aside: pa.Table | None = None
    kept: tuple[tuple[Slice, int], ...] = ()  # the messages kept per slice
    numbers: frozenset[json_encode.NumberKey] = frozenset()  # numbers met that Spark has not printed yet


class Refused(Exception):
    """A record the direct path leaves to the Spark SQL path (its reason is the message)."""


class Undecodable(Refused):
    """A value the task decoder does not read: JSON (corrupt, another type, or drift: Spark's
    decoder judges it) or registry-framed (a bad record, with the decoder's reason)."""


UNPLANNED = "schema id(s) outside the plan"
UNPRINTED = "numbers Spark has not printed yet"


class UnplannedIds(Refused):
    """Registry-framed values of ids the plan does not hold: the scan stops and reports every id
    of its slices, for the driver to fetch them by id and scan again."""

    def __init__(self, ids: set[int]):
        super().__init__(f"{UNPLANNED}: {sorted(ids)}")


# Records a scan task sets aside for the driver (more go to the Spark SQL path): where the record
# is and its timestamp (the driver reads the records themselves again in Spark,
# engine/direct_bad_records.py), why (undecodable: the task decoder does not read it; keyless: an
# upsert without its unique key; oversized: its message exceeds message.max.bytes) and, when
# oversized, the message's size and key.
SET_ASIDE_KEPT = 250_000  # a whole task of the default records_per_task
SET_ASIDE_BYTES = 64 << 20  # ... and at most this many bytes of them (keys and reasons)
ASIDE_NAMES = ("partition", "offset", "timestamp", "kind", "size", "message_key", "reason")


def shape(
    settings: DirectSettings, raw: pa.RecordBatch, partition: int = 0, tally: Tally | None = None, rows: SpillWriter | None = None
) -> tuple[pa.RecordBatch, int, pa.Array]:
    """The sink's messages of one batch of raw records of `partition` — key, value (JSON as Spark
    writes it, a registry format, or null for a tombstone), the source offset and timestamp — how
    many of the records are deletes, and the offsets of upserts without their unique key (left
    out of the messages); the decoded rows are measured into `tally` and written to `rows` when
    given. Raises Refused for what only the Spark SQL path handles."""
    raw, columns, is_delete = decoded(settings, raw)
    if rows is not None:
        rows.write(as_rows(rows.schema, raw, columns, is_delete))
    deletes = int(pc.sum(is_delete).as_py() or 0)
    if tally is not None:
        skipped = is_delete if settings.deletes == "skip" else None
        try:
            arrow_checks.measure(
                settings.row_checks, tally, columns, settings.schema.names, is_delete, skipped,
                partition, raw.column("offset"), raw.column("timestamp"),
            )
        except arrow_checks.Unsettled as exc:
            raise Refused(str(exc)) from exc
    if deletes and settings.deletes == "skip":
        kept = pc.invert(is_delete)
        raw, columns, is_delete = raw.filter(kept), [c.filter(kept) for c in columns], is_delete.filter(kept)
    rule = settings.message_rule
    try:
        with json_encode.spark_numbers(settings.spark_numbers):
            key, value = message.key_and_value(rule, columns, settings.schema.names, is_delete, raw.column("key"))
            sent_key = message.registry_key(rule, columns, settings.schema.names)
    except message.Unwritable as exc:
        raise Refused(str(exc)) from exc
    if deletes and settings.source_key_for_deletes and pc.any(pc.and_(is_delete, key.is_null())).as_py():
        raise Refused("a delete without any key")
    if deletes and sent_key is not None and rule.deletes == "tombstone" and pc.any(pc.and_(is_delete, sent_key.is_null())).as_py():
        # A source tombstone has no columns for the key record: the Spark SQL path refuses the batch.
        raise Refused("a delete without the key columns of its registry-encoded key")
    keyless = pa.array([], pa.int64())
    if settings.key_columns is not None and key.null_count:  # upserts only: a delete has its key by now
        missing = key.is_null()
        keyless = raw.column("offset").filter(missing)
        kept = pc.invert(missing)
        raw, key, value = raw.filter(kept), key.filter(kept), value.filter(kept)
        sent_key = sent_key.filter(kept) if sent_key is not None else None
    arrays, names = [key, value, raw.column("offset"), raw.column("timestamp")], list(MESSAGE_SCHEMA.names)
    if settings.headers is not None and settings.headers.replicate:
        arrays, names = [*arrays, raw.column("headers")], [*names, SOURCE_HEADERS]
    if sent_key is not None:
        arrays, names = [*arrays, sent_key], [*names, SENT_KEY]
    return pa.RecordBatch.from_arrays(arrays, names=names), deletes, keyless


def decoded(settings: DirectSettings, raw: pa.RecordBatch) -> tuple[pa.RecordBatch, list[pa.Array], pa.Array]:
    """The payload columns of a batch and which records are deletes (a tombstone, or an envelope
    whose op is a delete op); the records only Spark's decoder reads as it decoded them."""
    found = settings.spark_rows.found(raw) if settings.spark_rows is not None else None
    if found is None:
        return _decoded(settings, raw)
    assert settings.spark_rows is not None
    rest = raw.filter(pa.array(~found))
    if rest.num_rows:
        _, columns, deletes = _decoded(settings, rest)
    else:
        columns, deletes = [pa.array([], f.type) for f in settings.schema], pa.array([], pa.bool_())
    columns, deletes = settings.spark_rows.splice(raw, found, columns, deletes)
    return raw, columns, deletes


def _decoded(settings: DirectSettings, raw: pa.RecordBatch) -> tuple[pa.RecordBatch, list[pa.Array], pa.Array]:
    values = raw.column("value")
    tombstone = values.is_null()
    if settings.source_envelope == "dpone":
        decoded = arrow_json.decode_envelopes(values, settings.schema)
        if decoded is None:
            raise Undecodable("an envelope the task decoder leaves to Spark (corrupt, another type, or a field beyond the schema)")
        op, has_data, columns = decoded
        if settings.envelope_auto and pc.any(pc.and_(pc.invert(tombstone), pc.invert(has_data))).as_py():
            raise Undecodable("a value without an envelope's data under envelope: auto (Spark decides what it is)")
        is_delete = pc.or_(tombstone, pc.fill_null(pc.is_in(op, pa.array(DELETE_OPS)), False))
        # An envelope without its op, or an upsert without its data, is a bad record.
        if pc.any(pc.and_(pc.invert(tombstone), pc.or_(op.is_null(), pc.and_(pc.invert(has_data), pc.invert(is_delete))))).as_py():
            raise Undecodable("an envelope without its op, or an upsert without its data")
        return raw, columns, is_delete
    if settings.registry_source is not None:
        unplanned = registry_source.unplanned_ids(settings.registry_source, values)
        if unplanned:
            raise UnplannedIds(unplanned)
        try:
            return raw, registry_source.decode_values(settings.registry_source, raw, settings.schema), tombstone
        except registry_source.Undecodable as exc:
            if exc.bad_record:
                raise Undecodable(str(exc)) from exc
            raise Refused(f"a value the registry decoder leaves to Spark ({exc})") from exc
    columns = arrow_json.decode_values(values, settings.schema)
    if columns is None:
        raise Undecodable("a value the task decoder leaves to Spark (corrupt, another type, or a field beyond the schema)")
    return raw, columns, tombstone


def rows_at(settings: DirectSettings, topic: str, partition: int, offset: int) -> list[dict]:
    """The payload of the record at `offset`, decoded as the scan decodes it (a sample row)."""
    rows = []
    for raw in read_one_range(settings.reader, topic, partition, offset, offset + 1):
        _, columns, _ = decoded(settings, raw)
        rows += pa.Table.from_arrays(columns, names=settings.schema.names).to_pylist()
    return rows


def _kept_messages(
    settings: DirectSettings, partition: int, raw: pa.RecordBatch, tally: Tally | None = None, rows: SpillWriter | None = None
) -> tuple[pa.RecordBatch, int, pa.Array, pa.RecordBatch | None]:
    """`shape`, with bad records set aside (SET_ASIDE): the messages, the deletes, the messages'
    sizes, and the raw records set aside (None when there are none)."""
    aside = []
    try:
        messages, deletes, keyless = shape(settings, raw, partition, tally, rows)
    except Undecodable:
        if not settings.screen_undecodable:
            raise
        bad = _undecodable(settings, raw)
        if not pc.any(bad).as_py():
            raise Refused("a batch the task decoder reads record by record but not whole") from None
        why = None
        if settings.registry_source is not None:  # the reasons the Spark SQL path's decoder gives
            why = pa.array(registry_source.reasons(settings.registry_source, raw.filter(pa.array(bad)), settings.schema), pa.string())
        aside.append(_aside(raw, bad, "undecodable", reasons=why))
        raw = raw.filter(pc.invert(bad))
        messages, deletes, keyless = shape(settings, raw, partition, tally, rows)
    if len(keyless):
        aside.append(_aside(raw, pc.is_in(raw.column("offset"), value_set=keyless), "keyless"))
    lengths = _lengths(settings, partition, messages)
    over = pc.greater(lengths, settings.max_message_bytes)
    if pc.any(over).as_py():
        # With its message key: keys that repeat are settled with it, and only a message they keep
        # is a bad record (engine/direct_bad_records.py), as the Spark SQL path measures the kept ones.
        where = pc.is_in(raw.column("offset"), value_set=messages.column("offset").filter(over))
        aside.append(_aside(raw, where, "oversized", lengths.filter(over), messages.column("key").filter(over)))
        kept = pc.invert(over)
        messages, lengths = messages.filter(kept), lengths.filter(kept)
    return messages, deletes, lengths, pa.Table.from_batches(aside).combine_chunks().to_batches()[0] if aside else None


def _undecodable(settings: DirectSettings, raw: pa.RecordBatch) -> pa.Array:
    """Which records of `raw` the task decoder does not read: JSON values that are no object on
    their own (a poisoned topic's garbage and cut values: one vectorised look); where both halves
    of the rest fail (more than one bad record), the JSON values it would likely refuse alone
    (formats/json_suspects.py: one look a value, where halving costs about seven decodes a bad
    record); then the others found by halves (`failing`). A suspect the decoder reads is decoded
    by Spark on the driver, as the records it does not read are."""
    values = raw.column("value")
    bad = np.zeros(raw.num_rows, bool)
    found = np.zeros(raw.num_rows, bool)  # decoded by Spark already: the task decoder reads them now
    if settings.registry_source is None:
        whole = pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))
        bad = pc.invert(pc.fill_null(whole, True)).to_numpy(zero_copy_only=False)
        spark_found = settings.spark_rows.found(raw) if settings.spark_rows is not None else None
        if spark_found is not None:
            found = np.asarray(spark_found, bool)
            bad &= ~found
    rest = np.flatnonzero(~bad)
    others = raw.take(pa.array(rest))
    ranges = _failing_halves(settings, others) if settings.registry_source is None else [(0, len(rest))]
    if len(ranges) == 2:  # more than one bad record: worth a look at each value
        look = ~bad & ~found
        candidates = values.filter(pa.array(look))
        if settings.source_envelope == "dpone":
            bad[look] = json_suspects.envelope_suspects(candidates, settings.schema, DELETE_OPS, settings.envelope_auto)
        else:
            bad[look] = json_suspects.suspects(candidates, settings.schema)
        rest = np.flatnonzero(~bad)
        others = raw.take(pa.array(rest))
        ranges = [(0, len(rest))]
    if int(bad.sum()) > SET_ASIDE_KEPT:
        raise Refused(f"more than {SET_ASIDE_KEPT} records the task decoder does not read in a batch")
    bad[rest] = failing(len(rest), lambda low, n: not _reads(settings, others.slice(low, n)), SET_ASIDE_KEPT - int(bad.sum()), ranges)
    return pa.array(bad)


def _failing_halves(settings: DirectSettings, raw: pa.RecordBatch) -> list[tuple[int, int]]:
    """The halves of `raw` that do not decode, as (low, high) ranges; the whole batch when it is
    too small to halve. Both failing means more than one bad record; one failing is searched alone
    (one bad record is found by ~2·log2(n) decodes of shrinking ranges, about one decode of the
    whole batch)."""
    n = raw.num_rows
    half = n // 2
    if not half:
        return [(0, n)]
    return [(low, high) for low, high in ((0, half), (half, n)) if not _reads(settings, raw.slice(low, high - low))]


def _aside(
    raw: pa.RecordBatch, where: pa.Array, kind: str, sizes: pa.Array | None = None, keys: pa.Array | None = None, reasons: pa.Array | None = None
) -> pa.RecordBatch:
    """Where the raw records `where` selects are, as set aside: the kind, the message's size and
    key (oversized), the decoder's reason (undecodable registry values)."""
    picked = raw.filter(where).select(["partition", "offset", "timestamp"])  # the timestamp orders repeated keys
    n = picked.num_rows
    kinds = pa.array([kind] * n, pa.string())
    sizes = sizes.cast(pa.int64()) if sizes is not None else pa.nulls(n, pa.int64())
    keys = keys if keys is not None else pa.nulls(n, pa.binary())
    reasons = reasons if reasons is not None else pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays([*picked.columns, kinds, sizes, keys, reasons], names=list(ASIDE_NAMES))


def _lengths(settings: DirectSettings, partition: int, messages: pa.RecordBatch) -> pa.Array:
    """Each message's size as the size limit counts it: key, value with its frame, headers."""
    lengths = pc.add(sent_size(messages.column("value"), settings.frame_bytes), sent_size(sent_keys(messages), settings.key_frame_bytes))
    if settings.headers is not None:
        lengths = pc.add(lengths, pa.array(_header_bytes(settings, partition, messages)))
    return lengths


def _reads(settings: DirectSettings, raw: pa.RecordBatch) -> bool:
    """Whether the task decoder reads every record of `raw`."""
    try:
        decoded(settings, raw)
    except Undecodable:
        return False
    return True


def failing(n: int, fails: Callable[[int, int], bool], limit: int, ranges: list[tuple[int, int]] | None = None) -> np.ndarray:
    """Which of `n` records fail, where `fails(low, count)` says whether a range holds one (pure):
    halves of a failing range are tried until single records are left, so a batch with few bad
    records costs few decodes. `ranges` ((low, high) pairs, the whole by default): where to look,
    the rest known to decode. Past `limit` failing records, Refused (the batch is the Spark SQL
    path's)."""
    out = np.zeros(n, bool)
    found = 0
    ranges = list(ranges) if ranges is not None else [(0, n)]
    while ranges:
        low, high = ranges.pop()
        if high <= low or not fails(low, high - low):
            continue
        if high - low == 1:
            out[low] = True
            found += 1
            if found > limit:
                raise Refused(f"more than {limit} records the task decoder does not read in a batch")
            continue
        middle = (low + high) // 2
        ranges += [(low, middle), (middle, high)]
    return out


def scan(settings: DirectSettings, slices: list[Slice]) -> ScanReport:
    """Read, decode and shape `slices`, keeping the messages in this executor's spill files. A
    number whose text only Spark prints alike (json_encode.SparkNumbers) and that the settings
    lack is collected through the whole scan, for the driver to have them printed and scan again."""
    with json_encode.spark_numbers(settings.spark_numbers, collect=True) as numbers:
        report = _scan(settings, slices, numbers)
    if numbers.unknown and report.refused is None:
        # The ids too: a driver that fetches ids by id plans the batch with every task's ids.
        return ScanReport(report.rows, report.bytes, f"{UNPRINTED}: {len(numbers.unknown)}", schema_ids=report.schema_ids, numbers=frozenset(numbers.unknown))
    return report


def _scan(settings: DirectSettings, slices: list[Slice], numbers: json_encode.SparkNumbers) -> ScanReport:
    rows = size = deletes = 0
    hashes: list[np.ndarray] = []
    ids: set[int] = set()
    late: dict[int, int] = {}
    tally = Tally() if settings.row_checks else None
    set_aside: list[pa.RecordBatch] = []
    kept_aside = kept_bytes = 0
    kept: list[tuple[Slice, int]] = []
    unread = list(slices)  # what the scan has not yet counted the schema ids of
    sweep_stale_spills(settings.run_id)
    try:
        for number, piece in enumerate(slices):
            unread = list(slices[number:])
            kept.append((piece, 0))
            rows_file = SpillWriter(rows_path(settings, piece), rows_schema(settings.schema)) if settings.keep_rows else None
            with SpillWriter(spill_path(settings, piece), MESSAGE_SCHEMA) as spill, rows_file or contextlib.nullcontext():
                for raw in read_one_range(settings.reader, *piece):
                    if settings.registry_source is not None:  # late records' too, as the Spark SQL path fetches them
                        ids |= registry_source.schema_ids(raw.column("value"))
                        unread[0] = _after(piece, raw)
                    raw, found_late = screen_late(settings, piece[1], raw)
                    for index, n in found_late.items():
                        late[index] = late.get(index, 0) + n
                    messages, found, lengths, aside = _kept_messages(settings, piece[1], raw, tally, rows_file)
                    deletes += found
                    if aside is not None:
                        set_aside.append(aside)
                        kept_aside += aside.num_rows
                        kept_bytes += aside.nbytes
                        rows += aside.num_rows  # extracted, as on the Spark SQL path
                        if kept_aside > SET_ASIDE_KEPT or kept_bytes > SET_ASIDE_BYTES:
                            raise Refused(f"more than {SET_ASIDE_KEPT} bad records, or {SET_ASIDE_BYTES >> 20} MB of them, in a task")
                    if settings.hashed:
                        hashes.append(keyed_hashes(messages.column("key")))  # a message without a key is never settled
                        if aside is not None:  # oversized messages are settled with the others
                            hashes.append(keyed_hashes(aside.column("message_key").filter(pc.equal(aside.column("kind"), "oversized"))))
                    spill.write(messages)
                    kept[-1] = (piece, kept[-1][1] + messages.num_rows)
                    rows += messages.num_rows + (found if settings.deletes == "skip" else 0)
                    size += int(pc.sum(lengths).as_py() or 0)
                    if len(numbers.unknown or ()) > json_encode.MAX_UNPRINTED:
                        raise Refused(json_encode.TOO_MANY_UNPRINTED)
    except UnplannedIds as exc:  # the ids of what is left are read without decoding
        return ScanReport(rows, size, str(exc), schema_ids=frozenset(ids | schema_ids_of(settings.reader, unread)))
    except Refused as exc:
        return ScanReport(rows, size, str(exc))
    return ScanReport(
        rows, size, None, TaskHashes.of(hashes) if settings.hashed else None, late, deletes, frozenset(ids), tally,
        pa.Table.from_batches(set_aside) if set_aside else None, tuple(kept),
    )


def _after(piece: Slice, raw: pa.RecordBatch) -> Slice:
    """What of `piece` follows the records of `raw`."""
    topic, partition, start, end = piece
    return (topic, partition, int(raw.column("offset")[-1].as_py()) + 1 if raw.num_rows else start, end)


def schema_ids_of(reader: ReaderSettings, slices: list[Slice]) -> set[int]:
    """Every schema id the values of `slices` carry (late records' too), read without decoding."""
    ids: set[int] = set()
    for piece in slices:
        if piece[2] >= piece[3]:
            continue
        for raw in read_one_range(reader, *piece):
            ids |= registry_source.schema_ids(raw.column("value"))
    return ids


def screen_late(settings: DirectSettings, partition: int, raw: pa.RecordBatch) -> tuple[pa.RecordBatch, dict[int, int]]:
    """The late records of a time-window read per window index, and the batch without them when
    they are held back for the dead-letter topic (as the Spark SQL path leaves them out)."""
    if not settings.windows:
        return raw, {}
    late, counts = late_records(settings.windows, partition, raw.column("offset").to_numpy(), raw.column("timestamp").to_numpy())
    if settings.hold_back_late and counts:
        raw = raw.filter(pa.array(~late))
    return raw, counts


def _header_bytes(settings: DirectSettings, partition: int, messages: pa.RecordBatch) -> np.ndarray:
    assert settings.headers is not None
    source = messages.column(SOURCE_HEADERS) if SOURCE_HEADERS in messages.schema.names else None
    return message_headers.header_bytes(settings.headers, partition, messages.column("offset"), source)


def candidate_records(settings: DirectSettings, slices: list[Slice], candidates: np.ndarray, set_aside: dict[int, np.ndarray]) -> pa.Table:
    """The messages of `slices` whose key hash is a candidate (direct/keys.py, sorted), with their slice's
    partition: what the driver needs to settle them on the keys themselves. `set_aside`: the
    source offsets the scan set aside, per partition."""
    found = []
    for piece in slices:
        for messages in slice_messages(settings, piece, set_aside.get(piece[1])):
            chosen = is_candidate(messages.column("key"), candidates)
            if chosen.any():
                picked = messages.filter(pa.array(chosen)).select(["key", "offset", "timestamp"])
                found.append(picked.append_column("partition", pa.repeat(pa.scalar(piece[1], pa.int32()), picked.num_rows)))
    return pa.Table.from_batches(found, CANDIDATES) if found else CANDIDATES.empty_table()


def produce(
    settings: DirectSettings, producer: ProducerSettings, slices: list[Slice], skip: dict[int, np.ndarray]
) -> Iterator[pa.RecordBatch]:
    """Produce the messages of `slices` except the source offsets in `skip` (per partition, sorted:
    those left out, and those the scan set aside); yields the delivery statistics rows of sinks/kafka.py.
    Spill files are removed once produced."""

    prefix = settings.value_prefix

    def messages() -> Iterator[pa.RecordBatch]:
        for piece in slices:
            dropped = skip.get(piece[1])
            for batch in slice_messages(settings, piece, dropped):
                if dropped is not None and len(dropped):
                    batch = batch.filter(pa.array(~in_sorted(batch.column("offset").to_numpy(), dropped)))
                if not batch.num_rows:
                    continue
                listed = None
                if settings.headers is not None:
                    source = batch.column(SOURCE_HEADERS) if SOURCE_HEADERS in batch.schema.names else None
                    listed = message_headers.headers(settings.headers, piece[1], batch.column("offset"), source)
                yield outgoing(batch, prefix, listed, settings.key_prefix)

    try:
        yield from produce_batches(producer, messages())
    finally:
        remove_spills(settings, slices)


def remove_spills(settings: DirectSettings, slices: list[Slice]) -> None:
    """Remove the slices' files and any partial file, and the run's directory once it is empty
    (the last task of the run on this executor removes it)."""
    for piece in slices:
        remove_file(spill_path(settings, piece))
        remove_file(rows_path(settings, piece))
    directory = run_directory(settings.run_id)
    try:  # what a worker killed mid-write left (the run writes nothing more once it removes)
        for name in os.listdir(directory):
            if name.endswith(".partial"):
                remove_file(os.path.join(directory, name))
    except OSError:
        pass
    try:
        os.rmdir(directory)
    except OSError:  # not empty (other slices of the run), or gone already
        pass


def remove_rows(settings: DirectSettings, slices: list[Slice]) -> None:
    """Remove the slices' decoded rows kept for the checks (direct/rows.py) once they are judged."""
    for piece in slices:
        remove_file(rows_path(settings, piece))


def records(settings: DirectSettings, piece: Slice, left_out: np.ndarray | None) -> Iterator[pa.RecordBatch]:
    """The raw records of one slice read again, as the scan took them (late records held back),
    without the source offsets `left_out` (sorted)."""
    for raw in read_one_range(settings.reader, *piece):
        raw = screen_late(settings, piece[1], raw)[0]
        if left_out is not None and len(left_out):
            raw = raw.filter(pa.array(~in_sorted(raw.column("offset").to_numpy(), left_out)))
        if raw.num_rows:
            yield raw


def slice_messages(settings: DirectSettings, piece: Slice, left_out: np.ndarray | None) -> Iterator[pa.RecordBatch]:
    """The shaped messages of one slice: from its spill file, or read and shaped again. Read
    again, the records the scan set aside must be among `left_out` (source offsets), or the task
    fails: the slice would not give the messages the driver judged."""
    path = spill_path(settings, piece)
    try:
        source = pa.memory_map(path)
    except FileNotFoundError:
        for raw in records(settings, piece, left_out):
            messages, _, _, aside = _kept_messages(settings, piece[1], raw)
            if aside is not None:
                raise RuntimeError(f"slice {piece} read again sets aside records its scan did not: {aside.column('offset').to_pylist()[:5]}") from None
            yield messages
        return
    with source:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def spill_path(settings: DirectSettings, piece: Slice) -> str:
    """Where a slice's messages are kept: under the executor's Spark local directory (removed with
    the executor), one directory per run."""
    topic, partition, start, end = piece
    return os.path.join(run_directory(settings.run_id), f"{topic}-{partition}-{start}-{end}-s{settings.scan}.arrow")


def rows_path(settings: DirectSettings, piece: Slice) -> str:
    """Where a slice's decoded rows are kept for the checks Spark SQL judges (direct/rows.py)."""
    return spill_path(settings, piece).removesuffix(".arrow") + ".rows.arrow"


