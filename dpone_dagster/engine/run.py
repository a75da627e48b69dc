"""The one runtime algorithm, shared by the Dagster asset and the `dpone run` CLI:

resolve → plan the boundary → preflight the sink → extract on Spark → shape for the sink →
pre-publish checks → produce → reconcile deliveries → advance state (only now) → result.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster import columns as C
from dpone_dagster.connections import resolve_kafka, resolve_postgres
from dpone_dagster.engine import time_windows
from dpone_dagster.engine.bad_records import DeadLetters, handle_bad_records
from dpone_dagster.engine.clients import RunClients
from dpone_dagster.engine.locks import RunLock, run_locks
from dpone_dagster.engine.offsets import OffsetStorage
from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import ConfigError, DataRefused, DponeError, RunFailed
from dpone_dagster.kafka.admin import ensure_sink_topic
from dpone_dagster.kafka.config import check_producer_settings, producer_config
from dpone_dagster.kafka.errors import classify_text
from dpone_dagster.kafka.windows import record_of
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.manifest.rules import REGISTRY_FORMATS
from dpone_dagster.quality.selection import select_checks
from dpone_dagster.quality.target import count_records, end_offsets, offset_advance
from dpone_dagster.redact import redact_text
from dpone_dagster.sources.kafka import KafkaBatchSource, TimeWindow
from dpone_dagster.spark import shape
from dpone_dagster.spark.kafka_reader import JSON_OK
from dpone_dagster.spark.kafka_writer import ProducerSettings, produce
from dpone_dagster.spark.keep import keep_batch, release_batch
from dpone_dagster.state import open_state_store
from dpone_dagster.state.base import RunRecord, StateStore, utcnow

Log = Callable[[str], None]


@dataclass
class RunRequest:
    """What a caller can vary about one run of a manifest."""

    run_id: str | None = None
    # time_window: contiguous windows in order (one per Dagster partition key of the run).
    windows: list[TimeWindow] | None = None
    # Offsets recorded by the last successful Dagster materialization, used when the state
    # store has nothing (e.g. a fresh state database).
    fallback_offsets: dict[int, int] | None = None
    log: Log = field(default=lambda message: None)
    # Resolves a manifest block's connection to librdkafka settings (the Dagster Kafka resource
    # passes its own); defaults to the connections module.
    kafka_config: Callable[[Any], dict[str, Any]] | None = None
    # Resolves a block's Schema Registry settings (the Dagster Schema Registry resource passes its
    # own); defaults to the connections module.
    registry_config: Callable[[Any], dict[str, Any] | None] | None = None
    # The quality checks to evaluate, by name (None: every check); the others are not evaluated.
    checks: frozenset[str] | None = None
    # False: judge the batch a run would publish now with the selected pre-publish checks and stop
    # there; nothing is produced (dead letters neither) and no offsets or watermarks move.
    publish: bool = True

    def clients(self) -> RunClients:
        return RunClients(self.kafka_config, self.registry_config)


def run_pipeline(manifest: Manifest, spark: SparkSession, request: RunRequest | None = None) -> RunResult:
    request = request or RunRequest()
    manifest = select_checks(manifest, request.checks)
    run_id = request.run_id or uuid.uuid4().hex
    result = RunResult(run_id=run_id, pipeline=manifest.name)
    _refuse_unsupported(manifest)
    store = open_manifest_state_store(manifest, request.clients())
    locks = _lock(store, manifest)
    record = RunRecord(run_id=run_id, pipeline=manifest.name, status="running", started_at=utcnow())
    result.started_at = record.started_at.isoformat()
    store.start_run(record)
    try:
        _run(manifest, spark, request, store, record, result)
    except BaseException as exc:
        result.status = "failed"
        result.error = redact_text(str(exc))
        result.finished_at = utcnow().isoformat()
        _record_failure(store, locks, _record(record, result, "failed"), result, request.log)
        _export_metrics(manifest, result, request.log)
        _write_artifacts(manifest, result, request.log)
        error = exc if isinstance(exc, DponeError) else RunFailed(f"run {run_id} failed: {result.error}")
        error.result = result
        if error is exc:
            raise
        raise error from exc
    _unlock(store, locks)
    store.close()
    _export_metrics(manifest, result, request.log)
    _write_artifacts(manifest, result, request.log)
    return result


def _record_failure(store: StateStore, locks: list[RunLock], failed: RunRecord, result: RunResult, log: Log) -> None:
    """Mark the run failed and release its locks. When the store cannot (it may be what failed),
    the run's own error stays the cause and the note says the failure went unrecorded."""
    try:
        store.finish_run_failed(failed)
        _unlock(store, locks)
    except Exception as exc:  # noqa: BLE001 - whatever the store raises, the run's error wins
        note = f"state store: the failed run could not be recorded ({redact_text(str(exc))})"
        result.notes.append(note)
        log(note)
    finally:
        store.close()


