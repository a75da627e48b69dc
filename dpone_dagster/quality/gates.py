"""Quality gates: the manifest's `quality.checks` evaluated around publishing.

Pre-publish (`run_pre_publish`) runs on the staged Spark DataFrame before anything is produced:
min_rows, not_null, unique, accepted_values, freshness and great_expectations. Everything is
aggregated by Spark (one pass for the null / accepted-values / freshness counts, one grouped job per
unique check, GE's own metric jobs); the driver only ever receives aggregates and, for a failing
check, at most 5 offending rows (payload columns only, in source partition/offset order).

Post-publish (`run_post_publish`) runs source_target_count once delivery reports are in.

Decisions:
- Severity is the manifest's quality.mode for every check; `failed_gates` returns the results that
  block publishing / the state advance (failed, severity fail, not skipped). Skipped results are
  always passed=True.
- Empty batches. min_rows is the only check that judges an empty batch: on an incremental run with no
  new data (`incremental_empty=True` and rows == 0) it is reported skipped ("no new data") because
  "nothing new arrived" is the normal steady state of an incremental pipeline, not a short batch;
  on a full (non-incremental) run an empty batch is evaluated, so min_rows with threshold > 0 fails.
  An incremental batch with *some* rows is judged like any other batch. Every row-level check
  (not_null, unique, accepted_values, freshness, great_expectations) is reported skipped on an empty
  batch: there is nothing to evaluate (and the inferred schema of an empty batch may lack the columns).
- Delete rows (`__dpone__op == 'delete'`) carry no payload (a flat tombstone has none at all), so
  not_null, unique, accepted_values and great_expectations evaluate upsert rows only. Freshness uses
  every record: a delete is new data too.
- not_null: observed = nulls summed over the check's columns (per-column counts in the description).
  unique: observed = number of key groups occurring more than once; rows with a null in any of the
  columns are excluded. accepted_values: observed = non-null rows whose value is outside the list
  (nulls are never counted; use not_null for them).
- Order and frames. The engine evaluates min_rows and every `stage: extracted` check on the decoded
  batch (before the delete policy, bad records and de-duplication; such checks' default names end in
  `_extracted`), then every other row-level check on the rows as they will be published (after
  keep_last/keep_first, skipped deletes and removed bad records), then publishes. So `unique` on the
  unique key passes when duplicate_policy keep_last/keep_first makes the published rows unique.
- freshness: observed = seconds between `now` and the newest non-null value of `column` (default the
  Kafka record timestamp `__dpone__source_timestamp`); passes when <= max_age_seconds. A column with
  no non-null value fails (freshness cannot be shown). timestamp_ntz / string / date columns are cast
  to timestamp in the session time zone (the engine's session runs in UTC); numeric columns are refused.
- A check naming a column that is not in a non-empty batch is a ConfigError (not a failed check).
- source_target_count: observed = |expected_messages - delivered| / expected_messages * 100, where
  expected_messages is what the sink was supposed to receive (after dedupe / skipped deletes, as the
  engine computes it) and delivered the acknowledged messages (0 vs 0 is 0%; n vs 0 expected is 100%).
  With `exclusive_target: true` (the target topic is written by this pipeline alone) the records the
  run's offset range of the target actually holds (read from the target, read_committed where the sink
  is transactional) are compared with expected_messages too, and the larger difference is observed.
  It also requires the sink partitions' offset advance, read from the target (end offsets after minus
  before the run, `quality.target`), to be >= delivered. Not ==: with at-least-once and idempotent
  producers, retries (and other producers writing to the same topic) can occupy extra offsets, but fewer
  offsets than acknowledged messages means messages did not reach the target. With
  `sink_partition_advance=None` that second rule is not evaluated (and the description says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import (
    AcceptedValuesCheck,
    Check,
    FreshnessCheck,
    GreatExpectationsCheck,
    MinRowsCheck,
    NotNullCheck,
    SourceTargetCountCheck,
    UniqueCheck,
)
from dpone_dagster.quality.results import CheckResult, check_names, failed_gates, severity_for

__all__ = [
    "PRE_PUBLISH_TYPES",
    "POST_PUBLISH_TYPES",
    "SAMPLE_SIZE",
    "Measured",
    "failed_gates",
    "run_post_publish",
    "run_pre_publish",
]

SAMPLE_SIZE = 5
PRE_PUBLISH_TYPES = ("min_rows", "not_null", "unique", "accepted_values", "freshness", "great_expectations")
POST_PUBLISH_TYPES = ("source_target_count",)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CHECK = TypeAdapter(Check)


def check_stage(check: Any) -> str:
    """The frame a pre-publish check judges: min_rows counts the extracted batch; row-level checks
    say it in `stage` (default: the rows as published)."""
    return "extracted" if isinstance(check, MinRowsCheck) else getattr(check, "stage", "published")


def _col(name: str) -> Column:
    """A column by its exact name (dots and spaces are not struct paths here)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _models(checks: Sequence[Any]) -> list[Any]:
    """Manifest check models (plain dicts are validated into them)."""
    return [_CHECK.validate_python(c) if isinstance(c, Mapping) else c for c in checks]


