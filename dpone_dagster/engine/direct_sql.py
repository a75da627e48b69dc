"""The direct path of a SQL source (driver side; the tasks are in direct/sql_task.py): the rows Spark
reads go to Python tasks that write and keep their messages, the driver judges the whole batch,
then tasks produce the kept messages. The rows cross from the JVM to Python once and never come
back, where the Spark SQL path keeps them in the JVM, writes them with Spark's expressions and
hands the messages to Python producers.

In the order of guarantees of every route (engine/run.py):
1. scan: one task per partition of the read writes each row's message by the one rule
   (shape/message.py), keeps it (engine/sql_kept.py: in a file of its host, or in Spark's storage
   on a cluster), and reports counts and key hashes.
2. judge: deletes with deletes disabled fail the run, and so do rows without their unique key and
   deletes without a key for their tombstone (a SQL source has no bad-record policy); min_rows and
   source_target_count gate the counts, the row-level checks (Great Expectations included) the
   read, kept before the scan. keep_last / keep_first settle keys that repeat on the kept
   messages' source order, duplicate_policy: fail refuses them, and where every row is published
   (an append, duplicate_policy: allow) their rows are listed in source order per key (past the
   driver's bounds, Spark settles them with the Spark SQL path's rules); messages
   over message.max.bytes among those published refuse the batch. What the Spark SQL path decides
   with its own rules — values the rule does not write — sends the batch there (read again;
   nothing was produced).
3. produce: every gate passed, the registry schema (if any) is registered; one task produces the
   rows of repeated keys listed, in their order, then the tasks produce the rest of the kept
   messages; the delivery reports go to the commit, which moves the watermark.
Every wait on the tasks is bounded (spark/jobs.py).

The rows come from a JDBC read or from a bcp / pyodbc export, which the source takes once per run
(a batch handed to the Spark SQL path is judged there from the same export).
Nothing can read the rows again as judged, so the messages are produced from where they were kept,
never from a second read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster import columns as C
from dpone_dagster.direct import sql_task
from dpone_dagster.direct.keys import candidates, in_source_order, left_out_by_policy, repeated_keys
from dpone_dagster.direct.sql_in_spark import FILE, ROW
from dpone_dagster.engine import bad_records, direct_checks, direct_registry, direct_shape
from dpone_dagster.engine.direct_attempt import Attempt, ToSparkSql, switched_off
from dpone_dagster.engine.direct_keys import SAMPLE, refuse_repeats
from dpone_dagster.engine.direct_load import check_ordered_delivery
from dpone_dagster.engine.nothing_read import nothing_planned, nothing_read
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.sql_kept import (
    KEPT_CLEANUP_S,
    KeptMessages,
    Listed,
    kept_messages,
    produce_frame,
    published_read,
)
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.load import JUDGED, Delivered, Judged, check_delivery, producer_settings
from dpone_dagster.engine.stages.shape import deletes_disabled
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.errors import ConfigError
from dpone_dagster.formats.registry_source import arrow_schema
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.kafka.delivery import aggregate
from dpone_dagster.manifest.models import KafkaSink, Manifest, SqlSource
from dpone_dagster.quality.gates import check_stage
from dpone_dagster.shape import message
from dpone_dagster.shape.envelope import envelope_parts
from dpone_dagster.shape.headers import HeaderSpec
from dpone_dagster.shape.keys import unique_key_positions
from dpone_dagster.sinks.kafka import ProducerSettings
from dpone_dagster.sinks.kafka_messages import (
    KEY,
    dedupe,
    duplicate_keys,
    duplicated_keys,
    duplicates_refused,
    ordered_by_key,
    refuses_duplicates,
    uses_dedupe,
)
from dpone_dagster.sinks.registry import NO_REGISTRY, PreparedSchema
from dpone_dagster.spark.jobs import MARGIN_S, BoundedJobs, deadline_s, waves
from dpone_dagster.spark.keep import release_batch
from dpone_dagster.spark.printed_numbers import printed_by_spark, unprinted_numbers
from dpone_dagster.spark.session import is_connect, iso_times, speculates
from dpone_dagster.spark.slots import one_host, partition_count, produce_slots

STRATEGIES = ("incremental_append", "incremental_merge", "full_refresh", "replace", "cdc")
# What a scan task may wait on the database beyond its rows (a connection, the query's start).
READ_WAIT_S = 600.0
# Rows with a unique key whose hashes (8 bytes each) the driver collects to find repeated keys;
# past these bounds Spark settles the keys that repeat on the kept messages (_settle_in_spark).
MAX_HASHED_ROWS = 20_000_000
# Keyed rows whose hashes one scan task reports (64 MiB): a report is one row of a result, and a
# Spark Connect client takes at most 128 MiB in one message.
MAX_TASK_HASHES = 8_000_000
# Messages over message.max.bytes whose row numbers (8 bytes each) come to the driver, to tell
# those keep_last / keep_first leave out; past them the batch goes to the Spark SQL path.
MAX_OVERSIZED_LISTED = 1_000_000
# Keys that may repeat whose rows (key, file, row, order) the driver ranks.
MAX_CANDIDATES = 1_000_000
# Rows of keys that may repeat that come to the driver (and, all published, that one task
# produces in source order per key); over Spark Connect each task's share travels as one message,
# which the client takes up to 128 MiB.
MAX_LISTED = 4_000_000
MAX_LISTED_CONNECT = 1_000_000


def refusal(manifest: Manifest, planned: PlannedRead, spark: SparkSession) -> str | None:
    """Why a run of a SQL source takes the Spark SQL path, from the manifest and the session (pure
    but for the session's master), or None."""
    source, sink = manifest.source, manifest.sink
    off = switched_off()
    if off is not None:
        return off
    if not isinstance(source, SqlSource):
        return "the source is not SQL"
    if not isinstance(sink, KafkaSink) or sink.type != "kafka":
        return "the sink is not Kafka"
    if not one_host(spark) and speculates(spark):
        return "spark.speculation on a cluster: two attempts of a scan task could keep two different reads of the table"
    format_reason = direct_registry.refusal(manifest)
    if format_reason is not None:
        return format_reason
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
    """Run the batch of a SQL source on the direct path; None when it must take the Spark SQL path
    (nothing was produced then; what this path counted is taken back, the reason is noted).
    `publish` False (a checks-only run): the batch is judged, and nothing is registered or
    produced (JUDGED)."""
    reason = refusal(manifest, planned, spark)
    if reason is not None:
        log(f"direct path: not taken ({reason})")
        return None
    extracted = planned.source.extract(spark, planned.boundary, log)
    if getattr(planned.boundary, "empty", False) and planned.boundary.method != "full":  # nothing between its bounds
        return nothing_planned(manifest, planned, result, extracted.notes, log)
    frame = extracted.df
    settings, prepared, reason = _settings(manifest, frame.schema, sink_config, result.run_id, registry_config, iso_times(spark))
    if reason is not None:
        log(f"direct path: not taken ({reason})")
        return None
    assert settings is not None
    total = getattr(planned.boundary, "total", None)
    if settings.hashed and total is not None and total > MAX_HASHED_ROWS:  # keys that repeat are settled by Spark
        settings = replace(settings, hashed=False)
    jobs = BoundedJobs(spark, result.run_id)
    store = kept_messages(jobs, spark)
    attempt = Attempt.begin(result)
    kept = None
    try:
        with stage(result, "extract", log):
            settings, seconds = _scan_bounds(jobs, store, settings, frame, total, extracted.tasks, log)
            if direct_checks.row_level(manifest.quality.checks):  # they judge the rows the scan writes: the read is kept for both
                frame = kept = store.keep_read(frame, seconds)
            scanned = frame.select(*settings.names, C.OP, *([C.ORDER] if settings.keeps_order else []))
            reports = store.scan(settings, scanned, seconds)
            _judge(reports)
            unprinted = unprinted_numbers(reports)
            if unprinted:  # printed by Spark, and the batch scanned again with their texts
                log(f"extract: {len(unprinted)} number(s) Java 17 may print otherwise than the shortest digits: printed by Spark; scanning the batch again")
                store.remove(settings, log)
                settings = replace(settings, spark_numbers=printed_by_spark(spark, jobs, unprinted, MARGIN_S))
                reports = store.scan(settings, scanned, seconds)
                _judge(reports)
                unprinted = unprinted_numbers(reports)
                if unprinted:  # the table changed between the scans
                    raise ToSparkSql(f"{len(unprinted)} number(s) Java 17 may print otherwise than the shortest digits, found by a second scan")
            rows = result.rows_extracted = sum(r.rows for r in reports)
            result.notes.extend(extracted.notes)
        if not rows:  # a read not counted when planning (CDC) that found nothing
            store.remove(settings, log)
            return nothing_read(manifest, planned, result, log)
        _gates(manifest, planned, result, rows, "quality_pre", "extracted", log, frame)
        with stage(result, "shape", log):
            deletes = sum(r.deletes for r in reports)
            if deletes and settings.rule.deletes == "fail":
                raise deletes_disabled(deletes)
            _refuse_keyless(reports)
            settled = _settle_repeated_keys(store, settings, manifest, reports, log)
            removed = settled.removed
            if settings.rule.deletes == "skip":
                result.deletes_skipped = deletes
            expected = sum(r.messages for r in reports) - removed
            published = frame  # every row the scan read is published, unless a row is left out below
            leaves_out = settled.removed or sql_task.leaves_out_deletes(settings.rule)
            if kept is not None and leaves_out and direct_checks.row_level([c for c in manifest.quality.checks if check_stage(c) == "published"]):
                dropped = settled.left_out if settled.removed and settled.frame is None else None  # else: the rows listed, produced first
                published = published_read(settings, kept, dropped, settled.frame if settled.removed else None)
            _gates(manifest, planned, result, expected, "quality_published", "published", log, published)
            _refuse_oversized(store, reports, settled, settings.max_message_bytes)
    except ToSparkSql as exc:
        store.remove(settings, log)
        attempt.take_back(result, exc, log)
        return None
    except BaseException:
        store.remove(settings, log)
        raise
    finally:
        if kept is not None:
            release_batch(kept)
    result.execution_path = "direct"
    result.duplicates_removed = removed
    if not publish:  # checks only: every gate has been judged
        store.remove(settings, log)
        direct_registry.note_unregistered(manifest, prepared, registry_config, result, list(settings.names))
        return JUDGED
    if prepared is None:
        result.schema_evolution = dict(NO_REGISTRY)
    try:
        if prepared is not None:  # every gate passed: the schema may be registered now
            value_prefix, key_prefix = direct_registry.register(manifest, prepared, registry_config, result, list(settings.names))
            settings = replace(settings, value_prefix=value_prefix, key_prefix=key_prefix)
        with stage(result, "load", log):
            stats = aggregate(_produce(store, settings, manifest, sink_config, reports, settled, result, log))
        check_delivery(manifest, stats, result)
    finally:
        store.remove(settings, log)
    return Delivered(stats, expected)


def _settings(
    manifest: Manifest, schema: StructType, sink_config: dict, run_id: str, registry_config: dict | None, times: bool
) -> tuple[sql_task.SqlSettings | None, PreparedSchema | None, str | None]:
    """The tasks' settings for the rows of `schema` (the extracted frame's), or why the rule does
    not write them. `times`: whether the session writes date and time text as the tasks do
    (spark/session.iso_times)."""
    sink, options = manifest.sink, manifest.sink.options
    names = C.payload_columns(schema.names)
    payload = StructType([schema[n] for n in names])
    arrow = arrow_schema(payload)
    if arrow is None or not names:
        return None, None, "a payload type without an Arrow form"
    try:
        key_columns = unique_key_positions(sink, names)
    except ConfigError as exc:  # the Spark SQL path decides (a batch without rows to publish succeeds there)
        return None, None, str(exc)
    json_value = options.message_format == "json"
    reason = message.unwritable_type(arrow, key_columns, json_value, options.key.mode == "hash_row", times)
    if reason is not None:
        return None, None, reason
    prepared, reason = direct_registry.prepare(manifest, payload, registry_config)
    if reason is not None:
        return None, None, reason
    key, reason = direct_registry.prepare_key(manifest, prepared)
    if reason is not None:
        return None, None, reason
    envelope = json_value and options.envelope == "dpone"
    strategy = sink.strategy.mode
    rule = message.MessageRule(
        key_columns=key_columns,
        hash_row=options.key.mode == "hash_row",
        value_format=(prepared.fmt, prepared.schema_str, prepared.message_indexes, prepared.references) if prepared is not None else None,
        envelope=envelope_parts(C.UPSERT, strategy, run_id, {}) if envelope else None,
        deletes=direct_shape.delete_mode(sink),
        delete_envelope=envelope_parts(C.DELETE, strategy, run_id, {}) if envelope else None,
        source_key_for_deletes=options.key.mode == "unique_key",
        key_format=direct_registry.key_format(key),
        routes=direct_registry.routes_of(prepared),
    )
    static = options.headers.static
    headers = HeaderSpec.of(static, False, False, "") if static else None
    return (
        sql_task.SqlSettings(
            run_id=run_id,
            pipeline=re.sub(r"[^A-Za-z0-9_.-]", "_", manifest.name),
            names=tuple(names),
            rule=rule,
            hashed=key_columns is not None,
            keep=_keeps_one(manifest) if key_columns is not None else None,
            ordered=key_columns is not None and _keeps_one(manifest) is None and not refuses_duplicates(sink),
            max_message_bytes=int(producer_config(sink_config, options.delivery).get("message.max.bytes", 1_000_000)),
            header_bytes=sum(len(k.encode()) + len(v.encode()) for k, v in static.items()),
            value_frame_bytes=len(direct_registry.value_frame(prepared, 0)) if prepared is not None else 0,
            key_frame_bytes=direct_registry.key_frame_bytes(key) if prepared is not None else 0,
            headers=headers,
        ),
        prepared,
        None,
    )


def scan_bound(planned_rows: int | None, tasks: int) -> int:
    """Rows one scan task may read before it refuses the batch (pure): twice the rows counted
    when planning (partitions can be skewed; a full read has no upper bound, and a table that
    doubled since is read by the Spark SQL path), or, where nothing was counted (a CDC read), its
    share of MAX_HASHED_ROWS, so that the key hashes the driver gathers stay bounded."""
    return 2 * planned_rows if planned_rows is not None else MAX_HASHED_ROWS // max(1, tasks)


def _scan_bounds(
    jobs: BoundedJobs,
    store: KeptMessages,
    settings: sql_task.SqlSettings,
    frame: DataFrame,
    planned_rows: int | None,
    read_tasks: int | None,
    log: Log,
) -> tuple[sql_task.SqlSettings, float]:
    """The rows each scan task may read (`scan_bound`, in the settings: a task that reads more
    stops and refuses the batch) and the time the scan may take to read them, at the floor rate
    of spark/jobs.py. The task count is the session's, or on Spark Connect the reader's
    (`read_tasks`)."""
    tasks = partition_count(frame) or read_tasks
    if tasks is None and planned_rows is None:
        raise ToSparkSql("a read not counted when planning (CDC), on Spark Connect, whose client cannot see its task count to bound each task's rows")
    log(f"extract: {tasks if tasks is not None else 'the'} Spark task(s) write the rows' messages, kept {store.where} (direct path)")
    settings = replace(settings, max_rows=scan_bound(planned_rows, tasks or 1), max_hashes=MAX_TASK_HASHES, max_oversized_listed=MAX_OVERSIZED_LISTED)
    return settings, deadline_s(settings.max_rows, READ_WAIT_S, waves(tasks or 1, produce_slots(jobs.spark)))


def _judge(reports: list[sql_task.SqlReport]) -> None:
    """What only the Spark SQL path decides sends the batch there."""
    refused = next((r.refused for r in reports if r.refused), None)
    if refused is not None:
        raise ToSparkSql(refused)


def _refuse_keyless(reports: list[sql_task.SqlReport]) -> None:
    """Deletes without a key to make their tombstone of fail the run, and so do rows without their
    unique key (a SQL source has no bad-record policy), as on the Spark SQL path."""
    keyless_deletes = sum(r.keyless_deletes for r in reports)
    if keyless_deletes:
        raise bad_records.keyless_deletes(keyless_deletes)
    keyless = sum(r.keyless for r in reports)
    if keyless:
        raise bad_records.sql_rows_refused(keyless, bad_records.KEYLESS, bad_records.KEYLESS_FIX)


def _refuse_oversized(store: KeptMessages, reports: list[sql_task.SqlReport], settled: Settled, limit: int) -> None:
    """Messages over message.max.bytes refuse the batch, as on the Spark SQL path, which measures
    the messages de-duplication keeps: those keep_last / keep_first leave out are not counted."""
    oversized = sum(r.oversized for r in reports)
    if oversized and settled.removed:
        if oversized > MAX_OVERSIZED_LISTED:
            raise ToSparkSql(f"more than {MAX_OVERSIZED_LISTED:,} messages over message.max.bytes among rows keep_last / keep_first may leave out")
        oversized = _published_oversized(store, reports, settled)
    if oversized:
        raise bad_records.sql_rows_refused(oversized, bad_records.oversized(limit), bad_records.OVERSIZED_FIX)


def _published_oversized(store: KeptMessages, reports: list[sql_task.SqlReport], settled: Settled) -> int:
    """How many of the messages over message.max.bytes are published: not left out by the driver's
    settlement, or among the messages Spark settled (counted there, a join on their few rows)."""
    if settled.frame is None:
        empty = np.zeros(0, np.int64)
        return sum(int(np.count_nonzero(~np.isin(r.oversized_rows, settled.left_out.get(r.partition, empty)))) for r in reports)
    rows = [(r.partition, row) for r in reports for row in r.oversized_rows]
    oversized = store.jobs.spark.createDataFrame(rows, f"{FILE} int, {ROW} long")
    kept = settled.frame.select(FILE, ROW).join(oversized, [FILE, ROW], "left_semi")
    seconds = deadline_s(sum(r.messages for r in reports), KEPT_CLEANUP_S)
    return int(store.jobs.run(kept.count, seconds, "the count of oversized messages published"))


def _keeps_one(manifest: Manifest) -> str | None:
    """keep_last / keep_first when the strategy keeps one row per key, else None."""
    return manifest.sink.strategy.duplicate_policy if uses_dedupe(manifest.sink) else None


NOTHING_LISTED: Listed = (np.zeros(0, np.int64), np.zeros(0, np.int64))


@dataclass(frozen=True)
class Settled:
    """Keys that repeat, settled: the kept rows the main produce leaves out (row numbers per
    partition), how many of them keep_last / keep_first drops, the rows produced first in source
    order (where every row is published); or, past what the driver settles, the messages to
    produce as Spark settled them (`frame`)."""

    left_out: dict[int, np.ndarray] = field(default_factory=dict)
    removed: int = 0
    listed: Listed = NOTHING_LISTED
    frame: DataFrame | None = None


def _settle_repeated_keys(store: KeptMessages, settings: sql_task.SqlSettings, manifest: Manifest, reports: list[sql_task.SqlReport], log: Log) -> Settled:
    """Keys that repeat, settled on the keys themselves from the candidate hashes on the driver,
    or by Spark past its bounds (rows hashed, candidate keys, rows listed). Keys that repeat
    under duplicate_policy: fail refuse the batch as the Spark SQL path does."""
    keyed = settings.rule.key_columns is not None
    if keyed and not settings.hashed:
        return _settle_in_spark(store, settings, manifest, reports, f"more than {MAX_HASHED_ROWS:,} keyed rows", log)
    if any(r.unhashed for r in reports):
        return _settle_in_spark(store, settings, manifest, reports, f"more than {MAX_TASK_HASHES:,} keyed rows in one task", log)
    hashed = [r.hashes for r in reports if r.hashes is not None]
    found = candidates(hashed) if hashed else np.zeros(0, np.uint64)
    if not len(found):
        return Settled()
    if len(found) > MAX_CANDIDATES:
        return _settle_in_spark(store, settings, manifest, reports, f"more than {MAX_CANDIDATES:,} keys that may repeat", log)
    bound = MAX_LISTED_CONNECT if is_connect(store.jobs.spark) else MAX_LISTED
    if sum(h.rows_of(found) for h in hashed) > bound:
        return _settle_in_spark(store, settings, manifest, reports, f"more than {bound:,} rows of keys that may repeat", log)
    files = sum(1 for r in reports if r.messages)
    seconds = deadline_s(max(r.messages for r in reports), KEPT_CLEANUP_S, waves(files, produce_slots(store.jobs.spark)))
    tables = store.candidate_records(reports, found, seconds)
    if not tables:
        return Settled()
    records = pa.concat_tables(tables)
    if refuses_duplicates(manifest.sink):
        repeated = repeated_keys(records)
        refuse_repeats(len(repeated), repeated.to_pylist())
        return Settled()
    order = records.column(sql_task.ORDER).combine_chunks()
    names = [f"o{i}" for i in range(order.type.num_fields)]
    flat = pa.table([records.column("key"), *order.flatten(), records.column("file"), records.column("row")], names=["key", *names, "file", "row"])
    # Rows whose source order ties are ranked by file and row (the Spark SQL path's window picks
    # any one of them, its sort leaves them in any order).
    if settings.keep is not None:
        dropped = left_out_by_policy(flat, [*names, "file", "row"], settings.keep)
        return Settled(_per_file(dropped), dropped.num_rows)
    listed = in_source_order(flat.filter(pc.is_in(flat.column("key"), value_set=repeated_keys(flat))), [*names, "file", "row"])
    files_of, rows = listed.column("file").to_numpy().astype(np.int64), listed.column("row").to_numpy()
    return Settled(_per_file(listed), 0, (files_of, rows))


def _settle_in_spark(store: KeptMessages, settings: sql_task.SqlSettings, manifest: Manifest, reports: list[sql_task.SqlReport], why: str, log: Log) -> Settled:
    """Keys that repeat settled by Spark on the kept messages, with the Spark SQL path's rules
    (sinks/kafka_messages.py): duplicate_policy: fail counts them, keep_last / keep_first keep one
    message per key by source order, and where every row is published each key's messages go to
    one producing task in source order. The messages cross into the JVM for the shuffle; the
    driver holds none of them."""
    log(f"shape: {why}: Spark settles the keys that repeat (direct path)")
    renamed = {"key": KEY, **({sql_task.ORDER: C.ORDER} if settings.keeps_order else {})}
    messages = store.messages(settings, reports).withColumnsRenamed(renamed)
    seconds = deadline_s(sum(r.messages for r in reports), KEPT_CLEANUP_S)
    if refuses_duplicates(manifest.sink):
        count, sample = store.jobs.run(lambda: duplicate_keys(messages, SAMPLE), seconds, "the count of repeated keys")
        if count:
            raise duplicates_refused(count, sample)
        return Settled()
    counts = duplicated_keys(messages).agg(F.sum("count").alias("rows"), F.count("*").alias("keys"))
    repeats = store.jobs.run(counts.collect, seconds, "the count of repeated keys")[0]
    rows, keys = int(repeats["rows"] or 0), int(repeats["keys"] or 0)
    if not keys:
        return Settled()  # no key repeats: every kept message is produced as it is, without a shuffle
    # Ties in source order are ranked by partition and row, as the driver ranks them: the
    # settled frame is computed again by each use (checks, size count, produce), and every
    # computation must keep the same rows.
    tie_break = (FILE, ROW)
    settled = dedupe(messages, settings.keep, tie_break) if settings.keep is not None else ordered_by_key(messages, tie_break)
    removed = rows - keys if settings.keep is not None else 0
    return Settled(removed=removed, frame=settled.withColumnsRenamed({v: k for k, v in renamed.items()}))


def _per_file(records: pa.Table) -> dict[int, np.ndarray]:
    """The row numbers of `records` per partition's kept messages, sorted."""
    files_of, rows = records.column("file").to_numpy(), records.column("row").to_numpy()
    return {int(i): np.sort(rows[files_of == i]) for i in np.unique(files_of)}


def _gates(manifest: Manifest, planned: PlannedRead, result: RunResult, rows: int, name: str, frame_stage: str, log: Log, frame: DataFrame) -> None:
    """The checks of one frame, on the rows the scan wrote (kept when a check reads them)."""
    with stage(result, name, log):
        pre_publish_gates(manifest, frame, planned.incremental, result, rows, frame_stage)


def _produce(
    store: KeptMessages,
    settings: sql_task.SqlSettings,
    manifest: Manifest,
    sink_config: dict,
    reports: list[sql_task.SqlReport],
    settled: Settled,
    result: RunResult,
    log: Log,
) -> list[dict]:
    """Produce the kept messages but those left out: first the rows listed, from one task in
    their order, then every partition's from its own task; or the messages as Spark settled them.
    The delivery statistics rows."""
    producer = producer_settings(manifest, sink_config)
    messages = sum(r.messages for r in reports) - settled.removed
    if settled.frame is not None:
        seconds = deadline_s(sum(r.messages for r in reports), producer.flush_timeout_s)  # a task may read and send every kept message
        log(f"load: {messages} message(s) as Spark settled the keys that repeat, to '{producer.topic}' (direct path)")
        return produce_frame(store.jobs, settings, producer.bounded(seconds), settled.frame, seconds, f"the produce of {messages} settled message(s) to '{producer.topic}'")
    first = _produce_ordered(store, settings, manifest, producer, reports, settled.listed, result, log) if len(settled.listed[0]) else []
    tasks = sum(1 for r in reports if r.messages)
    largest = max(r.messages for r in reports)
    seconds = deadline_s(largest, producer.flush_timeout_s, waves(tasks, produce_slots(store.jobs.spark)))
    log(f"load: {tasks} task(s) produce {messages} message(s) to '{producer.topic}' (direct path)")
    return first + store.produce(settings, producer.bounded(seconds), reports, settled.left_out, seconds, f"the produce of {tasks} partition(s) of kept messages to '{producer.topic}'")


def _produce_ordered(
    store: KeptMessages,
    settings: sql_task.SqlSettings,
    manifest: Manifest,
    producer: ProducerSettings,
    reports: list[sql_task.SqlReport],
    ordered: Listed,
    result: RunResult,
    log: Log,
) -> list[dict]:
    """The messages of keys that repeat, produced first by one task in source order per key;
    checked against their count, and a failed delivery fails the run before the rest is
    produced."""
    count = len(ordered[0])
    seconds = deadline_s(sum(r.messages for r in reports), producer.flush_timeout_s)  # a store may read every kept message for them
    log(f"load: {count} message(s) of repeated keys produced first, in source order per key (direct path)")
    rows = store.produce_listed(settings, producer.bounded(seconds), reports, ordered, seconds, f"the ordered produce of {count} message(s) to '{producer.topic}'")
    check_ordered_delivery(manifest, rows, count, result)
    return rows