def _lock(store: StateStore, manifest: Manifest) -> list[RunLock]:
    """Every lock of the run (engine/locks.py), or none and a RunFailed naming what is held."""
    held: list[RunLock] = []
    for lock in run_locks(manifest):
        if not store.try_lock(lock.key):
            _unlock(store, held)
            where = store.describe()
            store.close()
            raise RunFailed(
                f"another run holds {lock.holder} (its lock is held in the state store {where}); runs that "
                "share it never overlap — wait for that run to finish"
            )
        held.append(lock)
    return held


def _unlock(store: StateStore, locks: list[RunLock]) -> None:
    for lock in reversed(locks):
        store.unlock(lock.key)


def _export_metrics(manifest: Manifest, result: RunResult, log: Log) -> None:
    """Prometheus metrics where observability.metrics says; a failed export is noted in the run's
    result and log, never turned into a failed run (the data already moved or already failed)."""
    from dpone_dagster.observability.metrics import export_run_metrics

    config = manifest.observability.metrics
    if not (config.textfile_dir or config.pushgateway_url):
        return
    try:
        where = export_run_metrics(config, result, finished_at=time.time())
    except Exception as exc:  # noqa: BLE001 - any exporter failure is reported the same way
        note = f"metrics: export failed ({redact_text(str(exc))})"
        result.notes.append(note)
        log(note)
        return
    log(f"metrics: written to {', '.join(where)}")


def _stage_batch(manifest: Manifest, extracted: Any, ctx: shape.ShapeContext) -> tuple[DataFrame, DataFrame, dict[str, Any]]:
    """Keep the extracted batch (the one pass over the source) and read it once for its counts
    and the facts shaping needs. Returns the kept frame (the caller releases it), the batch as
    read from it and the counts.

    Flat JSON keeps the read tasks' output as it is when they decoded every record (no row copy
    before keeping it; each pass renames the columns). When some record needs the JVM decoder,
    the decoded batch is kept instead, so that such records are parsed once; the first counting
    pass is then repeated on it (drift past the schema sample always takes this way)."""
    held: list[DataFrame] = []

    def hold(frame: DataFrame) -> DataFrame:
        held.append(keep_batch(frame))
        return held[-1]

    try:
        if extracted.records is not None:
            records = hold(extracted.records)
            decoded_in_tasks, decoded = extracted.decode_kept(records)
            counts = _batch_counts(manifest, decoded_in_tasks, ctx)
            if not counts[UNDECODED]:
                return records, decoded_in_tasks.drop(JSON_OK), counts
            kept = hold(decoded().drop(*extracted.rebuildable))
            staged = kept.withColumns(extracted.rebuildable)
            counts = _batch_counts(manifest, staged, ctx)  # decoded from the kept read output
            release_batch(records)
            return kept, staged, counts
        kept = hold(extracted.df.drop(*extracted.rebuildable))
        staged = kept.withColumns(extracted.rebuildable)
        return kept, staged, _batch_counts(manifest, staged, ctx)
    except BaseException:
        for frame in held:
            release_batch(frame)
        raise


UNDECODED = "undecoded"  # records a read task left to the JVM decoder


def _batch_counts(manifest: Manifest, staged: DataFrame, ctx: shape.ShapeContext) -> dict[str, Any]:
    """Rows, corrupt records, deletes, drift and the facts shaping checks (`_shape_facts`), in one
    pass; with keep_last/keep_first also the repeated keys (`_counts_by_key`)."""
    try:
        keyed = shape.sink_key(staged, manifest.sink)
        facts = _shape_facts(manifest, keyed, ctx)
    except ConfigError:
        keyed, facts = None, {}  # the key columns are missing: shaping reports it, if it comes to that
    columns = {
        "rows": F.count(F.lit(1)),
        "corrupt": F.count(F.col(C.CORRUPT)),
        "deletes": F.count(F.when(F.col(C.OP) == C.DELETE, 1)),
        "unknown": F.count(F.col(C.UNKNOWN_KEYS)) if C.UNKNOWN_KEYS in staged.columns else F.count(F.lit(None)),
        UNDECODED: F.count(F.when(~F.col(JSON_OK), 1)) if JSON_OK in staged.columns else F.count(F.lit(None)),
        **facts,
    }
    defaults = {"keyless_deletes": 0, "keyless_upserts": 0, "size_bound": None}
    if keyed is not None and _keeps_one_per_key(manifest):
        return {**defaults, **_counts_by_key(manifest, keyed, columns)}
    counts = (keyed if keyed is not None else staged).agg(*[column.alias(name) for name, column in columns.items()]).first()
    return {**defaults, **counts.asDict()}


def _keeps_one_per_key(manifest: Manifest) -> bool:
    return shape.uses_dedupe(manifest.sink) and manifest.sink.strategy.duplicate_policy in ("keep_last", "keep_first")