# --------------------------------------------------------------------------- pre-publish


def run_pre_publish(
    df: DataFrame | None,
    checks: Sequence[Any],
    mode: str,
    rows: int,
    incremental_empty: bool,
    now: datetime,
    stage: str | None = None,
    measured: Measured | None = None,
) -> list[CheckResult]:
    """Evaluate every pre-publish check of `checks` on the staged batch `df` (see the module notes).

    `rows` is the batch's row count (the engine already has it); `now` the reference time of freshness
    (naive means UTC). Results are in manifest order; source_target_count is left to run_post_publish.
    `stage` selects the checks of one frame: "extracted" (min_rows and `stage: extracted` checks, on
    the decoded batch) or "published" (the other row-level checks, on the rows to publish); None
    evaluates every pre-publish check on `df`. `measured`: the values of the checks it holds as the
    direct path's tasks measured them (quality/arrow_checks.py); the others are evaluated on `df`.
    """
    severity = severity_for(mode)
    checks = _models(checks)
    names = check_names(checks)
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    selected = [
        (index, name, c)
        for index, (name, c) in enumerate(zip(names, checks, strict=True))
        if c.type in PRE_PUBLISH_TYPES and (stage is None or check_stage(c) == stage)
    ]
    on_frame = [(index, name, c) for index, name, c in selected if measured is None or index not in measured.checks]
    batch = _Batch(df, severity) if df is not None else None
    if rows > 0 and batch is not None and on_frame:
        _require_columns(batch.df, [(name, c) for _, name, c in on_frame])
        batch.aggregate([(index, c) for index, _, c in on_frame])
    results = []
    for index, name, check in selected:
        verdict = _Verdict(name, check, severity)
        ctx: Measured | _Batch | None = measured if measured is not None and index in measured.checks else batch
        if isinstance(check, MinRowsCheck):
            results.append(_min_rows(verdict, rows, incremental_empty))
        elif rows == 0:
            results.append(verdict(True, None, _threshold(check), "empty batch: nothing to check", skipped=True))
        elif ctx is None:
            raise ValueError(f"quality check {name} ({check.type}) needs the batch as a DataFrame")
        elif isinstance(check, NotNullCheck):
            results.append(_not_null(ctx, index, verdict))
        elif isinstance(check, AcceptedValuesCheck):
            results.append(_accepted_values(ctx, index, verdict))
        elif isinstance(check, FreshnessCheck):
            results.append(_freshness(ctx, index, verdict, now))
        elif isinstance(check, UniqueCheck):
            results.append(_unique(ctx, index, verdict))
        elif not isinstance(ctx, _Batch):
            raise ValueError(f"quality check {name} ({check.type}) runs on Spark SQL only")
        elif isinstance(check, GreatExpectationsCheck):
            from dpone_dagster.quality.expectations import run_expectation

            results.append(
                run_expectation(
                    ctx.content, check.expectation_type, check.kwargs, name=name, severity=severity
                )
            )
    return [
        replace(r, description=f"before de-duplication: {r.description}")
        if check_stage(c) == "extracted" and not isinstance(c, MinRowsCheck)
        else r
        for r, (_, _, c) in zip(results, selected, strict=True)
    ]


