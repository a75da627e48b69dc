"""The row-level quality checks measured in the direct path's tasks, over Arrow (pure: no Spark,
no broker): not_null, accepted_values and freshness, by the rules of quality/gates.py.

A scan task measures every batch it decodes into a `Tally`: the offending rows' count per column,
their source positions (partition, offset), a few of them as sample rows, and the newest
freshness values. The driver adds the tasks' tallies up and, for the rows as published, takes out
the records de-duplication left out (`measured`): exact as long as the positions it needs were
kept (otherwise, and for what the tasks do not measure, Spark SQL judges the decoded rows:
engine/direct_checks.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.manifest.models import AcceptedValuesCheck, FreshnessCheck, NotNullCheck, UniqueCheck
from dpone_dagster.quality.gates import SAMPLE_SIZE, Measured, check_stage

KINDS = ("not_null", "accepted_values", "freshness", "unique")
POSITIONS_KEPT = 10_000  # offending positions a task keeps per measure, to take losers out
SAMPLES_KEPT = 2 * SAMPLE_SIZE  # sample rows a task keeps per check: losers may be among them
NEWEST_KEPT = 64  # freshness values a task keeps per check, newest first

Position = tuple[int, int]  # source partition, offset


class Unsettled(Exception):
    """The tallies cannot say the published rows' result exactly (the message says why)."""


@dataclass(frozen=True)
class RowCheck:
    """One check as the tasks measure it: `index` among the manifest's checks; `columns` the
    payload columns (none: freshness of the Kafka record timestamp); `accepted` the value set."""

    index: int
    kind: str
    stage: str
    columns: tuple[str, ...]
    accepted: pa.Array | None = None
    # The offending rows' positions are kept (published rows, where records may leave the batch).
    positions: bool = False


def row_checks(checks: Sequence[Any], schema: pa.Schema, message_key: Sequence[str] = (), iso_times: bool = True) -> tuple[RowCheck, ...]:
    """The manifest's row-level checks the tasks measure on `schema`; the others are left to Spark
    SQL on the decoded rows (great_expectations, a column not in the batch, a type whose comparison
    may differ, `unique` other than on the message key). `message_key`: the
    unique key's columns, each message's key made of them one to one; a batch the direct path
    publishes holds every key once, so `unique` on them passes on the rows as published (not for a
    floating-point column, whose 0.0 and -0.0 Spark groups as one value). With a unique key,
    records leave the batch after the scan (repeated keys, keys missing): the published checks
    keep their offending rows' positions to take them out. `iso_times`: whether the session reads
    date and time text as these checks do (ISO-8601 in UTC, spark/session.iso_times); otherwise a
    freshness check on a text or date column is Spark's."""
    out = (_row_check(index, check, schema, message_key, iso_times) for index, check in enumerate(checks) if check.type not in ("min_rows", "source_target_count"))
    return tuple(c for c in out if c is not None)


def _row_check(index: int, check: Any, schema: pa.Schema, message_key: Sequence[str], iso_times: bool) -> RowCheck | None:
    """How the tasks measure one check, or None when they cannot as Spark SQL would."""
    if isinstance(check, UniqueCheck):
        exact = all(_exact_key(schema.field(c).type) for c in message_key)
        if check_stage(check) != "published" or not message_key or set(check.columns) != set(message_key) or not exact:
            return None
        return RowCheck(index, check.type, "published", tuple(check.columns))
    if check.type not in KINDS:
        return None
    if isinstance(check, NotNullCheck):
        wanted = tuple(check.columns)
    elif isinstance(check, AcceptedValuesCheck):
        wanted = (check.column,)
    else:
        assert isinstance(check, FreshnessCheck)
        wanted = (check.column,) if check.column else ()
    if any(c not in schema.names for c in wanted):
        return None
    accepted = None
    if isinstance(check, AcceptedValuesCheck):
        accepted = _value_set(schema.field(check.column).type, check.values)
        if accepted is None:  # values of another type than the column's
            return None
    if isinstance(check, FreshnessCheck) and wanted and not _timelike(schema.field(wanted[0]).type):
        return None
    if isinstance(check, FreshnessCheck) and wanted and not iso_times and not pa.types.is_timestamp(schema.field(wanted[0]).type):
        return None  # text and dates are read in the session's zone and calendar: Spark measures them
    stage = check_stage(check)
    return RowCheck(index, check.type, stage, tuple(dict.fromkeys(wanted)), accepted, stage == "published" and bool(message_key))


