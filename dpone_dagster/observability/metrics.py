"""Prometheus metrics of a run, for a node-exporter textfile collector and/or a Pushgateway.

A batch run is not scraped while it runs, so every figure is a gauge of the pipeline's latest
run (label `pipeline`), plus the time of its latest success, which a failed run leaves as it was:
alert on `time() - dpone_last_success_timestamp_seconds` to catch a pipeline that stopped
delivering, whatever the reason.

- textfile: written atomically (node-exporter must never read half a file); the previous file's
  last-success time is carried over when this run failed.
- Pushgateway: pushed under the grouping key {job, pipeline}; a failed run replaces only the
  metrics it sends (`pushadd`), so the last-success gauge stays from the last good run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest, pushadd_to_gateway
from prometheus_client.parser import text_string_to_metric_families

from dpone_dagster.engine.results import RunResult
from dpone_dagster.manifest.models import MetricsConfig
from dpone_dagster.state.local import atomic_write_text

# name -> (help, value from the run); a value of None leaves the series out.
RUN_GAUGES: dict[str, tuple[str, Callable[[RunResult], float | None]]] = {
    "dpone_last_run_records_read": ("Source records the latest run read", lambda r: r.rows_extracted),
    "dpone_last_run_messages_produced": ("Messages the latest run delivered to the sink", lambda r: r.messages_produced),
    "dpone_last_run_records_dead_lettered": ("Records the latest run sent to the dead-letter topic", lambda r: r.rows_dead_lettered),
    "dpone_last_run_produced_bytes": ("Key and value bytes the latest run delivered", lambda r: r.bytes_produced),
    "dpone_last_run_duration_seconds": ("Wall seconds of the latest run's stages", lambda r: sum(r.timings.values())),
    "dpone_last_run_lag_messages": ("Source messages still waiting after the latest run", lambda r: r.lag_after),
    "dpone_last_run_success": ("1 if the latest run succeeded, else 0", lambda r: 1.0 if r.ok else 0.0),
}
STAGE_GAUGE = "dpone_last_run_stage_duration_seconds"
RUN_TIMESTAMP = "dpone_last_run_timestamp_seconds"
SUCCESS_TIMESTAMP = "dpone_last_success_timestamp_seconds"


def run_registry(result: RunResult, finished_at: float, last_success: float | None) -> CollectorRegistry:
    """The run's metrics; `last_success` is the success time to report (this run's when it
    succeeded, else the one already published, or none)."""
    registry = CollectorRegistry()
    for name, (help_text, value_of) in RUN_GAUGES.items():
        value = value_of(result)
        if value is not None:
            Gauge(name, help_text, ["pipeline"], registry=registry).labels(result.pipeline).set(value)
    stages = Gauge(STAGE_GAUGE, "Wall seconds of each stage of the latest run", ["pipeline", "stage"], registry=registry)
    for stage, seconds in result.timings.items():
        stages.labels(result.pipeline, stage).set(seconds)
    Gauge(RUN_TIMESTAMP, "Unix time the latest run ended", ["pipeline"], registry=registry).labels(result.pipeline).set(finished_at)
    if last_success is not None:
        Gauge(SUCCESS_TIMESTAMP, "Unix time the latest successful run ended", ["pipeline"], registry=registry).labels(
            result.pipeline
        ).set(last_success)
    return registry


def published_success_time(text: str, pipeline: str) -> float | None:
    """The last-success time a previous textfile holds for `pipeline`, if any."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SUCCESS_TIMESTAMP and sample.labels.get("pipeline") == pipeline:
                return sample.value
    return None


def textfile_path(config: MetricsConfig, pipeline: str) -> Path | None:
    return Path(config.textfile_dir) / f"dpone_{pipeline}.prom" if config.textfile_dir else None


def export_run_metrics(config: MetricsConfig, result: RunResult, finished_at: float) -> list[str]:
    """Write/push the run's metrics where the manifest says; returns where they went."""
    written: list[str] = []
    path = textfile_path(config, result.pipeline)
    if path is not None:
        previous = published_success_time(path.read_text(), result.pipeline) if path.exists() else None
        registry = run_registry(result, finished_at, finished_at if result.ok else previous)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, generate_latest(registry).decode())
        written.append(str(path))
    if config.pushgateway_url:
        registry = run_registry(result, finished_at, finished_at if result.ok else None)
        pushadd_to_gateway(
            config.pushgateway_url,
            job=config.job,
            registry=registry,
            grouping_key={"pipeline": result.pipeline},
            timeout=config.push_timeout_seconds,
        )
        written.append("pushgateway")  # the URL may carry credentials
    return written