@dataclass
class Measured:
    """The row-level checks' values measured elsewhere (the direct path's tasks,
    quality/arrow_checks.py), by check index: null counts per ("null", index, column), values
    outside the accepted ones per ("outside", index), the newest freshness value in epoch
    microseconds, and up to SAMPLE_SIZE offending rows."""

    counts: dict[tuple, int] = field(default_factory=dict)
    newest: dict[int, int | None] = field(default_factory=dict)
    samples: dict[int, tuple[dict, ...]] = field(default_factory=dict)
    checks: set[int] = field(default_factory=set)  # the indexes of the checks measured

    def nulls(self, index: int, check: NotNullCheck, column: str) -> int:
        return self.counts[("null", index, column)]

    def outside(self, index: int, check: AcceptedValuesCheck) -> int:
        return self.counts[("outside", index)]

    def newest_micros(self, index: int, check: FreshnessCheck) -> int | None:
        return self.newest[index]

    def offending(self, index: int, check: Any) -> tuple[dict, ...]:
        return self.samples.get(index, ())

    def repeated(self, index: int, check: UniqueCheck) -> tuple[int, tuple[dict, ...]]:
        return self.counts[("groups", index)], self.samples.get(index, ())


@dataclass(frozen=True)
class _Verdict:
    """The result of one check, with its name, type and severity."""

    name: str
    check: Any
    severity: str

    def __call__(
        self,
        passed: bool,
        observed: Any,
        threshold: Any,
        description: str,
        sample: tuple[dict, ...] = (),
        skipped: bool = False,
    ) -> CheckResult:
        return CheckResult(
            name=self.name,
            check_type=self.check.type,
            phase="pre_publish",
            passed=passed,
            severity=self.severity,  # type: ignore[arg-type]
            observed=observed,
            threshold=threshold,
            description=description,
            failing_sample=() if passed else sample,
            skipped=skipped,
        )


class _Batch:
    """The staged DataFrame plus the single aggregation pass shared by the column checks."""

    def __init__(self, df: DataFrame, severity: str) -> None:
        self.df = df
        self.severity = severity
        # Sample rows hold the payload only: no engine column (a sink key the shape stage added).
        self.payload = [c for c in C.payload_columns(df.columns) if not c.startswith("__dpone__") or c.startswith("__dpone__nc__")]
        # Upsert rows: deletes carry no payload to judge (see module notes).
        self.content = df.where(~F.col(C.OP).eqNullSafe(F.lit(C.DELETE))) if C.OP in df.columns else df
        self._is_content: Column = (
            ~F.col(C.OP).eqNullSafe(F.lit(C.DELETE)) if C.OP in df.columns else F.lit(True)
        )
        self._order = [c for c in (C.SOURCE_PARTITION, C.SOURCE_OFFSET) if c in df.columns]
        self.values: dict[str, Any] = {}
        self._keys: dict[tuple, str] = {}

    # Aggregate keys are positional (a0, a1, ...) so that odd column names never matter.
    def _key(self, *parts: Any) -> str:
        return self._keys.setdefault(parts, f"a{len(self._keys)}")

    def aggregate(self, checks: Iterable[tuple[int, Any]]) -> None:
        exprs: list[Column] = []
        for _, check in checks:
            if isinstance(check, NotNullCheck):
                for column in check.columns:
                    exprs.append(
                        F.count(F.when(self._is_content & _col(column).isNull(), 1)).alias(
                            self._key("null", column)
                        )
                    )
            elif isinstance(check, AcceptedValuesCheck):
                exprs.append(
                    F.count(F.when(self._is_content & self._outside(check), 1)).alias(
                        self._key("outside", check.column, repr(check.values))
                    )
                )
            elif isinstance(check, FreshnessCheck):
                column = check.column or C.SOURCE_TIMESTAMP
                exprs.append(F.max(_epoch_micros(self.df, column)).alias(self._key("newest", column)))
        if exprs:
            row = self.df.agg(*exprs).first()
            self.values = {key: row[key] for key in self._keys.values()}

    def _value(self, *parts: Any) -> Any:
        return self.values[self._keys[parts]]

    def nulls(self, index: int, check: NotNullCheck, column: str) -> int:
        return int(self._value("null", column))

    def outside(self, index: int, check: AcceptedValuesCheck) -> int:
        return int(self._value("outside", check.column, repr(check.values)))

    def newest_micros(self, index: int, check: FreshnessCheck) -> int | None:
        return self._value("newest", check.column or C.SOURCE_TIMESTAMP)

    def offending(self, index: int, check: Any) -> tuple[dict, ...]:
        if isinstance(check, NotNullCheck):
            condition = F.lit(False)
            for column in check.columns:
                condition = condition | _col(column).isNull()
        else:
            condition = self._outside(check)
        return self.sample(self.content, condition)

    def repeated(self, index: int, check: UniqueCheck) -> tuple[int, tuple[dict, ...]]:
        """Values of the check's columns that occur more than once, and a few of their rows."""
        columns = list(check.columns)
        keyed = self.content
        for column in columns:
            keyed = keyed.where(_col(column).isNotNull())
        duplicate_keys = (
            keyed.groupBy(*[_col(c) for c in columns]).count().where(F.col("count") > 1).drop("count")
        )
        groups = duplicate_keys.count()
        if not groups:
            return 0, ()
        return groups, self.sample(keyed.join(duplicate_keys.limit(SAMPLE_SIZE), on=columns, how="left_semi"))

    @staticmethod
    def _outside(check: AcceptedValuesCheck) -> Column:
        column = _col(check.column)
        accepted = [v for v in check.values if v is not None]
        return column.isNotNull() & ~column.isin(*accepted) if accepted else column.isNotNull()

    def sample(self, frame: DataFrame, condition: Column | None = None) -> tuple[dict, ...]:
        """At most SAMPLE_SIZE rows (payload columns only) of `frame` matching `condition`."""
        if condition is not None:
            frame = frame.where(condition)
        if self._order:
            frame = frame.orderBy(*self._order)
        rows = frame.limit(SAMPLE_SIZE).select(*[_col(c) for c in self.payload]).collect()
        return tuple(row.asDict(recursive=True) for row in rows)