def _exact_key(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_boolean(kind)


def _value_set(kind: pa.DataType, values: list[Any]) -> pa.Array | None:
    """The accepted values in the column's type, where they compare as Spark compares them."""
    accepted = [v for v in values if v is not None]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        ok = all(isinstance(v, str) for v in accepted)
    elif pa.types.is_integer(kind):
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in accepted)
    elif pa.types.is_floating(kind):  # an accepted NaN is left to Spark, for which every NaN is equal
        ok = all(isinstance(v, int | float) and not isinstance(v, bool) and v == v for v in accepted)
    elif pa.types.is_boolean(kind):
        ok = all(isinstance(v, bool) for v in accepted)
    else:
        ok = False
    if not ok:
        return None
    try:
        values = pa.array(accepted, kind)
    except (pa.ArrowInvalid, OverflowError):  # a literal the column's type cannot hold exactly
        return None
    return pc.add(values, 0.0) if pa.types.is_floating(kind) else values  # -0.0 is 0.0, as in Spark


def _timelike(kind: pa.DataType) -> bool:
    return pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_string(kind)


@dataclass
class Tally:
    """What one task measured (mergeable): per measure key the offending count and positions, per
    check the sample rows and the newest values."""

    counts: dict[tuple, int] = field(default_factory=dict)
    positions: dict[tuple, list[np.ndarray]] = field(default_factory=dict)  # (partition, offset) rows
    truncated: set[tuple] = field(default_factory=set)
    samples: dict[int, list[tuple[int, int, dict]]] = field(default_factory=dict)
    newest: dict[tuple, list[tuple[int, int, int]]] = field(default_factory=dict)  # (micros, p, o)
    # The largest value a task measured but did not keep could have (per freshness key).
    newest_floor: dict[tuple, int] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for key, arrays in other.positions.items():
            self.positions.setdefault(key, []).extend(arrays)
        self.truncated |= other.truncated
        for index, rows in other.samples.items():
            self.samples.setdefault(index, []).extend(rows)
        for key, values in other.newest.items():
            self.newest.setdefault(key, []).extend(values)
        for key, floor in other.newest_floor.items():
            self.newest_floor[key] = max(floor, self.newest_floor.get(key, floor))


def measure(
    checks: Sequence[RowCheck],
    tally: Tally,
    columns: Sequence[pa.Array],
    names: Sequence[str],
    is_delete: pa.Array,
    skipped: pa.Array | None,
    partition: int,
    offsets: pa.Array,
    stamps_ms: pa.Array,
) -> None:
    """Measure one decoded batch (every record, deletes included) into `tally`. `skipped` marks
    the deletes left out of the messages (deletes.when_disabled: skip), which only an `extracted`
    check's freshness counts."""
    content = pc.invert(is_delete)
    offsets_np = offsets.to_numpy(zero_copy_only=False)
    for check in checks:
        if check.kind == "unique":  # judged on the message keys (row_checks)
            continue
        if check.kind == "freshness":
            micros = _micros(columns[names.index(check.columns[0])]) if check.columns else pc.multiply(stamps_ms, 1000)
            counted = micros if check.stage == "extracted" or skipped is None else micros.filter(pc.invert(skipped))
            kept = offsets if check.stage == "extracted" or skipped is None else offsets.filter(pc.invert(skipped))
            _keep_newest(tally, (check.index,), counted, partition, kept.to_numpy(zero_copy_only=False))
            continue
        offending_any = None
        for name in check.columns:
            column = columns[names.index(name)]
            if check.kind == "not_null":
                bad = pc.and_(content, column.is_null())
                key = ("null", check.index, name)
            else:
                compared = pc.add(column, 0.0) if pa.types.is_floating(column.type) else column  # -0.0 is 0.0
                outside = pc.invert(pc.fill_null(pc.is_in(compared, value_set=check.accepted), False))
                bad = pc.and_(content, pc.and_(column.is_valid(), outside))
                key = ("outside", check.index)
            mask = bad.to_numpy(zero_copy_only=False)
            _keep_positions(tally, key, partition, offsets_np[mask], check.positions)
            offending_any = mask if offending_any is None else offending_any | mask
        if offending_any is not None and offending_any.any():
            _keep_samples(tally, check.index, columns, names, partition, offsets_np, offending_any)