def _counts_by_key(manifest: Manifest, keyed: DataFrame, columns: dict[str, Column]) -> dict[str, Any]:
    """The batch counts and, in the same pass, the keys that repeat among the rows shaping keeps
    (decoded, and not a delete that is skipped): `duplicated_keys` and `duplicates` (rows beyond
    the first per key). One aggregate per key, then one over the keys."""
    kept = F.col(C.CORRUPT).isNull()
    if not manifest.sink.options.deletes.enabled:
        kept = kept & (F.col(C.OP) != C.DELETE)
    per_key = keyed.groupBy(shape.KEY).agg(
        *[column.alias(name) for name, column in columns.items()], F.count(F.when(kept, 1)).alias("__kept")
    )
    repeated = F.col(shape.KEY).isNotNull() & (F.col("__kept") > 1)
    totals = [F.max(name) if name == "size_bound" else F.coalesce(F.sum(name), F.lit(0)) for name in columns]
    counts = per_key.agg(
        *[total.alias(name) for total, name in zip(totals, columns, strict=True)],
        F.count(F.when(repeated, 1)).alias("duplicated_keys"),
        F.coalesce(F.sum(F.when(repeated, F.col("__kept") - 1)), F.lit(0)).alias("duplicates"),
    )
    return counts.first().asDict()


def _shape_facts(manifest: Manifest, keyed: DataFrame, ctx: shape.ShapeContext) -> dict[str, Column]:
    """Aggregates of the keyed batch that shaping checks: deletes without a key (a tombstone needs
    one), decoded upserts without their unique key, and the bound on message sizes (JSON sinks;
    absent when a payload type has none)."""
    sink = manifest.sink
    key_missing = F.col(shape.KEY).isNull() & F.col(C.CORRUPT).isNull()
    facts: dict[str, Column] = {}
    if sink.options.deletes.tombstone:
        facts["keyless_deletes"] = F.count(F.when((F.col(C.OP) == C.DELETE) & key_missing, 1))
    if sink.options.key.mode == "unique_key" and sink.strategy.unique_key_columns:
        facts["keyless_upserts"] = F.count(F.when((F.col(C.OP) == C.UPSERT) & key_missing, 1))
    if not _writes_registry_format(manifest):
        bound = shape.message_size_bound(keyed, sink, ctx)
        if bound is not None:
            facts["size_bound"] = F.max(bound)
    return facts


def _shape_context(manifest: Manifest, result: RunResult) -> shape.ShapeContext:
    return shape.ShapeContext(
        pipeline=manifest.name,
        run_id=result.run_id,
        strategy=manifest.sink.strategy.mode,
        source_fields={"topic": manifest.source.topic} if isinstance(manifest.source, KafkaSource) else {},
    )


def _write_artifacts(manifest: Manifest, result: RunResult, log: Log) -> None:
    """run.json, plan.md and metrics.json under observability.artifacts.path (when enabled)."""
    artifacts = manifest.observability.artifacts
    if not artifacts.enabled:
        return
    from dpone_dagster.engine.plan import build_plan, render_markdown
    from dpone_dagster.observability.artifacts import build_metrics, write_metrics, write_run_artifact

    try:
        plan = render_markdown(build_plan(manifest, probe=False))
        run_dir = write_run_artifact(artifacts.path, result.as_dict(), plan, result.gates)
        write_metrics(artifacts.path, result.run_id, build_metrics(result.as_dict(), result.lag_before, result.lag_after))
        log(f"artifacts: {run_dir}")
    except Exception as exc:  # an artifact must never turn a delivered run into a failed one
        log(f"artifacts: could not be written: {exc}")


def resolve_connections(manifest: Manifest) -> None:
    """Resolve every connection the manifest names (credentials present and well-formed)."""
    from dpone_dagster.connections import resolve_jdbc

    resolve_kafka(manifest.sink)
    if isinstance(manifest.source, KafkaSource):
        resolve_kafka(manifest.source)
    else:
        resolve_jdbc(manifest.source)
    if manifest.state.type == "postgres":
        resolve_postgres(manifest.state)


def _refuse_unsupported(manifest: Manifest) -> None:
    """Settings the model accepts but this engine cannot execute yet: refuse before any IO."""
    return None


def _record(record: RunRecord, result: RunResult, status: str) -> RunRecord:
    return RunRecord(
        run_id=record.run_id,
        pipeline=record.pipeline,
        status=status,
        started_at=record.started_at,
        finished_at=utcnow(),
        boundary=result.boundary,
        counts=result.counts(),
        timings=result.timings,
        error=result.error,
    )


@contextmanager
def _stage(result: RunResult, name: str, log: Log) -> Iterator[None]:
    started = time.perf_counter()
    log(f"{name}: started")
    try:
        yield
    finally:
        result.timings[name] = round(time.perf_counter() - started, 3)
        log(f"{name}: {result.timings[name]}s")


def open_manifest_state_store(manifest: Manifest, clients: RunClients | None = None) -> StateStore:
    state = manifest.state
    if state.type == "kafka_control_topic":
        from dpone_dagster.replication.control_topic import ControlTopicStore, commit_group_of

        replication = manifest.sink.options.replication
        return ControlTopicStore(
            (clients or RunClients()).kafka(manifest.sink),
            replication.control_topic,
            commit_group_of(manifest),
            replication.transaction_timeout_ms,
        )
    connect_kwargs = resolve_postgres(state).connect_kwargs() if state.type == "postgres" else None
    return open_state_store(state, manifest.name, connect_kwargs)