def _threshold(check: Any) -> Any:
    if isinstance(check, MinRowsCheck):
        return check.threshold
    if isinstance(check, FreshnessCheck):
        return check.max_age_seconds
    if isinstance(check, GreatExpectationsCheck):
        return None
    return 0


def _require_columns(df: DataFrame, selected: list[tuple[str, Any]]) -> None:
    present = set(df.columns)
    for name, check in selected:
        if isinstance(check, NotNullCheck | UniqueCheck):
            wanted = list(check.columns)
        elif isinstance(check, AcceptedValuesCheck):
            wanted = [check.column]
        elif isinstance(check, FreshnessCheck):
            wanted = [check.column or C.SOURCE_TIMESTAMP]
        else:
            continue
        missing = [c for c in wanted if c not in present]
        if missing:
            raise ConfigError(
                f"quality check {name} ({check.type}): column(s) {', '.join(missing)} not in the batch; "
                f"payload columns: {', '.join(C.payload_columns(df.columns)) or '(none)'}"
            )


def _min_rows(verdict: _Verdict, rows: int, incremental_empty: bool) -> CheckResult:
    threshold = verdict.check.threshold
    if incremental_empty and rows == 0:
        return verdict(True, 0, threshold, "no new data", skipped=True)
    return verdict(rows >= threshold, rows, threshold, f"{rows} row(s) in the batch; at least {threshold} required")


def _not_null(ctx: Measured | _Batch, index: int, verdict: _Verdict) -> CheckResult:
    check = verdict.check
    counts = {column: ctx.nulls(index, check, column) for column in check.columns}
    nulls = sum(counts.values())
    per_column = ", ".join(f"{column}: {count}" for column, count in counts.items())
    sample = ctx.offending(index, check) if nulls else ()
    return verdict(nulls == 0, nulls, 0, f"null values ({per_column}); none allowed", sample)


def _unique(ctx: Measured | _Batch, index: int, verdict: _Verdict) -> CheckResult:
    columns = list(verdict.check.columns)
    groups, sample = ctx.repeated(index, verdict.check)
    return verdict(
        groups == 0,
        groups,
        0,
        f"{groups} value(s) of ({', '.join(columns)}) occur more than once (rows with nulls excluded)",
        sample,
    )


