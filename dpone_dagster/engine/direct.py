"""The direct path of a Kafka → Kafka JSON run (driver side; the tasks are in dpone_dagster/direct/):
Spark tasks read, decode, shape and produce their slices themselves, and no record crosses into
Spark's JVM.

The Spark SQL path (engine/stages/) keeps the decoded batch in Spark, counts and de-duplicates it
there, encodes the messages with `to_json` and hands them back to producer tasks: every record
crosses between the JVM and Python twice. When a run needs nothing only Spark SQL does, this path
does the same work in the Python tasks, in the same order of guarantees:

1. scan (direct/task.py): each task reads its slices, decodes them as the read tasks do, shapes
   the messages byte for byte as the Spark SQL path would (sinks/json_encode.py), keeps them in a
   file of its executor and reports counts and the hashes of its keys. Nothing is produced.
2. judge (here): bad records the tasks set aside (undecodable, without their unique key, over
   message.max.bytes) follow source.options.on_error where and as on the Spark SQL path
   (engine/direct_bad_records.py). Records with fields an inferred schema's sample missed widen
   the schema as the Spark SQL path widens it, and the batch is scanned again with it. Records
   Spark's decoder reads and the tasks' does not are decoded by Spark, and the batch is scanned
   again with their rows spliced in (direct/spark_rows.py). A record only the Spark SQL path
   handles (a value the encoder refuses, more such records than travel to the tasks) sends the
   whole run there, reading the batch again, as if this path had not run.
   Repeated keys are settled on the keys themselves (direct/keys.py, engine/direct_keys.py: on the
   driver, or past its limit by a Spark window over the candidates); keep_last / keep_first pick
   the same record as the Spark SQL path (source order: timestamp, partition, offset); where
   every record is published, the records of repeated keys are produced first, in that order.
   A time window's late records are counted in the scan and judged by its policy (fail stops
   the run here; dead_letter leaves them out of the scan's messages and holds them back for the
   dead-letter topic, sent at the commit before the state moves, as on the Spark SQL path).
3. gates: min_rows on the counts, and not_null, accepted_values, freshness and unique (on the
   unique key) on what the scan measured of the decoded rows (quality/arrow_checks.py); the
   other checks (Great Expectations, other `unique` checks, what a tally cannot settle) on the
   decoded rows as a Spark DataFrame, from the files the scan kept them in (engine/direct_checks.py);
   before anything is produced.
4. produce (engine/direct_load.py, direct/task.py; direct/ordered.py for repeated keys): the tasks produce their kept messages, the
   offsets stored as slices are delivered where that keeps the guarantees; the delivery reports go
   to the load and reconciliation stages as on the other path.
Every wait on the tasks is bounded (spark/jobs.py).

What takes this path is decided from the manifest (`refusal`) and then from the data (step 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from dpone_dagster import columns as C
from dpone_dagster.direct import task
from dpone_dagster.direct.keys import candidates
from dpone_dagster.direct.spark_rows import SparkRows
from dpone_dagster.engine import direct_checks, direct_registry, direct_shape
from dpone_dagster.engine.direct_attempt import Attempt, DecodedBySpark, ScanAgain, ToSparkSql, switched_off
from dpone_dagster.engine.direct_bad_records import BadRecords, batch_source
from dpone_dagster.engine.direct_keys import settle_repeated_keys
from dpone_dagster.engine.direct_load import (
    check_ordered_delivery,
    largest_group,
    produce_all,
    produce_ordered,
    storing_rule,
)
from dpone_dagster.engine.nothing_read import nothing_planned, nothing_to_publish
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.load import (
    JUDGED,
    Delivered,
    Judged,
    check_delivery,
    producer_settings,
    publish_dead_letters,
)
from dpone_dagster.engine.stages.shape import deletes_disabled
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.engine.time_windows import LateRecordScreen, judge_late_records
from dpone_dagster.errors import ConfigError
from dpone_dagster.formats import registry_source
from dpone_dagster.kafka.boundary import pack_tasks, split_into_tasks
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.kafka.delivery import aggregate
from dpone_dagster.manifest.models import KafkaSink, KafkaSource, Manifest
from dpone_dagster.quality import arrow_checks
from dpone_dagster.quality.arrow_checks import Tally
from dpone_dagster.schema.values import nullable_schema
from dpone_dagster.shape import message
from dpone_dagster.shape.envelope import envelope_parts
from dpone_dagster.shape.headers import HeaderSpec
from dpone_dagster.shape.keys import unique_key_positions
from dpone_dagster.sinks.json_encode import NumberKey
from dpone_dagster.sinks.kafka_messages import refuses_duplicates, uses_dedupe
from dpone_dagster.sinks.registry import NO_REGISTRY, PreparedSchema
from dpone_dagster.sources.kafka import registry_notes
from dpone_dagster.spark import arrow_json
from dpone_dagster.spark.jobs import MARGIN_S, BoundedJobs, deadline_s, waves
from dpone_dagster.spark.keep import release_batch
from dpone_dagster.spark.printed_numbers import printed_by_spark, unprinted_numbers
from dpone_dagster.spark.session import is_connect, iso_times
from dpone_dagster.spark.slots import local_task_slots, produce_slots

# What a read task may wait on the broker beyond its records (the reader's empty polls, a
# consumer's connection set-up): the scan's part of a job bound (spark/jobs.py).
READ_WAIT_S = 60.0
# Scans of one batch: a plan is widened (JSON), or narrowed or fetched by id (registry), once (a
# source is one or the other); records only Spark's decoder reads are decoded by it once (JSON);
# numbers only Spark prints alike are printed by it, once for most batches. A batch that needs
# more (numbers found first in widened fields, and again in the records Spark decoded) goes to
# the Spark SQL path.
MAX_SCANS = 4
# kafka_offsets is an append whose state is the source offsets (as every Kafka source run's).
STRATEGIES = ("incremental_append", "kafka_offsets", "incremental_merge", "full_refresh", "replace")


def refusal(manifest: Manifest, planned: PlannedRead) -> str | None:
    """Why a run of `manifest` over `planned` takes the Spark SQL path, or None (pure)."""
    source, sink = manifest.source, manifest.sink
    off = switched_off()
    if off is not None:
        return off
    if not isinstance(source, KafkaSource) or batch_source(planned) is None:
        return "the source is not a Kafka topic"
    if not isinstance(sink, KafkaSink) or sink.type != "kafka":
        return "the sink is not Kafka"
    format_reason = direct_registry.refusal(manifest)
    if format_reason is not None:
        return format_reason
    if planned.boundary.method not in ("offsets", "max_records", "time_window"):
        return f"read_mode {planned.boundary.method}"
    if sink.strategy.mode not in STRATEGIES:
        return f"strategy {sink.strategy.mode}"
    return None


def copy(
    manifest: Manifest,
    spark: SparkSession,
    planned: PlannedRead,
    result: RunResult,
    sink_config: dict,
    log: Log,
    registry_config: dict | None = None,
    publish: bool = True,
) -> Delivered | Judged | None:
    """Run the batch on the direct path, with the stages of the Spark SQL path (extract, gates,
    shape, load); None when it must take the Spark SQL path (nothing was produced then; what this
    path measured and judged is taken back, the reason is noted). `registry_config`: the sink's
    Schema Registry, for an Avro, JSON Schema or protobuf sink. `publish` False (a checks-only
    run): the batch is judged, and nothing is registered or produced (JUDGED).

    A scan that changes the source's plan (a JSON schema widened by fields its sample missed, a
    registry subject's versions narrowed to those the batch carries) scans the batch again with
    it: at most MAX_SCANS scans, each plan changes once. So does a batch with numbers only Spark
    prints as Spark writes them (json_encode.SparkNumbers): printed by Spark on the driver."""
    printed: dict[NumberKey, str] = {}  # those numbers' texts, kept from one scan to the next
    decoded: SparkRows | None = None  # records only Spark's decoder reads, as it decoded them
    held: list[BadRecords] = []  # a scan's bad records, read again: released once the scan is done
    for scan in range(1, MAX_SCANS + 1):
        attempt = Attempt.begin(result)
        try:
            return _copy(manifest, spark, planned, result, sink_config, log, registry_config, scan, printed, decoded, publish, held)
        except ScanAgain as exc:
            if scan == MAX_SCANS:
                attempt.take_back(result, ToSparkSql(f"the plan changed again after {scan} scans ({exc})"), log)
                return None
            if isinstance(exc, DecodedBySpark):  # rows of an earlier plan's schema are decoded again
                decoded = exc.rows.joined(decoded if decoded is not None and decoded.payload_schema == exc.rows.payload_schema else None)
                too_many = decoded.too_many()
                if too_many is not None:
                    attempt.take_back(result, ToSparkSql(too_many), log)
                    return None
            log(f"direct path: {exc}; scanning the batch again")
        finally:
            while held:
                held.pop().release()
    raise AssertionError("unreachable")


def _copy(
    manifest: Manifest,
    spark: SparkSession,
    planned: PlannedRead,
    result: RunResult,
    sink_config: dict,
    log: Log,
    registry_config: dict | None,
    scan: int,
    printed: dict[NumberKey, str],
    decoded: SparkRows | None,
    publish: bool,
    held: list[BadRecords],
) -> Delivered | Judged | None:
    """One scan of `copy`; ScanAgain (what it recorded taken back) when the source's plan changed
    or the scan met numbers only Spark prints alike (added to `printed`). The scan's bad records
    are added to `held`, for `copy` to release."""
    reason = refusal(manifest, planned)
    settings = prepared = None
    source = batch_source(planned)
    if reason is None and not planned.boundary.total:
        assert source is not None  # refusal() checked it
        return nothing_planned(manifest, planned, result, source.notes_of_nothing_read(planned.boundary), log)
    if reason is None:  # a Kafka batch with offsets to read: its tasks
        boundary = planned.boundary
        tasks = split_into_tasks(boundary, manifest.source.options.records_per_task)
        slices = [(t.topic, t.partition, t.start, t.end) for t in tasks]
        groups = [[slices[i] for i in group] for group in pack_tasks(tasks, local_task_slots(spark))]
        jobs = BoundedJobs(spark, result.run_id)
        slots = produce_slots(spark)
        largest = largest_group(groups)
        read_bound = deadline_s(largest, READ_WAIT_S, waves(len(groups), slots))

        def batch_ids() -> set[int]:
            log(f"extract: reading the schema ids of {boundary.total} offsets in {len(groups)} Spark task(s), to fetch them by id")
            assert source is not None  # refusal() checked it
            reader = source.reader_settings()
            return set().union(*jobs.in_tasks(groups, lambda g: task.schema_ids_of(reader, g), read_bound, "reading the batch's schema ids"))

        settings, prepared, reason = _settings(manifest, planned, sink_config, result.run_id, registry_config, batch_ids, iso_times(spark), log)
    if reason is not None:
        if scan > 1:  # the plan changed by the first scan is one the direct path does not run
            result.notes.append(f"direct path: the batch went to the Spark SQL path: {reason}")
        log(f"direct path: not taken ({reason})")
        return None
    assert settings is not None
    if decoded is not None and decoded.payload_schema != settings.schema:  # the plan was widened since
        decoded = None
    settings = replace(settings, scan=scan, spark_numbers=dict(printed), spark_rows=decoded)
    attempt = Attempt.begin(result)
    try:
        with stage(result, "extract", log):
            log(f"extract: {len(tasks)} slice(s) in {len(groups)} Spark task(s) over {boundary.total} offsets (direct path)")
            reports, found = _scan(spark, jobs, settings, groups, read_bound)
            stops = [r.refused for r in reports if r.refused]
            if stops and not all(stop.startswith((task.UNPLANNED, task.UNPRINTED)) for stop in stops):
                raise ToSparkSql(stops[0])
            unprinted = unprinted_numbers(reports)
            if unprinted:
                _print_numbers(spark, jobs, unprinted, printed, scan)
            if any(stop.startswith(task.UNPLANNED) for stop in stops):
                _fetch_by_id(planned, settings, reports, scan, "outside the subject's versions")
            if stops or unprinted:
                raise ScanAgain(f"{len(unprinted)} number(s) Java 17 may print otherwise than the shortest digits: printed by Spark")
            source_notes = _decoded_as_planned(planned, settings, reports, scan)
            if isinstance(planned.source, LateRecordScreen):  # the policy fails the run here, before producing
                late = {w["start"]: sum(r.late.get(i, 0) for r in reports) for i, w in enumerate(boundary.windows)}
                total = judge_late_records(planned.source.policy, late, result, log)
                if total and settings.hold_back_late:  # left out by the scan; sent before the state moves
                    planned.source.hold_back(spark, boundary, total, {w: n for w, n in late.items() if n}, log)
            result.notes.extend(source_notes)  # where the Spark SQL path's extract puts them (an attempt taken back drops them)
            bad = BadRecords(manifest, spark, planned, reports, sink_config, jobs, read_bound)
            held.append(bad)
            bad.judge_undecodable(result, settings.schema)
        rows = result.rows_extracted = sum(r.rows for r in reports)
        tally = Tally()
        for report in reports:
            if report.checks is not None:
                tally.add(report.checks)
        undecodable = bad.positions("undecodable")

        def decoded_rows(left_out: dict[int, np.ndarray], skip_deletes: bool, expected: int) -> Callable[[], DataFrame]:
            return lambda: direct_checks.kafka_rows(spark, jobs, settings, groups, read_bound, left_out, skip_deletes, expected)

        rows_extracted = decoded_rows(undecodable, False, rows - bad.count("undecodable"))
        _gates(manifest, planned, settings, tally, {}, result, rows, "quality_pre", "extracted", log, rows_extracted)
        if rows - result.rows_dead_lettered - result.rows_skipped == 0:  # as on the Spark SQL path: no shape, nothing registered
            _remove_spills(spark, jobs, settings, groups)
            nothing_to_publish(manifest, planned, result, log)
            if publish:
                publish_dead_letters(bad.letters, result, log)
            return JUDGED
        with stage(result, "shape", log):
            deletes = sum(r.deletes for r in reports)
            if deletes and settings.deletes == "fail":
                raise deletes_disabled(deletes)
            bad.judge_keyless(result)
            if settings.deletes == "skip":
                result.deletes_skipped = deletes
            set_aside = bad.positions()
            skip, removed, ordered = settle_repeated_keys(manifest, spark, jobs, settings, groups, found, read_bound, set_aside, bad.oversized_candidates())
            bad.settled(skip)
            unpublished = _merged(skip, bad.positions("keyless"))  # not among the rows as published
            published = rows - removed - result.deletes_skipped - bad.left_out
            rows_published = decoded_rows(_merged(unpublished, undecodable), settings.deletes == "skip", published)
            _gates(manifest, planned, settings, tally, unpublished, result, published, "quality_published", "published", log, rows_published)
            bad.judge_oversized(result, settings.max_message_bytes)
            removed += result.deletes_skipped + bad.left_out  # left out of the messages either way
        if settings.keep_rows:  # every check has been judged: the rows kept for them are done
            _remove_spills(spark, jobs, settings, groups, task.remove_rows)
    except ToSparkSql as exc:
        _remove_spills(spark, jobs, settings, groups)
        attempt.take_back(result, exc, log)
        return None
    except ScanAgain:
        _remove_spills(spark, jobs, settings, groups)
        attempt.undo(result, "direct_scan_again")
        raise
    except BaseException:
        _remove_spills(spark, jobs, settings, groups)
        raise
    result.duplicates_removed = removed - result.deletes_skipped - bad.left_out
    result.execution_path = "direct"
    if not publish:  # checks only: every gate has been judged
        _remove_spills(spark, jobs, settings, groups)
        direct_registry.note_unregistered(manifest, prepared, registry_config, result, settings.schema.names)
        return JUDGED
    producer = producer_settings(manifest, sink_config)
    checkpoint = storing_rule(manifest, planned.checkpoint, result.duplicates_removed, sum(len(o) for o in ordered.values()), result)
    try:
        if prepared is not None:  # every gate passed: the schema may be registered now
            value_prefix, key_prefix = direct_registry.register(manifest, prepared, registry_config, result, settings.schema.names)
            settings = replace(settings, value_prefix=value_prefix, key_prefix=key_prefix)
        else:
            result.schema_evolution = dict(NO_REGISTRY)
        publish_dead_letters(bad.letters, result, log)  # the output leaves, letters first
        with stage(result, "load", log):
            rows_of_stats = []
            if ordered:  # the slices read again may give other messages: checked against the count
                rows_of_stats = produce_ordered(jobs, slots, settings, producer, groups, ordered, set_aside, log)
                check_ordered_delivery(manifest, rows_of_stats, sum(len(o) for o in ordered.values()), result)
            not_in_slices = _merged(_without(skip, set_aside), ordered)  # left out, or produced first
            left_out = _merged(not_in_slices, set_aside)
            expected = {piece: n - _within(not_in_slices, piece) for report in reports for piece, n in report.kept}
            if aggregate(rows_of_stats).ok:  # a failed delivery fails the run below, before anything more is sent
                rows_of_stats += produce_all(jobs, slots, settings, producer, groups, left_out, expected, boundary, checkpoint, log, result)
        stats = aggregate(rows_of_stats)
        check_delivery(manifest, stats, result)
    except BaseException:  # the slices never produced keep their spill files until removed here
        _remove_spills(spark, jobs, settings, groups)
        raise
    return Delivered(stats, rows - removed)


def _print_numbers(spark: SparkSession, jobs: BoundedJobs, unprinted: set[NumberKey], printed: dict[NumberKey, str], scan: int) -> None:
    """Add Spark's texts of `unprinted` to `printed`, for the next scan; on the last scan the batch
    goes to the Spark SQL path instead (a scan again would send it there)."""
    if scan == MAX_SCANS:
        raise ToSparkSql(f"{len(unprinted)} number(s) Java 17 may print otherwise than the shortest digits, found after {scan} scans")
    printed.update(printed_by_spark(spark, jobs, unprinted, MARGIN_S))


def _fetch_by_id(planned: PlannedRead, settings: task.DirectSettings, reports: list[task.ScanReport], scan: int, why: str) -> None:
    """ScanAgain with the batch's schema ids fetched by id, as the Spark SQL path fetches them,
    when the scans found ids the plan lacks (an id registered under another subject). On the last
    scan the batch goes to the Spark SQL path without fetching: a scan again would send it there.
    """
    registry = settings.registry_source
    assert registry is not None
    seen = set().union(*(r.schema_ids for r in reports))
    if scan == MAX_SCANS:
        raise ToSparkSql(f"schema id(s) {sorted(seen - set(registry.schemas) - registry.missing)} {why}, found after {scan} scans")
    source = batch_source(planned)
    assert source is not None
    plan = source.registry_plan_by_id(registry, seen)
    source.use_registry_plan(planned.boundary, plan)
    fetched = sorted(set(plan.schemas) - set(registry.schemas))
    raise ScanAgain(f"schema id(s) {fetched or 'none'} {why}: fetched by id, {sorted(plan.missing)} unknown to the registry")


def _decoded_as_planned(planned: PlannedRead, settings: task.DirectSettings, reports: list[task.ScanReport], scan: int) -> list[str]:
    """The source's notes, as the Spark SQL path gives them. A registry source was decoded with
    every version of its subject; the Spark SQL path merges only the versions the batch carries,
    so a batch whose versions merge into another payload schema is scanned again with those
    versions only (ScanAgain)."""
    source = batch_source(planned)
    assert source is not None
    registry = settings.registry_source
    if registry is None:
        return list(source.json_plan(planned.boundary).notes)
    seen = set().union(*(r.schema_ids for r in reports))
    if seen - set(registry.schemas) - registry.missing:  # ids only held-back late records carry
        _fetch_by_id(planned, settings, reports, scan, "of late records, outside the subject's versions")
    narrowed = source.narrowed_registry_plan(registry, seen)
    # Both paths decode with every field nullable; only names, types and their order matter.
    if nullable_schema(narrowed.schema) != nullable_schema(registry.schema):
        source.use_registry_plan(planned.boundary, narrowed)
        raise ScanAgain(f"the batch's schema versions {sorted(seen)} merge into another payload schema than the subject's: decoded with those only")
    return registry_notes(registry.fmt, set(narrowed.schemas), set(narrowed.missing))


def _remove_spills(
    spark: SparkSession, jobs: BoundedJobs, settings: task.DirectSettings, groups: list[list[task.Slice]], remove: Callable[[task.DirectSettings, list[task.Slice]], None] = task.remove_spills
) -> None:
    """Best effort: the files are in Spark's local directories (a later run's scan sweeps what a
    killed run left, spill.sweep_stale_spills). `remove`: task.remove_rows removes only the
    decoded rows kept for the checks."""
    try:
        jobs.in_tasks(groups, lambda g: remove(settings, g), MARGIN_S, "removing the run's spill files")
    except Exception:  # noqa: BLE001 - the run's own outcome matters, not this clean-up
        pass


def _settings(
    manifest: Manifest,
    planned: PlannedRead,
    sink_config: dict,
    run_id: str,
    registry_config: dict | None,
    batch_ids: Callable[[], set[int]],
    times: bool,
    log: Log,
) -> tuple[task.DirectSettings | None, PreparedSchema | None, str | None]:
    """The tasks' settings from the batch's JSON plan (and the sink's prepared Avro schema), or why
    the direct path cannot decode or encode it. `batch_ids`: the schema ids the batch carries
    (read in Spark tasks), for a registry source its subject does not plan. `times`: whether the
    session reads and writes date and time text as the tasks do (spark/session.iso_times)."""
    source = batch_source(planned)
    assert source is not None  # refusal() checked it
    registry = None
    if source.options.message_format == "json":
        plan = source.json_plan(planned.boundary)
        if plan.envelope not in ("flat", "dpone"):
            return None, None, f"source envelope {plan.envelope}"
        payload, source_envelope = plan.schema, plan.envelope
    else:
        try:
            registry = source.registry_plan(planned.boundary)
        except Exception as exc:  # noqa: BLE001 - a subject version that does not read (not a record, say): the batch may not carry it
            log(f"extract: the subject's versions could not all be read ({exc}); planning from the batch's schema ids")
            registry = None
        if registry is None:  # planned from the batch's own ids, as the Spark SQL path plans every batch
            registry = source.registry_plan_of_ids(batch_ids())
            source.use_registry_plan(planned.boundary, registry)
        payload, source_envelope = registry.schema, "flat"
    schema = arrow_json.arrow_schema(payload, times) if registry is None else registry_source.arrow_schema(payload)
    if schema is None or not len(schema):
        return None, None, "a payload type the task decoder does not read"
    sink = manifest.sink
    names = list(schema.names)
    reserved = sorted(n for n in names if n.startswith("__dpone__"))
    if reserved:
        return None, None, f"payload fields named like the engine's own columns {reserved}"
    try:
        key_columns = unique_key_positions(sink, names)
    except ConfigError as exc:  # the Spark SQL path decides (a batch without rows to publish succeeds there)
        return None, None, str(exc)
    # Published once per key only where repeated keys are settled (de-duplicated or refused); where
    # every record is published, `unique` on the key is left to Spark SQL, which counts repeats.
    once_per_key = key_columns is not None and (uses_dedupe(sink) or refuses_duplicates(sink))
    message_key = tuple(names[i] for i in key_columns) if once_per_key and key_columns is not None else ()
    options = sink.options
    reason = message.unwritable_type(schema, key_columns, options.message_format == "json", options.key.mode == "hash_row", times)
    if reason is not None:
        return None, None, reason
    row_checks = arrow_checks.row_checks(manifest.quality.checks, schema, message_key, times)
    prepared, reason = direct_registry.prepare(manifest, payload, registry_config)
    if reason is not None:
        return None, None, reason
    key, reason = direct_registry.prepare_key(manifest, prepared)
    if reason is not None:
        return None, None, reason
    limit = int(producer_config(sink_config, sink.options.delivery).get("message.max.bytes", 1_000_000))
    return (
        task.DirectSettings(
            reader=source.reader_settings(),
            schema=schema,
            key_columns=key_columns,
            # Keyed by the unique key, or (no unique_key columns) deletes by the source record's key.
            hashed=key_columns is not None or (options.key.mode == "unique_key" and options.deletes.enabled),
            max_message_bytes=limit,
            run_id=run_id,
            windows=tuple(
                (index, r["partition"], r["start"], r["end"], window["start_ms"])
                for index, window in enumerate(planned.boundary.windows)
                for r in window["partitions"]
            ),
            value_format=(prepared.fmt, prepared.schema_str, prepared.message_indexes, prepared.references) if prepared is not None else None,
            frame_bytes=len(direct_registry.value_frame(prepared, 0)) if prepared is not None else 0,
            key_format=direct_registry.key_format(key),
            key_frame_bytes=direct_registry.key_frame_bytes(key),
            routes=direct_registry.routes_of(prepared),
            envelope=(
                envelope_parts(C.UPSERT, sink.strategy.mode, run_id, {"topic": source.topic})
                if sink.options.envelope == "dpone"
                else None
            ),
            hash_row=sink.options.key.mode == "hash_row",
            headers=HeaderSpec.of(sink.options.headers.static, sink.options.headers.lineage, sink.options.headers.replicate_source, source.topic),
            source_envelope=source_envelope,
            envelope_auto=source.options.envelope == "auto",
            registry_source=registry,
            deletes=direct_shape.delete_mode(sink),
            source_key_for_deletes=sink.options.key.mode == "unique_key",
            delete_envelope=envelope_parts(C.DELETE, sink.strategy.mode, run_id, {"topic": source.topic}),
            row_checks=row_checks,
            hold_back_late=isinstance(planned.source, LateRecordScreen) and planned.source.policy == "dead_letter",
            screen_undecodable=True,
            keep_rows=direct_checks.keeps_rows(manifest.quality.checks, row_checks),
        ),
        prepared,
        None,
    )


def _scan(
    spark: SparkSession, jobs: BoundedJobs, settings: task.DirectSettings, groups: list[list[task.Slice]], seconds: float
) -> tuple[list[task.ScanReport], np.ndarray]:
    """Scan every group; returns the reports and the candidate key hashes (direct/keys.py).

    A classic session sends each task's hashes through a shuffle by bucket, so no process holds
    more than a bucket of them (the driver receives only candidates: flat memory in the batch
    size). Spark Connect has no RDDs: its client adds the hashes up itself (8 bytes a record)."""
    if is_connect(spark):
        reports = jobs.in_tasks(groups, lambda g: task.scan(settings, g), seconds, "the scan of the batch")
        return reports, candidates(r.hashes for r in reports if r.hashes is not None)
    buckets = max(1, len(groups))
    report_key = -1

    def scanned(index: int) -> Iterator[tuple[int, Any]]:
        report = task.scan(settings, groups[index])
        yield report_key, replace(report, hashes=None)
        if report.hashes is not None and report.refused is None:
            yield from enumerate(report.hashes.split(buckets))

    def bucket(items: Iterator[tuple[int, Any]]) -> Iterator[tuple[str, Any]]:
        parts = []
        for key, value in items:
            if key == report_key:
                yield "report", value
            else:
                parts.append(value)
        yield "candidates", candidates(parts)

    indexes = spark.sparkContext.parallelize(range(len(groups)), buckets)
    shuffled = indexes.flatMap(scanned).partitionBy(buckets, lambda key: max(key, 0)).mapPartitions(bucket)
    out = jobs.run(shuffled.collect, seconds, "the scan of the batch")
    reports = [value for kind, value in out if kind == "report"]
    found = [value for kind, value in out if kind == "candidates"]
    return reports, np.unique(np.concatenate(found)) if found else np.zeros(0, np.uint64)


def _within(offsets: dict[int, np.ndarray], piece: task.Slice) -> int:
    """How many of `offsets` (per partition) fall in the slice."""
    _, partition, start, end = piece
    found = offsets.get(partition)
    return 0 if found is None else int(np.count_nonzero((found >= start) & (found < end)))


def _without(offsets: dict[int, np.ndarray], removed: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Sorted offsets per partition of `offsets` not in `removed`."""
    return {p: np.setdiff1d(found, removed.get(p, np.zeros(0, np.int64))) for p, found in offsets.items()}


def _merged(first: dict[int, np.ndarray], second: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Sorted offsets per partition of both."""
    return {p: np.union1d(first.get(p, np.zeros(0, np.int64)), second.get(p, np.zeros(0, np.int64))) for p in first.keys() | second.keys()}


def _gates(
    manifest: Manifest,
    planned: PlannedRead,
    settings: task.DirectSettings,
    tally: Tally,
    losers: dict[int, np.ndarray],
    result: RunResult,
    rows: int,
    name: str,
    frame_stage: str,
    log: Log,
    decoded_rows: Callable[[], DataFrame],
) -> None:
    """The checks of one frame on what the tasks measured, before anything is produced (the stage
    is there with or without checks, as on the Spark SQL path); `losers` are left out of the rows
    as published. A check the tasks did not measure is judged on the `decoded_rows` frame
    (engine/direct_checks.py), read only then."""
    with stage(result, name, log):
        topic = planned.boundary.topic

        def rows_at(positions: list[tuple[int, int]]) -> list[dict]:
            return [row for partition, offset in positions for row in task.rows_at(settings, topic, partition, offset)]

        measured = arrow_checks.measured(settings.row_checks, tally, frame_stage, losers, rows_at)
        frame = decoded_rows() if rows and direct_checks.left_to_spark(manifest.quality.checks, frame_stage, measured) else None
        try:
            pre_publish_gates(manifest, frame, planned.incremental, result, rows, frame_stage, measured)
        finally:
            if frame is not None:
                release_batch(frame)