@dataclass
class _PlannedRead:
    """A source's fixed boundary and how to advance the state once the sink succeeded."""

    source: Any  # KafkaBatchSource | SqlBatchSource
    boundary: Any  # Boundary | SqlBoundary
    name: str  # what is read, for progress messages
    label: str  # the source, for error messages
    incremental: bool  # an empty batch means "no new data" (not a short batch)
    commit: Callable[[RunRecord], dict[int, int]]


def _plan_kafka(
    manifest: Manifest, request: RunRequest, store: StateStore, record: RunRecord, result: RunResult, clients: RunClients
) -> _PlannedRead:
    source_registry = clients.registry(manifest.source) if manifest.source.options.message_format != "json" else None
    source = KafkaBatchSource(manifest, clients.kafka(manifest.source), source_registry)
    offsets = OffsetStorage(manifest, store, source.client_config, source.group_id)
    stored = offsets.load(request.fallback_offsets, manifest.name, record.run_id)
    # Windows materialized before read the offsets they recorded then (kafka/windows.py).
    boundary = source.plan(stored, request.windows, time_windows.load_recorded(manifest, store))
    result.lag_before = boundary.lag_before
    # A time window or a replaced slice is addressed by its bounds, not by a cursor.
    advance = boundary.method != "time_window" and manifest.sink.strategy.mode != "replace"
    screen = time_windows.LateRecordScreen(source, result, clients.kafka(manifest.sink)) if boundary.method == "time_window" else None

    def commit(success: RunRecord) -> dict[int, int]:
        windows = None
        if screen is not None:
            screen.send_dead_letters()  # with the run's output: after the gates and the sink, before the state
            windows = record_of(boundary.windows, success.run_id)
        offsets.commit(success, boundary.end_offsets if advance else None, windows)
        result.lag_after = boundary.lag_before - boundary.total if advance else None
        return boundary.end_offsets if advance else {}

    incremental = boundary.method in ("offsets", "max_records") and manifest.sink.strategy.mode not in ("full_refresh", "replace")
    summary = f"{boundary.total} offsets in {len(boundary.ranges)} partition(s) of '{boundary.topic}'"
    return _PlannedRead(screen or source, boundary, summary, f"'{boundary.topic}'", incremental, commit)


def _plan_sql(manifest: Manifest, spark: SparkSession, store: StateStore) -> _PlannedRead:
    from dpone_dagster.connections import resolve_jdbc
    from dpone_dagster.sources.sql import SqlBatchSource

    source = SqlBatchSource(manifest, resolve_jdbc(manifest.source))
    boundary = source.plan(spark, store.load_watermark(manifest.name))

    def commit(success: RunRecord) -> dict[int, int]:
        # The watermark moves in the same commit that marks the run successful.
        store.finish_run_success(success, None, None, None, watermark=boundary.new_watermark)
        return {}

    summary = f"{boundary.method} read of {boundary.table} ({boundary.total if boundary.total is not None else '?'} rows)"
    return _PlannedRead(source, boundary, summary, boundary.table, boundary.method in ("incremental", "cdc"), commit)