# An ISO-8601 time with a zone: Z or an offset (+hh, +hhmm, +hh:mm) after the time of day.
_ZONED = r"\d\d:\d\d(:\d\d(\.\d*)?)?(Z|[+-]\d\d(:?\d\d)?)$"


def _micros(column: pa.Array) -> pa.Array:
    """Epoch microseconds of a timestamp, date or ISO-8601 string column, as the Spark SQL path
    casts it in the engine's UTC session; a string that does not parse raises Unsettled."""
    if pa.types.is_string(column.type):
        return _text_micros(column)
    if pa.types.is_date(column.type):
        column = pc.cast(column, pa.timestamp("us"))
    return pc.cast(pc.cast(column, pa.timestamp("us", column.type.tz)), pa.int64())


def _text_micros(column: pa.Array) -> pa.Array:
    """ISO-8601 texts with and without a zone, each read as Spark casts it: a zone's instant, or
    a wall time in UTC (the session's zone). Arrow reads a column of one kind in one cast; a
    column of both kinds is read a kind at a time."""
    for target in (pa.timestamp("us"), pa.timestamp("us", "UTC")):
        try:
            return pc.cast(pc.cast(column, target), pa.int64())
        except pa.ArrowInvalid:
            continue
    zoned = pc.fill_null(pc.match_substring_regex(column, _ZONED), False)
    try:
        with_zone = pc.cast(pc.cast(pc.if_else(zoned, column, None), pa.timestamp("us", "UTC")), pa.int64())
        wall = pc.cast(pc.cast(pc.if_else(zoned, None, column), pa.timestamp("us")), pa.int64())
    except pa.ArrowInvalid:
        raise Unsettled("a freshness value the task does not parse as the Spark SQL path would") from None
    return pc.if_else(zoned, with_zone, wall)


def _keep_positions(tally: Tally, key: tuple, partition: int, offsets: np.ndarray, kept_at_all: bool) -> None:
    tally.counts[key] = tally.counts.get(key, 0) + len(offsets)
    if not kept_at_all:
        return
    kept = sum(len(a) for a in tally.positions.get(key, ()))
    room = POSITIONS_KEPT - kept
    if len(offsets) > room:
        tally.truncated.add(key)
        offsets = offsets[: max(room, 0)]
    if len(offsets):
        tally.positions.setdefault(key, []).append(np.column_stack([np.full(len(offsets), partition, np.int64), offsets]))


def _keep_samples(tally: Tally, index: int, columns: Sequence[pa.Array], names: Sequence[str], partition: int, offsets: np.ndarray, mask: np.ndarray) -> None:
    """The first SAMPLES_KEPT offending rows in (partition, offset) order (payload columns only)."""
    where = np.flatnonzero(mask)[:SAMPLES_KEPT]
    rows = pa.Table.from_arrays(list(columns), names=list(names)).take(pa.array(where)).to_pylist()
    merged = tally.samples.get(index, []) + [(partition, int(offsets[i]), row) for i, row in zip(where, rows, strict=True)]
    tally.samples[index] = sorted(merged, key=lambda s: (s[0], s[1]))[:SAMPLES_KEPT]


