"""Per-run artifacts: `<base>/<run_id>/run.json`, `plan.md` and `metrics.json`.

- run.json: what the run did (pipeline, status, times, per-stage timings, boundary per partition,
  counts, bytes, gate results, schema evolution actions when the engine reports them, errors). Any key
  of the engine's result this module does not know is kept under `extra`, so nothing is lost.
- plan.md: the rendered plan (`engine.plan.render_markdown`) the run executed.
- metrics.json: numbers only (rows, messages, bytes, seconds per stage, throughput, lag before/after)
  for scraping; `build_metrics` derives it from a RunResult dict.

Every file is written atomically (a temp file in the same directory, fsync, os.replace), and the text
of run.json and plan.md passes through `redact.redact_text` (run.json: every string before
serialization and the serialized text after), so a secret that reached an error text, a note, a failing
sample or the plan is masked wherever it appears. plan.md is
written before run.json: a directory with run.json is a complete artifact (`list_runs` only lists
those).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpone_dagster.errors import ConfigError
from dpone_dagster.quality.results import json_safe
from dpone_dagster.redact import redact_text
from dpone_dagster.state.local import atomic_write_text

__all__ = [
    "ARTIFACT_VERSION",
    "METRICS_FILE",
    "PLAN_FILE",
    "RUN_FILE",
    "build_metrics",
    "list_runs",
    "run_record",
    "show_run",
    "write_metrics",
    "write_run_artifact",
]

ARTIFACT_VERSION = 1
RUN_FILE = "run.json"
PLAN_FILE = "plan.md"
METRICS_FILE = "metrics.json"
COUNT_KEYS = (
    "rows_extracted",
    "messages_produced",
    "tombstones",
    "deletes_skipped",
    "duplicates_removed",
    "rows_dead_lettered",
    "rows_skipped",
)
# RunResult.as_dict() keys run_record places itself; anything else goes under "extra".
_KNOWN_KEYS = {
    *COUNT_KEYS,
    "run_id",
    "pipeline",
    "name",
    "status",
    "execution_path",
    "started_at",
    "finished_at",
    "timings",
    "boundary",
    "offset_ranges",
    "bytes_produced",
    "committed_offsets",
    "sink_partitions",
    "notes",
    "executors",
    "error",
    "errors",
    "schema_evolution",
    "gates",  # passed separately as gate results
    "lag_before",
    "lag_after",
}
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]+")


# --------------------------------------------------------------------------- run.json / plan.md


def run_record(result: Mapping[str, Any], gates: Sequence[Any] = ()) -> dict[str, Any]:
    """The JSON document of run.json for a RunResult dict (`RunResult.as_dict()`) and gate results
    (CheckResult objects or their `as_dict()`); the engine may add started_at, finished_at,
    schema_evolution and errors to the dict."""
    errors = [str(e) for e in (result.get("errors") or [])]
    if result.get("error") and str(result["error"]) not in errors:
        errors.insert(0, str(result["error"]))
    record: dict[str, Any] = {
        "artifact_version": ARTIFACT_VERSION,
        "pipeline": result.get("pipeline") or result.get("name"),
        "run_id": str(result["run_id"]),
        "status": result.get("status"),
        "execution_path": result.get("execution_path") or None,
        "started_at": result.get("started_at"),
        "finished_at": result.get("finished_at"),
        "written_at": datetime.now(UTC).isoformat(),
        "timings": dict(result.get("timings") or {}),
        "boundary": _boundary(result.get("boundary") or {}),
        "counts": {key: result.get(key, 0) for key in COUNT_KEYS},
        "bytes": {"produced": result.get("bytes_produced", 0)},
        "committed_offsets": dict(result.get("committed_offsets") or {}),
        "sink_partitions": list(result.get("sink_partitions") or []),
        "gates": [g.as_dict() if hasattr(g, "as_dict") else dict(g) for g in gates],
        "errors": errors,
        "notes": list(result.get("notes") or []),
        "executors": list(result.get("executors") or []),
        "lag": {"before": result.get("lag_before"), "after": result.get("lag_after")},
    }
    if result.get("schema_evolution") is not None:
        record["schema_evolution"] = result["schema_evolution"]
    extra = {k: v for k, v in result.items() if k not in _KNOWN_KEYS}
    if extra:
        record["extra"] = extra
    return json_safe(record)


def _boundary(boundary: Mapping[str, Any]) -> dict[str, Any]:
    partitions = []
    for p in boundary.get("partitions") or []:
        entry = dict(p)
        if isinstance(p.get("start"), int) and isinstance(p.get("end"), int):
            entry["offsets"] = p["end"] - p["start"]
        partitions.append(entry)
    return {**boundary, "partitions": partitions}


def write_run_artifact(
    base_path: str | os.PathLike[str],
    result: Mapping[str, Any],
    plan_markdown: str,
    gates: Sequence[Any],
) -> Path:
    """Write `<base>/<run_id>/plan.md` then `run.json` (atomically, secrets redacted); returns the
    run's directory. Writing again for the same run_id replaces both files."""
    # Strings are scrubbed before serializing too: JSON escaping would hide a secret holding '"' or '\\'.
    record = _redact_tree(run_record(result, gates))
    run_dir = _run_dir(base_path, record["run_id"])
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / PLAN_FILE, redact_text(plan_markdown))
    text = json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    atomic_write_text(run_dir / RUN_FILE, redact_text(text))
    return run_dir


