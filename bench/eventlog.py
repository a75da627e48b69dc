"""Summarize a Spark event log: per job and stage, wall time, tasks, executor run/CPU time,
shuffle and spill — where a run's time goes on the JVM side.

Enable the log for a benchmark run with
    --spark-conf spark.eventLog.enabled=true --spark-conf spark.eventLog.dir=file:///tmp/spark-events
(zstd-compressed logs need the `zstd` command; or add --spark-conf spark.eventLog.compress=false)
then
    python -m bench.eventlog /tmp/spark-events/<app id>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _acc(info: dict[str, Any]) -> dict[str, Any]:
    return {a.get("Name"): a.get("Value") for a in info.get("Accumulables", []) if a.get("Name")}


def _read(path: Path) -> str:
    if path.suffix == ".zstd":  # Spark 4 compresses event logs with zstd by default
        import subprocess

        return subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout.decode()
    return path.read_text()


def summarize(path: str | Path) -> dict[str, Any]:
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    path = Path(path)
    files = sorted(path.glob("events_*")) if path.is_dir() else [path]  # rolling logs (eventlog_v2_*)
    lines = [line for f in files for line in _read(f).splitlines()]
    for line in lines:
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            job = {
                "job": event["Job ID"],
                "start_ms": event["Submission Time"],
                "callsite": props.get("callSite.short") or "",
                "stages": event.get("Stage IDs", []),
            }
            jobs[event["Job ID"]] = job
            for sid in job["stages"]:
                stage_job[sid] = event["Job ID"]
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["end_ms"] = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            acc = _acc(info)
            stages[info["Stage ID"]] = {
                "stage": info["Stage ID"],
                "job": stage_job.get(info["Stage ID"]),
                "name": info.get("Stage Name", ""),
                "tasks": info.get("Number of Tasks"),
                "wall_s": round((info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1000, 3),
                "run_s": round((acc.get("internal.metrics.executorRunTime") or 0) / 1000, 3),
                "cpu_s": round((acc.get("internal.metrics.executorCpuTime") or 0) / 1e9, 3),
                "gc_s": round((acc.get("internal.metrics.jvmGCTime") or 0) / 1000, 3),
                "shuffle_write_mb": round((acc.get("internal.metrics.shuffle.write.bytesWritten") or 0) / 2**20, 1),
                "shuffle_read_mb": round(
                    ((acc.get("internal.metrics.shuffle.read.remoteBytesRead") or 0) + (acc.get("internal.metrics.shuffle.read.localBytesRead") or 0))
                    / 2**20,
                    1,
                ),
                "spill_mb": round((acc.get("internal.metrics.diskBytesSpilled") or 0) / 2**20, 1),
                "records_in": acc.get("internal.metrics.input.recordsRead"),
                "records_out": acc.get("internal.metrics.shuffle.write.recordsWritten"),
                "peak_exec_mem_mb": round((acc.get("internal.metrics.peakExecutionMemory") or 0) / 2**20, 1),
            }
    out_jobs = []
    for job in sorted(jobs.values(), key=lambda j: j["job"]):
        job_stages = [stages[s] for s in job["stages"] if s in stages]
        out_jobs.append(
            {
                "job": job["job"],
                "callsite": job["callsite"],
                "wall_s": round((job.get("end_ms", job["start_ms"]) - job["start_ms"]) / 1000, 3),
                "stages": job_stages,
            }
        )
    return {"jobs": out_jobs}


def print_summary(summary: dict[str, Any], out: Any = sys.stdout) -> None:
    for job in summary["jobs"]:
        out.write(f"job {job['job']:>3} {job['wall_s']:>8.2f}s  {job['callsite']}\n")
        for s in job["stages"]:
            out.write(
                f"    stage {s['stage']:>3} {s['wall_s']:>7.2f}s tasks={s['tasks']:<4} run={s['run_s']:.1f}s cpu={s['cpu_s']:.1f}s "
                f"gc={s['gc_s']:.1f}s shW={s['shuffle_write_mb']}MB shR={s['shuffle_read_mb']}MB spill={s['spill_mb']}MB  {s['name'][:60]}\n"
            )


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print_summary(summarize(p))