def _accepted_values(ctx: Measured | _Batch, index: int, verdict: _Verdict) -> CheckResult:
    check = verdict.check
    outside = ctx.outside(index, check)
    sample = ctx.offending(index, check) if outside else ()
    return verdict(
        outside == 0,
        outside,
        0,
        f"{outside} row(s) with {check.column} outside {check.values!r} (nulls not counted)",
        sample,
    )


def _freshness(ctx: Measured | _Batch, index: int, verdict: _Verdict, now: datetime) -> CheckResult:
    check = verdict.check
    column = check.column or C.SOURCE_TIMESTAMP
    newest_micros = ctx.newest_micros(index, check)
    if newest_micros is None:
        return verdict(
            False,
            None,
            check.max_age_seconds,
            f"{column} has no non-null value in the batch, so its freshness cannot be shown",
        )
    newest = _EPOCH + timedelta(microseconds=int(newest_micros))
    age = round((now - newest).total_seconds(), 3)
    return verdict(
        age <= check.max_age_seconds,
        age,
        check.max_age_seconds,
        f"newest {column} is {newest.isoformat()}, {age}s before {now.isoformat()}; "
        f"at most {check.max_age_seconds}s allowed",
    )


def _epoch_micros(df: DataFrame, column: str) -> Column:
    data_type = df.schema[column].dataType
    col = _col(column)
    if isinstance(data_type, T.TimestampType):
        return F.unix_micros(col)
    if isinstance(data_type, T.TimestampNTZType | T.DateType | T.StringType):
        return F.unix_micros(col.cast("timestamp"))
    raise ConfigError(
        f"freshness: column {column} has type {data_type.simpleString()}; use a timestamp, date or "
        "ISO-8601 string column (or omit column to use the Kafka record timestamp)"
    )


# --------------------------------------------------------------------------- post-publish


def run_post_publish(
    checks: Sequence[Any],
    mode: str,
    extracted: int,
    expected_messages: int,
    delivered: int,
    sink_partition_advance: Mapping[Any, int] | None = None,
    target_records: int | None = None,
) -> list[CheckResult]:
    """Evaluate every source_target_count check once delivery reports are in (see the module notes).

    `sink_partition_advance` is the target's end offsets after minus before the run, read from the
    target; `target_records` what the run's range of the target holds (exclusive_target checks)."""
    severity = severity_for(mode)
    checks = _models(checks)
    results = []
    for name, check in zip(check_names(checks), checks, strict=True):
        if not isinstance(check, SourceTargetCountCheck):
            continue
        held = target_records if check.exclusive_target else None
        diff = max(abs(expected_messages - delivered), abs(expected_messages - held) if held is not None else 0)
        pct = 0.0 if diff == 0 else 100.0 if expected_messages == 0 else diff / expected_messages * 100
        count_ok = pct <= check.tolerance_pct + 1e-9
        if check.exclusive_target and held is None:
            raise ConfigError(f"quality check {name}: exclusive_target needs the count of the target's records")
        held_text = f"; the target's range of this run holds {held} record(s)" if held is not None else ""
        if sink_partition_advance is None:
            advance_ok = True
            advance_text = "sink offset advance not measured"
        else:
            advance = sum(int(v) for v in sink_partition_advance.values())
            advance_ok = advance >= delivered
            advance_text = (
                f"sink offsets advanced by {advance} across {len(sink_partition_advance)} partition(s), "
                f"{'>=' if advance_ok else 'FEWER THAN'} the {delivered} acknowledged"
            )
        results.append(
            CheckResult(
                name=name,
                check_type=check.type,
                phase="post_publish",
                passed=count_ok and advance_ok,
                severity=severity,
                observed=round(pct, 4),
                threshold=check.tolerance_pct,
                description=(
                    f"{extracted} row(s) extracted; {expected_messages} message(s) expected on the sink, "
                    f"{delivered} acknowledged{held_text}: {round(pct, 4)}% difference (tolerance "
                    f"{check.tolerance_pct}%); {advance_text}"
                ),
            )
        )
    return results