def _redact_tree(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {_redact_tree(k): _redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v) for v in value]
    return value


# --------------------------------------------------------------------------- metrics.json


def build_metrics(
    result: Mapping[str, Any],
    lag_before: int | Mapping[Any, int] | None = None,
    lag_after: int | Mapping[Any, int] | None = None,
) -> dict[str, Any]:
    """Numeric metrics of a RunResult dict: rows, messages, bytes, tombstones, seconds per stage and
    in total, throughput (messages and bytes per second of the load stage, or of the whole run when
    there is no load timing) and the source lag before/after (a total or a per-partition mapping;
    omitted when not measured)."""
    timings = {str(k): float(v) for k, v in (result.get("timings") or {}).items()}
    total = round(sum(timings.values()), 3)
    messages = int(result.get("messages_produced", 0) or 0)
    nbytes = int(result.get("bytes_produced", 0) or 0)
    seconds = timings.get("load") or total
    metrics: dict[str, Any] = {
        "rows": int(result.get("rows_extracted", 0) or 0),
        "messages": messages,
        "bytes": nbytes,
        "tombstones": int(result.get("tombstones", 0) or 0),
        "duplicates_removed": int(result.get("duplicates_removed", 0) or 0),
        "deletes_skipped": int(result.get("deletes_skipped", 0) or 0),
        "stage_seconds": timings,
        "total_seconds": total,
        "throughput_msgs_per_s": round(messages / seconds, 3) if seconds > 0 else 0.0,
        "throughput_bytes_per_s": round(nbytes / seconds, 3) if seconds > 0 else 0.0,
    }
    for key, lag in (("lag_before", lag_before), ("lag_after", lag_after)):
        if lag is not None:
            metrics[key] = {str(p): int(v) for p, v in lag.items()} if isinstance(lag, Mapping) else int(lag)
    return metrics


def write_metrics(base_path: str | os.PathLike[str], run_id: str, metrics: Mapping[str, Any]) -> Path:
    """Write `<base>/<run_id>/metrics.json` atomically; every leaf must be a finite number (nested
    mappings allowed, e.g. stage_seconds or per-partition lag). Returns the file's path."""
    _require_numeric(metrics, "metrics")
    run_dir = _run_dir(base_path, run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / METRICS_FILE
    atomic_write_text(path, json.dumps(_string_keys(metrics), indent=2, sort_keys=True) + "\n")
    return path


def _require_numeric(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _require_numeric(item, f"{where}.{key}")
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} is {value!r}; metrics.json holds finite numbers only")


def _string_keys(value: Any) -> Any:
    return {str(k): _string_keys(v) for k, v in value.items()} if isinstance(value, Mapping) else value


# --------------------------------------------------------------------------- reading


def list_runs(base_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Summaries of every run artifact under `base_path`, newest first (by started_at, else
    written_at, else run.json's modification time): run_id, status, pipeline, started_at,
    finished_at, rows, messages. An unreadable run.json is listed with status 'unreadable'."""
    base = Path(base_path)
    if not base.is_dir():
        return []
    entries: list[tuple[float, str, dict[str, Any]]] = []
    for run_file in base.glob(f"*/{RUN_FILE}"):
        run_id = run_file.parent.name
        try:
            data = json.loads(run_file.read_text())
            counts = data.get("counts") or {}
            summary = {
                "run_id": data.get("run_id", run_id),
                "status": data.get("status"),
                "pipeline": data.get("pipeline"),
                "started_at": data.get("started_at"),
                "finished_at": data.get("finished_at"),
                "rows": counts.get("rows_extracted"),
                "messages": counts.get("messages_produced"),
            }
            when = _timestamp(data.get("started_at")) or _timestamp(data.get("written_at"))
        except (OSError, ValueError, AttributeError):
            summary = {
                "run_id": run_id,
                "status": "unreadable",
                "pipeline": None,
                "started_at": None,
                "finished_at": None,
                "rows": None,
                "messages": None,
            }
            when = None
        if when is None:
            when = run_file.stat().st_mtime
        entries.append((when, run_id, summary))
    entries.sort(key=lambda e: (e[0], e[1]), reverse=True)
    return [summary for _, _, summary in entries]


def show_run(base_path: str | os.PathLike[str], run_id: str) -> dict[str, Any]:
    """run.json of `run_id` (with the run's metrics under `metrics` when metrics.json exists);
    ConfigError naming the available run ids when there is no such artifact."""
    run_dir = _run_dir(base_path, run_id)
    run_file = run_dir / RUN_FILE
    if not run_file.is_file():
        available = [r["run_id"] for r in list_runs(base_path)]
        shown = ", ".join(available[:20]) + (
            f" (and {len(available) - 20} more)" if len(available) > 20 else ""
        )
        raise ConfigError(
            f"no run artifact '{run_id}' under {Path(base_path)}; "
            + (f"available run ids (newest first): {shown}" if available else "no runs are recorded there")
        )
    try:
        data = json.loads(run_file.read_text())
        metrics_file = run_dir / METRICS_FILE
        if metrics_file.is_file():
            data["metrics"] = json.loads(metrics_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run artifact {run_file} cannot be read: {exc}") from None
    return data


# --------------------------------------------------------------------------- helpers


def _run_dir(base_path: str | os.PathLike[str], run_id: str) -> Path:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ConfigError(
            f"run id {run_id!r} cannot name an artifact directory (letters, digits, '_', '.' and '-' only)"
        )
    return Path(base_path) / run_id


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