def _run(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
) -> None:
    log = request.log
    clients = request.clients()
    sink_config = clients.kafka(manifest.sink)
    check_producer_settings(manifest, sink_config)  # the connection's and resource's overrides too
    if manifest.sink.options.delivery.mode == "exactly_once":
        _run_replication(manifest, spark, request, store, record, result, clients)
        return

    with _stage(result, "plan", log):
        if isinstance(manifest.source, KafkaSource):
            planned = _plan_kafka(manifest, request, store, record, result, clients)
        else:
            planned = _plan_sql(manifest, spark, store)
        result.boundary = planned.boundary.as_dict()
        result.notes.extend(planned.boundary.notes)
        log(f"plan: {planned.name}")

    with _stage(result, "preflight", log):
        ensure_sink_topic(sink_config, manifest.sink.topic, manifest.sink.options.create_topic)
        # Reconciliation reads the target: where its partitions end before this run writes.
        reconciles = any(c.type == "source_target_count" for c in manifest.quality.checks)
        target_before = end_offsets(sink_config, manifest.sink.topic) if reconciles else None

    persisted: DataFrame | None = None  # what to unpersist; `staged` is the view of it in use
    extracted = None
    letters: DeadLetters | None = None
    try:
        with _stage(result, "extract", log):
            extracted = planned.source.extract(spark, planned.boundary, log)
            ctx = _shape_context(manifest, result)
            persisted, staged, counts = _stage_batch(manifest, extracted, ctx)
            if counts["unknown"]:
                # Records with keys the schema sample missed: widen the schema, read again.
                extracted = planned.source.widen(spark, planned.boundary, extracted, staged, log)
                release_batch(persisted)
                persisted, staged, counts = _stage_batch(manifest, extracted, ctx)
            staged = staged.drop(C.UNKNOWN_KEYS, C.UNKNOWN_TEXT)
            result.notes.extend(extracted.notes)
            result.rows_extracted = int(counts["rows"])
            letters = DeadLetters(manifest, extracted.raw, sink_config)
            corrupt = int(counts["corrupt"])
            if corrupt:
                bad = staged.where(F.col(C.CORRUPT).isNotNull()).select(
                    F.col(C.SOURCE_PARTITION).alias("partition"),
                    F.col(C.SOURCE_OFFSET).alias("offset"),
                    _corrupt_reason().alias("reason"),
                )
                what = f"record(s) of {planned.label} could not be decoded"
                handle_bad_records(manifest, bad, corrupt, letters, result, what)
                staged = staged.where(F.col(C.CORRUPT).isNull())

        with _stage(result, "quality_pre", log):
            # Checks of the extracted batch (min_rows, stage: extracted); the others judge the rows
            # as they will be published, after the delete policy, bad records and de-duplication.
            _pre_publish_gates(manifest, staged, planned.incremental, result, result.rows_extracted, "extracted")

        if result.rows_extracted - result.rows_dead_lettered - result.rows_skipped == 0:
            with _stage(result, "quality_published", log):
                _pre_publish_gates(manifest, staged, planned.incremental, result, 0, "published")
            if request.publish:
                _publish_dead_letters(letters, result, log)
            log("extract: no new records; nothing to produce")
        else:
            _shape_and_load(
                manifest, staged, ctx, counts, letters, sink_config, clients, planned.incremental, target_before, request.publish, result, log
            )
    finally:
        if persisted is not None:
            release_batch(persisted)
        if extracted is not None and extracted.raw is not None:
            extracted.raw.unpersist()  # registry formats keep the raw batch (schema ids, dead letters)
    if not request.publish:
        _finish_checks_only(store, record, result, log)
        return

    with _stage(result, "commit", log):
        result.status = "success"
        result.finished_at = utcnow().isoformat()
        result.committed_offsets = planned.commit(_record(record, result, "success"))
        log(f"commit: {result.committed_offsets or 'state advanced' if planned.incremental else 'offsets unchanged'}")


def _run_replication(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
    clients: RunClients,
) -> None:
    """Exactly-once Kafka -> Kafka: each Spark task copies one source partition range and writes the
    new source offset to the control topic in the same transaction. Offsets live only there."""
    from dpone_dagster.replication.run import plan_replication, run_replication

    log = request.log
    source_config, target_config = clients.kafka(manifest.source), clients.kafka(manifest.sink)
    mapping = manifest.sink.options.replication.schema_mapping
    registries = (clients.registry(manifest.source), clients.registry(manifest.sink)) if mapping else (None, None)
    plan = None
    target_before: dict[str, dict[int, int]] | None = None
    if manifest.quality.checks:
        with _stage(result, "quality_pre", log):
            # Gates read the planned ranges before any transaction begins; the replication copies
            # exactly these ranges (one plan from the gates to the commit).
            plan = plan_replication(manifest, source_config, target_config, log)
            _replication_gates(manifest, spark, plan, source_config, clients, result, log)
    if not request.publish:
        _finish_checks_only(store, record, result, log)
        return
    if plan is not None and any(c.type == "source_target_count" for c in manifest.quality.checks):
        target_before = _target_ends(target_config, plan.targets.values(), set(plan.target_partitions))
    planned_rows = result.rows_extracted
    with _stage(result, "replicate", log):
        replicated = run_replication(
            manifest, spark, source_config, target_config, result.run_id, log, None, *registries, plan=plan
        )
    result.rows_extracted = result.messages_produced = replicated.records
    result.bytes_produced = replicated.bytes
    result.notes.extend(replicated.notes)
    result.executors = sorted({p.executor for p in replicated.partitions if p.executor})
    result.boundary = {
        "method": "replication",
        "control_topic": replicated.control_topic,
        "commit_group": replicated.commit_group,
        "targets": replicated.targets,
        "partitions": replicated.committed_ranges,
    }
    offsets = replicated.committed_offsets
    if len(offsets) == 1:
        result.committed_offsets = dict(next(iter(offsets.values())))
    if target_before is not None:
        with _stage(result, "quality_post", log):
            _replication_reconciliation(manifest, target_config, target_before, planned_rows, replicated.records, result)
    with _stage(result, "commit", log):
        # The offsets were committed with the records; only the run row is written here.
        result.status = "success"
        result.finished_at = utcnow().isoformat()
        store.finish_run_success(_record(record, result, "success"), None, None, None)


def _target_ends(config: dict, topics: Any, existing: set[str]) -> dict[str, dict[int, int]]:
    """Committed end offsets (read_committed) of each target topic; a topic the run will create
    starts empty."""
    return {t: end_offsets(config, t, transactional=True) if t in existing else {} for t in sorted(set(topics))}