def _keep_newest(tally: Tally, key: tuple, micros: pa.Array, partition: int, offsets: np.ndarray) -> None:
    present = np.flatnonzero(micros.is_valid().to_numpy(zero_copy_only=False))
    values = pc.fill_null(micros, 0).to_numpy(zero_copy_only=False)
    found = [(int(values[i]), partition, int(offsets[i])) for i in present[np.argsort(-values[present], kind="stable")[:NEWEST_KEPT]]]
    merged = heapq.nlargest(NEWEST_KEPT + 1, tally.newest.get(key, []) + found)
    if len(merged) > NEWEST_KEPT or len(present) > NEWEST_KEPT:  # what is not kept is at most the last kept
        merged = merged[:NEWEST_KEPT]
        tally.newest_floor[key] = max(merged[-1][0], tally.newest_floor.get(key, merged[-1][0]))
    tally.newest[key] = merged


def measured(
    checks: Sequence[RowCheck],
    tally: Tally,
    stage: str,
    losers: Mapping[int, np.ndarray],
    rows_at: Callable[[list[Position]], list[dict]] | None = None,
) -> Measured:
    """The values of `stage`'s checks (quality/gates.Measured): for the published rows without the
    records that left the batch after the scan (`losers`: sorted offsets per partition). Their
    sample rows are then read again where they are (`rows_at`): a task kept only its first few. A
    check the tallies cannot settle exactly is left out of `Measured.checks` (Spark SQL judges it
    on the decoded rows)."""
    out = Measured()
    for check in checks:
        if check.stage != stage:
            continue
        try:
            _settle(check, tally, losers if stage == "published" else {}, rows_at, out)
        except Unsettled:
            continue
        out.checks.add(check.index)
    return out


def _settle(
    check: RowCheck, tally: Tally, drop: Mapping[int, np.ndarray], rows_at: Callable[[list[Position]], list[dict]] | None, out: Measured
) -> None:
    if check.kind == "unique":
        out.counts[("groups", check.index)] = 0
        return
    if check.kind == "freshness":
        out.newest[check.index] = _newest(tally, (check.index,), drop)
        return
    keys = [("null", check.index, c) for c in check.columns] if check.kind == "not_null" else [("outside", check.index)]
    left: list[np.ndarray] = []
    counts = {}
    for key in keys:
        lost = 0
        if drop and tally.counts.get(key):
            if key in tally.truncated or not check.positions:
                raise Unsettled("more offending rows than a task keeps, in a batch some records leave after the scan")
            for positions in tally.positions.get(key, ()):
                losing = _is_loser(positions, drop)
                lost += int(losing.sum())
                left.append(positions[~losing])
        counts[key] = tally.counts.get(key, 0) - lost
    out.counts.update(counts)
    if not drop or not any(counts.values()):
        rows = sorted(tally.samples.get(check.index, []), key=lambda s: (s[0], s[1]))
        out.samples[check.index] = tuple(r for _, _, r in rows)[:SAMPLE_SIZE]
    elif rows_at is not None:
        first = np.unique(np.concatenate(left), axis=0)[:SAMPLE_SIZE]  # (partition, offset) order
        out.samples[check.index] = tuple(rows_at([(int(p), int(o)) for p, o in first]))


def _newest(tally: Tally, key: tuple, drop: Mapping[int, np.ndarray]) -> int | None:
    """The newest value left once `drop` is out; Unsettled when a value a task did not keep could
    be newer than what is left."""
    values = sorted(tally.newest.get(key, []), reverse=True)
    pick = next((v for v, p, o in values if not _lost(drop, p, o)), None)
    floor = tally.newest_floor.get(key)
    if floor is not None and (pick is None or pick < floor):
        raise Unsettled("the newest values a task keeps were all left out by de-duplication")
    return pick


def _is_loser(positions: np.ndarray, drop: Mapping[int, np.ndarray]) -> np.ndarray:
    out = np.zeros(len(positions), bool)
    for partition, offsets in drop.items():
        rows = positions[:, 0] == partition
        out[rows] = np.isin(positions[rows, 1], offsets)
    return out


def _lost(drop: Mapping[int, np.ndarray], partition: int, offset: int) -> bool:
    offsets = drop.get(partition)
    if offsets is None or not len(offsets):
        return False
    i = int(np.searchsorted(offsets, offset))
    return i < len(offsets) and int(offsets[i]) == offset
