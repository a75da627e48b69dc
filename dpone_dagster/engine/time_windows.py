"""Time-window runs: the windows' recorded offset ranges, and the late-record policy.

Late records are records whose timestamp is before the start of the window whose offsets hold
them (kafka/windows.py). `source.options.partitions.late_records`:
- next_window (default): they are delivered with that window and counted as `late_records`;
- fail: the run fails before anything is read or produced, and no state moves.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.boundary import Boundary
from dpone_dagster.kafka.windows import Recorded
from dpone_dagster.manifest.models import KafkaSource, Manifest, TimeWindowPartitions
from dpone_dagster.sources.kafka import KafkaBatchSource, Log, default_group_id
from dpone_dagster.state.base import StateStore


def is_time_window(manifest: Manifest) -> bool:
    source = manifest.source
    return isinstance(source, KafkaSource) and source.options.read_mode == "time_window"


def load_recorded(manifest: Manifest, store: StateStore) -> Recorded:
    """The offset ranges earlier runs of the manifest's windows recorded ({} for other reads)."""
    load = getattr(store, "load_windows", None)  # the replication control topic records no windows
    if not is_time_window(manifest) or load is None:
        return {}
    return load(manifest.source.topic, default_group_id(manifest))


class LateRecordScreen:
    """The source, with the late-record policy applied before the extract: the counts land in the
    run's boundary (`late_records`, and per window), which the state and Dagster record."""

    def __init__(self, source: KafkaBatchSource, result: RunResult):
        self.source = source
        self.result = result
        settings = source.options.partitions or TimeWindowPartitions()
        self.policy = settings.late_records

    def extract(self, spark: SparkSession, boundary: Boundary, log: Log) -> Any:
        late = self.source.late_records(spark, boundary)
        total = sum(late.values())
        self.result.boundary["late_records"] = total
        for window in self.result.boundary.get("windows", []):
            window["late_records"] = late.get(window["start"], 0)
        if total:
            where = {w: n for w, n in late.items() if n}
            if self.policy == "fail":
                raise RunFailed(
                    f"{total} late record(s) (timestamp before the start of the window holding them: {where}); "
                    "nothing was produced. Set source.options.partitions.late_records: next_window to deliver "
                    "them with that window, or raise allowed_lateness_seconds"
                )
            self.result.notes.append(f"{total} late record(s) delivered with the window holding them: {where}")
            log(f"extract: {self.result.notes[-1]}")
        return self.source.extract(spark, boundary, log)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)  # widen, plan, ...: the source's own
