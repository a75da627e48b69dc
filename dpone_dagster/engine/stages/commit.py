"""Stage 8, commit: only now does the state advance — offsets (or the SQL watermark) and the
run row, in the state store's one transaction."""

from __future__ import annotations

from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.stages.timing import Log
from dpone_dagster.state.base import RunRecord, StateStore, utcnow


def commit(planned: PlannedRead, record: RunRecord, result: RunResult, log: Log) -> None:
    result.status = "success"
    result.finished_at = utcnow().isoformat()
    result.committed_offsets = planned.commit(run_record(record, result, "success"))
    log(
        f"commit: {result.committed_offsets or 'state advanced' if planned.incremental else 'offsets unchanged'}"
    )


def finish_checks_only(store: StateStore, record: RunRecord, result: RunResult, log: Log) -> None:
    """End a run that only judged its batch: the run row is written, no offsets or watermark."""
    result.status = "success"
    result.finished_at = utcnow().isoformat()
    result.notes.append("checks only: the batch was judged; nothing was produced and no offsets moved")
    store.finish_run_success(run_record(record, result, "success"), None, None, None)
    log("commit: checks only, offsets unchanged")


def run_record(record: RunRecord, result: RunResult, status: str) -> RunRecord:
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