def _replication_reconciliation(
    manifest: Manifest, config: dict, before: dict[str, dict[int, int]], planned_rows: int, copied: int, result: RunResult
) -> None:
    """source_target_count of a replication: the rows the gates read from the planned ranges
    against what the target topics committed (read_committed). The records were committed with
    their offsets, so a failure cannot hold the state back: it fails the run to raise the alarm."""
    from dpone_dagster.quality.gates import failed_gates, run_post_publish

    checks = manifest.quality.checks
    exclusive = any(c.type == "source_target_count" and c.exclusive_target for c in checks)
    advance: dict[Any, int] = {}
    held = 0
    for topic, start in before.items():
        after = end_offsets(config, topic, transactional=True)
        # Each committed transaction leaves a marker offset: the advance exceeds the records.
        advance.update({(topic, p): n for p, n in offset_advance(start, after).items()})
        if exclusive:
            held += count_records(config, topic, start, after, transactional=True)
    gates = run_post_publish(checks, manifest.quality.mode, planned_rows, planned_rows, copied, advance, held if exclusive else None)
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if blocking:
        raise RunFailed(
            "reconciliation failed after the replication committed (records and source offsets are "
            "committed together, so the next run starts after them; inspect the target): "
            + "; ".join(f"{g.name}: {g.description}" for g in blocking)
        )


def _replication_gates(
    manifest: Manifest, spark: SparkSession, plan: Any, source_config: dict, clients: RunClients, result: RunResult, log: Log
) -> None:
    """Decode the planned ranges (per source topic) and run the pre-publish gates on them."""
    from dpone_dagster.kafka.boundary import Boundary, PartitionRange

    frames = []
    registry = clients.registry(manifest.source) if manifest.source.options.message_format != "json" else None
    for topic in sorted({p.topic for p in plan.planned}):
        ranges = tuple(PartitionRange(p.partition, p.start, p.end) for p in plan.planned if p.topic == topic)
        single = manifest.model_copy(update={"source": replace_topic(manifest.source, topic)})
        extracted = KafkaBatchSource(single, source_config, registry).extract(spark, Boundary(topic, "offsets", ranges), log)
        frames.append(extracted.df)
    if not frames:
        return
    staged = frames[0]
    for frame in frames[1:]:
        staged = staged.unionByName(frame, allowMissingColumns=True)
    staged = staged.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result.rows_extracted = staged.count()
        _pre_publish_gates(manifest, staged, True, result, result.rows_extracted)
    finally:
        staged.unpersist()


def replace_topic(source: KafkaSource, topic: str) -> KafkaSource:
    return source.model_copy(update={"topic": topic, "topics": None, "topic_pattern": None})


def _shape_and_load(
    manifest: Manifest,
    staged: DataFrame,
    ctx: shape.ShapeContext,
    counts: dict[str, Any],
    letters: DeadLetters,
    sink_config: dict,
    clients: RunClients,
    incremental: bool,
    target_before: dict[int, int] | None,
    publish: bool,
    result: RunResult,
    log: Log,
) -> None:
    release: list[DataFrame] = []  # frames persisted while shaping, kept until the producer is done
    try:
        with _stage(result, "shape", log):
            messages, expected = _shape(manifest, staged, ctx, counts, letters, sink_config, clients, incremental, result, release, log)
        if not publish:
            return
        # Every gate has passed: the run's output leaves the process, dead letters first.
        _publish_dead_letters(letters, result, log)
        _load(manifest, messages, expected, sink_config, target_before, result, log)
    finally:
        for frame in release:
            frame.unpersist()


def _load(
    manifest: Manifest,
    messages: DataFrame,
    expected: int,
    sink_config: dict,
    before: dict[int, int] | None,
    result: RunResult,
    log: Log,
) -> None:
    with _stage(result, "load", log):
        delivery = manifest.sink.options.delivery
        stats = produce(
            messages,
            ProducerSettings(
                topic=manifest.sink.topic,
                config=tuple(producer_config(sink_config, delivery).items()),
                flush_timeout_s=delivery.flush_timeout_s,
                headers_or_partitions=shape.has_headers(manifest.sink),
            ),
        )
        result.messages_produced = stats.delivered
        result.tombstones = stats.tombstones
        result.bytes_produced = stats.bytes
        result.sink_partitions = [p.__dict__ for p in stats.partitions]
        result.executors = list(stats.executors)
        if not stats.ok:
            classified = classify_text(" ".join(stats.errors))
            raise RunFailed(
                f"{stats.failed} message(s) to '{manifest.sink.topic}' were not delivered: "
                + classified.message("; ".join(stats.errors))
                + "; no state was advanced, a rerun re-produces the batch"
            )
    with _stage(result, "quality_post", log):
        _post_publish_gates(manifest, stats, expected, sink_config, before, result)


