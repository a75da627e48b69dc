"""Around every run: its locks, the failed run's record, metrics and artifacts. None of these
move data; a failure here never turns a delivered run into a failed one (except the locks, which
are taken before anything is read)."""

from __future__ import annotations

import time

from dpone_dagster.connections import resolve_kafka, resolve_postgres
from dpone_dagster.engine.locks import RunLock, run_locks
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.timing import Log
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.redact import redact_text
from dpone_dagster.state.base import RunRecord, StateStore


def record_failure(
    store: StateStore, locks: list[RunLock], failed: RunRecord, result: RunResult, log: Log
) -> None:
    """Mark the run failed and release its locks. When the store cannot (it may be what failed),
    the run's own error stays the cause and the note says the failure went unrecorded."""
    try:
        store.finish_run_failed(failed)
        unlock(store, locks)
    except Exception as exc:  # noqa: BLE001 - whatever the store raises, the run's error wins
        note = f"state store: the failed run could not be recorded ({redact_text(str(exc))})"
        result.notes.append(note)
        log(note)
    finally:
        store.close()


def lock(store: StateStore, manifest: Manifest) -> list[RunLock]:
    """Every lock of the run (engine/locks.py), or none and a RunFailed naming what is held."""
    held: list[RunLock] = []
    for run_lock in run_locks(manifest):
        if not store.try_lock(run_lock.key):
            unlock(store, held)
            where = store.describe()
            store.close()
            raise RunFailed(
                f"another run holds {run_lock.holder} (its lock is held in the state store {where}); runs that "
                "share it never overlap — wait for that run to finish"
            )
        held.append(run_lock)
    return held


def unlock(store: StateStore, locks: list[RunLock]) -> None:
    for run_lock in reversed(locks):
        store.unlock(run_lock.key)


def export_metrics(manifest: Manifest, result: RunResult, log: Log) -> None:
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


def write_artifacts(manifest: Manifest, result: RunResult, log: Log) -> None:
    """run.json, plan.md and metrics.json under observability.artifacts.path (when enabled)."""
    artifacts = manifest.observability.artifacts
    if not artifacts.enabled:
        return
    from dpone_dagster.engine.plan import build_plan, render_markdown
    from dpone_dagster.observability.artifacts import build_metrics, write_metrics, write_run_artifact

    try:
        plan = render_markdown(build_plan(manifest, probe=False))
        run_dir = write_run_artifact(artifacts.path, result.as_dict(), plan, result.gates)
        write_metrics(
            artifacts.path,
            result.run_id,
            build_metrics(result.as_dict(), result.lag_before, result.lag_after),
        )
        log(f"artifacts: {run_dir}")
    except Exception as exc:  # noqa: BLE001 - an artifact never turns a delivered run into a failed one
        # Written after the commit: the data and offsets are already safe; say so, loudly.
        note = f"artifacts: could not be written to {artifacts.path} ({redact_text(str(exc))}); the run's data and offsets are unaffected"
        result.notes.append(note)
        log(note)


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
