"""The one runtime algorithm, shared by the Dagster asset and the `dpone run` CLI.

`_run` below is the whole order of a run on one screen; each stage lives in engine/stages/. The
guarantees depend on this order: gates judge the batch before anything is produced, dead
letters leave with the output, and the state advances only after the sink succeeded.
"""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession

from dpone_dagster.engine import direct, direct_sql
from dpone_dagster.engine.lifecycle import (
    export_metrics,
    lock,
    record_failure,
    resolve_connections,
    unlock,
    write_artifacts,
)
from dpone_dagster.engine.replicate import replicate
from dpone_dagster.engine.request import RunRequest
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.bad_records import screen_undecodable
from dpone_dagster.engine.stages.boundary import PlannedRead, plan_read
from dpone_dagster.engine.stages.commit import Output, commit_run, finish_checks_only, run_record
from dpone_dagster.engine.stages.extract import extract, writes_registry_format
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.load import Delivered, load, prepare_sink, publish_dead_letters
from dpone_dagster.engine.stages.shape import shape_messages
from dpone_dagster.engine.stages.timing import KeptFrames, Log, stage
from dpone_dagster.errors import DponeError, RunFailed
from dpone_dagster.kafka.config import check_producer_settings
from dpone_dagster.manifest.models import Manifest, SqlSource
from dpone_dagster.quality.selection import select_checks
from dpone_dagster.redact import redact_text
from dpone_dagster.sinks.dead_letters import DeadLetters
from dpone_dagster.state.base import RunRecord, StateStore, utcnow
from dpone_dagster.state.open import open_manifest_state_store

__all__ = ["RunRequest", "open_manifest_state_store", "resolve_connections", "run_pipeline"]


def run_pipeline(manifest: Manifest, spark: SparkSession, request: RunRequest | None = None) -> RunResult:
    """Run `manifest` once: take its locks, record the run, run the stages, and on any failure
    record it, release the locks and raise (a DponeError; anything else wrapped in RunFailed)."""
    request = request or RunRequest()
    manifest = select_checks(manifest, request.checks)
    run_id = request.run_id or uuid.uuid4().hex
    result = RunResult(run_id=run_id, pipeline=manifest.name)
    store = open_manifest_state_store(manifest, request.clients())
    locks = lock(store, manifest)
    record = RunRecord(run_id=run_id, pipeline=manifest.name, status="running", started_at=utcnow())
    result.started_at = record.started_at.isoformat()
    store.start_run(record)
    try:
        _run(manifest, spark, request, store, record, result)
    except BaseException as exc:
        result.status = "failed"
        result.error = redact_text(str(exc) or type(exc).__name__)  # some errors carry no text
        result.finished_at = utcnow().isoformat()
        record_failure(store, locks, run_record(record, result, "failed"), result, request.log)
        export_metrics(manifest, result, request.log)
        write_artifacts(manifest, result, request.log)
        error = exc if isinstance(exc, DponeError) else RunFailed(f"run {run_id} failed: {result.error}")
        error.result = result
        if error is exc:
            raise
        raise error from exc
    unlock(store, locks)
    store.close()
    export_metrics(manifest, result, request.log)
    write_artifacts(manifest, result, request.log)
    return result


def _run(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
) -> None:
    """plan → extract → bad records → gates → shape → load → commit (deliveries, post-publish
    checks, state: engine/stages/commit.py); on the direct path, extract to load run in the Spark
    tasks (engine/direct.py)."""
    log, clients = request.log, request.clients()
    sink_config = clients.kafka(manifest.sink)
    check_producer_settings(manifest, sink_config)  # the connection's and resource's overrides too
    if manifest.sink.options.delivery.mode == "exactly_once":
        return replicate(manifest, spark, request, store, record, result, clients)
    with stage(result, "plan", log):
        planned = plan_read(manifest, spark, request, store, record, result, clients)
        log(f"plan: {planned.name}")
    with stage(result, "preflight", log):
        reconciled = prepare_sink(manifest, sink_config)  # the target and its ends before the run
    registry = clients.registry(manifest.sink) if writes_registry_format(manifest) else None
    direct_copy = direct_sql.copy if isinstance(manifest.source, SqlSource) else direct.copy
    delivered = direct_copy(manifest, spark, planned, result, sink_config, log, registry, request.publish)
    if delivered is None:
        delivered = _through_spark_sql(manifest, spark, request, planned, result, sink_config, log)
    if not request.publish:
        return finish_checks_only(store, record, result, log)
    output = None
    if isinstance(delivered, Delivered):
        target, before = reconciled if reconciled is not None else (None, None)
        output = Output(result.rows_extracted, delivered.expected, delivered.stats.delivered, target, before)
    commit_run(manifest, output, planned.state, record, result, log)


def _through_spark_sql(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    planned: PlannedRead,
    result: RunResult,
    sink_config: dict,
    log: Log,
) -> Delivered | None:
    """extract → bad records → gates → shape → load on Spark SQL; None when nothing was produced."""
    result.execution_path = "spark_sql"
    kept = KeptFrames()
    try:
        with stage(result, "extract", log):
            batch = extract(manifest, spark, planned, result, kept, log)
            letters = DeadLetters(manifest, batch.raw, sink_config)
            batch = screen_undecodable(manifest, batch, planned.label, letters, result)
        with stage(result, "quality_pre", log):
            pre_publish_gates(
                manifest, batch.staged, planned.incremental, result, result.rows_extracted, "extracted"
            )
        if result.rows_extracted - result.rows_dead_lettered - result.rows_skipped == 0:
            with stage(result, "quality_published", log):
                pre_publish_gates(manifest, batch.staged, planned.incremental, result, 0, "published")
            if request.publish:
                publish_dead_letters(letters, result, log)
            log("extract: no new records; nothing to produce")
            return None
        with stage(result, "shape", log):
            messages = shape_messages(
                manifest, batch, letters, sink_config, request.clients(), planned.incremental, result, kept, log, request.publish
            )
        if not request.publish:
            return None
        publish_dead_letters(letters, result, log)  # every gate passed: the output leaves, letters first
        with stage(result, "load", log):
            return Delivered(load(manifest, messages.frame, messages.expected, sink_config, result), messages.expected)
    finally:
        kept.release_all()