def _finish_checks_only(store: StateStore, record: RunRecord, result: RunResult, log: Log) -> None:
    """End a run that only judged its batch: the run row is written, no offsets or watermark."""
    result.status = "success"
    result.finished_at = utcnow().isoformat()
    result.notes.append("checks only: the batch was judged; nothing was produced and no offsets moved")
    store.finish_run_success(_record(record, result, "success"), None, None, None)
    log("commit: checks only, offsets unchanged")


def _publish_dead_letters(letters: DeadLetters | None, result: RunResult, log: Log) -> None:
    if letters is None or not letters.count:
        return
    with _stage(result, "dead_letters", log):
        letters.publish(result)


def _pre_publish_gates(
    manifest: Manifest, frame: DataFrame, incremental: bool, result: RunResult, rows: int, stage: str | None = None
) -> None:
    """Gates of one stage (`extracted`: the decoded batch; `published`: the rows to publish; None:
    every check) on `frame` of `rows` rows, before anything is produced; fail mode stops the run here."""
    from dpone_dagster.quality.gates import failed_gates, run_pre_publish

    quality = manifest.quality
    gates = run_pre_publish(
        frame,
        quality.checks,
        quality.mode,
        rows,
        incremental_empty=incremental and result.rows_extracted == 0,
        now=utcnow(),
        stage=stage,
    )
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if blocking:
        raise DataRefused(
            "quality gate(s) failed before publishing, nothing was produced and no state advanced: "
            + "; ".join(f"{g.name}: {g.description}" for g in blocking)
        )


def _post_publish_gates(
    manifest: Manifest, stats: Any, expected: int, sink_config: dict, before: dict[int, int] | None, result: RunResult
) -> None:
    """Reconciliation after delivery, against what the target topic holds (its end offsets before
    and after producing; with exclusive_target the records in between); in fail mode a mismatch
    stops the state from advancing."""
    from dpone_dagster.quality.gates import failed_gates, run_post_publish

    quality = manifest.quality
    if not any(c.type == "source_target_count" for c in quality.checks):
        # Without a configured tolerance every produced message must be acknowledged.
        if stats.delivered != expected:
            raise RunFailed(
                f"delivery reports account for {stats.delivered} message(s) but {expected} were produced; "
                "no state was advanced"
            )
        return
    topic = manifest.sink.topic
    after = end_offsets(sink_config, topic)
    exclusive = any(c.type == "source_target_count" and c.exclusive_target for c in quality.checks)
    held = count_records(sink_config, topic, before or {}, after) if exclusive else None
    gates = run_post_publish(
        quality.checks,
        quality.mode,
        result.rows_extracted,
        expected,
        stats.delivered,
        offset_advance(before or {}, after),
        held,
    )
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if blocking:
        raise RunFailed(
            "reconciliation failed after publishing, state was not advanced (a rerun re-produces the batch): "
            + "; ".join(f"{g.name}: {g.description}" for g in blocking)
        )



def _corrupt_reason() -> Column:
    """Every decoder says why and where ("unknown schema id 42 at 0@18")."""
    return F.col(C.CORRUPT)


def _shape(
    manifest: Manifest,
    staged: DataFrame,
    ctx: shape.ShapeContext,
    counts: dict[str, Any],
    letters: DeadLetters,
    sink_config: dict,
    clients: RunClients,
    incremental: bool,
    result: RunResult,
    release: list[DataFrame],
    log: Log,
) -> tuple[DataFrame, int]:
    """Apply key, delete policy, bad-key policy, duplicate policy, the published-stage gates and
    the size limit, with the facts `_stage_batch` counted; returns (messages, expected message
    count). Nothing is produced here; frames persisted on the way are appended to `release`."""
    sink = manifest.sink
    options = sink.options
    deletes = int(counts["deletes"] or 0)
    batch = staged
    if deletes and not options.deletes.enabled:
        if options.deletes.when_disabled == "fail":
            raise RunFailed(
                f"the batch holds {deletes} delete(s) but sink.options.deletes.enabled is false; enable deletes "
                "(with tombstone: true, or envelope: dpone) or set deletes.when_disabled: skip to drop them"
            )
        batch = batch.where(F.col(C.OP) != C.DELETE)
        result.deletes_skipped = deletes
    keyed = shape.sink_key(batch, sink)
    if counts["keyless_deletes"]:
        raise RunFailed(f"{counts['keyless_deletes']} delete(s) have no key, so no tombstone can be produced; check unique_key")
    keyless = counts["keyless_upserts"]
    if keyless:
        bad = keyed.where((F.col(C.OP) == C.UPSERT) & F.col(shape.KEY).isNull()).select(
            F.col(C.SOURCE_PARTITION).alias("partition"),
            F.col(C.SOURCE_OFFSET).alias("offset"),
            F.lit(f"missing unique key {list(sink.strategy.unique_key_columns)}").alias("reason"),
        )
        handle_bad_records(manifest, bad, keyless, letters, result, "record(s) have no unique key")
        keyed = keyed.where(~((F.col(C.OP) == C.UPSERT) & F.col(shape.KEY).isNull()))
    keyed_rows = result.rows_extracted - result.deletes_skipped - result.rows_dead_lettered - result.rows_skipped
    removed = 0  # rows de-duplication drops
    if sink.strategy.mode in shape.DEDUPE_MODES and options.key.mode == "unique_key":
        policy = sink.strategy.duplicate_policy
        if policy == "fail":
            count, sample = shape.duplicate_keys(keyed)
            if count:
                raise RunFailed(
                    f"duplicate_policy: fail — {count} key(s) occur more than once in the batch "
                    f"(e.g. {sample}); nothing was produced. Use keep_last/keep_first to keep one row per key"
                )
        elif policy in ("keep_last", "keep_first"):
            keyed, removed = _keep_one_per_key(manifest, keyed, policy, counts, release)
    with _stage(result, "quality_published", log):
        _pre_publish_gates(manifest, keyed, incremental, result, keyed_rows - removed, "published")
    if options.key.mode == "unique_key" and not shape.uses_dedupe(sink):
        keyed = shape.ordered_by_key(keyed)
    registry = _registry_plan(manifest, keyed, clients, result)
    messages = shape.to_messages(keyed, sink, ctx, registry)
    limit = int(producer_config(sink_config, options.delivery).get("message.max.bytes", 1_000_000))
    result.duplicates_removed = removed
    # The accounting is the expectation: reconciliation compares it with the delivery reports.
    expected = keyed_rows - removed
    bound = counts["size_bound"]
    if bound is not None and bound <= limit:
        return messages, expected  # no message can be over the limit: the producer tasks encode
    return _measured_messages(manifest, messages, limit, expected, letters, result, release)


# Duplicated keys up to this many are resolved with a broadcast of (key, winning order); more
# fall back to a sort of the whole batch by key.
BROADCAST_DEDUPE_KEYS = 1_000_000


def _keep_one_per_key(
    manifest: Manifest, keyed: DataFrame, policy: str, counts: dict[str, Any], release: list[DataFrame]
) -> tuple[DataFrame, int]:
    """keep_last / keep_first: the de-duplicated rows and how many rows were dropped (`counts`
    says how many keys repeat, see `_counts_by_key`)."""
    keys, dropped = int(counts["duplicated_keys"]), int(counts["duplicates"])
    if keys == 0:
        return keyed, 0
    if not isinstance(manifest.source, KafkaSource) or keys > BROADCAST_DEDUPE_KEYS:
        # SQL source orders (watermark, key) can tie: the window picks exactly one row per key.
        return shape.dedupe(keyed, policy), dropped
    winners = shape.duplicate_winners(keyed, shape.duplicated_keys(keyed), policy).persist(StorageLevel.MEMORY_AND_DISK)
    winners.count()
    release.append(winners)
    return shape.keep_winners(keyed, winners), dropped


def _measured_messages(
    manifest: Manifest,
    messages: DataFrame,
    limit: int,
    expected: int,
    letters: DeadLetters,
    result: RunResult,
    release: list[DataFrame],
) -> tuple[DataFrame, int]:
    """Encode every message once, keep it (the producer tasks read the kept copy) and find those
    over message.max.bytes before producing (brokers may not enforce it); they are bad records.
    Returns (messages, expected count)."""
    size = shape.message_size(F.col("key"), F.octet_length("value"), F.col("headers"))
    sized = messages.withColumn("__size", size).persist(StorageLevel.MEMORY_AND_DISK)
    release.append(sized)
    too_large = sized.where(F.col("__size") > limit).count()
    if not too_large:
        return sized.drop("__size"), expected
    bad = sized.where(F.col("__size") > limit).select(
        F.col(C.SOURCE_PARTITION).alias("partition"),
        F.col(C.SOURCE_OFFSET).alias("offset"),
        F.concat(F.lit("message of "), F.col("__size").cast("string"), F.lit(f" bytes exceeds message.max.bytes {limit}")).alias("reason"),
    )
    handle_bad_records(manifest, bad, too_large, letters, result, f"message(s) exceed message.max.bytes {limit}")
    return sized.where(F.col("__size") <= limit).drop("__size"), expected - too_large


def _writes_registry_format(manifest: Manifest) -> bool:
    return manifest.sink.options.message_format in REGISTRY_FORMATS


def _registry_plan(manifest: Manifest, keyed: DataFrame, clients: RunClients, result: RunResult) -> Any:
    """Schema evolution against the sink subject (registry formats); None for JSON sinks."""
    if not _writes_registry_format(manifest):
        result.schema_evolution = {"target": "no registry: the target side of schema evolution is a no-op"}
        return None
    from dpone_dagster.sinks.registry import plan_registry_write  # the registry clients: only when needed
    payload = StructType([f for f in keyed.schema.fields if f.name in C.payload_columns(keyed.columns) and f.name != shape.KEY])
    plan = plan_registry_write(manifest, payload, clients.registry(manifest.sink))
    result.schema_evolution = plan.as_dict()
    return plan
