"""Time-window runs: the windows' recorded offset ranges, and the late-record policy.

Late records are records whose timestamp is before the start of the window whose offsets hold
them (kafka/windows.py). `source.options.partitions.late_records`:
- next_window (default): they are delivered with that window and counted as `late_records`;
- dead_letter: they are counted, left out of the sink batch and sent to
  `source.options.dead_letter.topic` with the run's output: after the pre-publish gates passed and
  the sink acknowledged its messages, before the state advances (a failure there fails the run);
- fail: the run fails before anything is produced, and no state moves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused
from dpone_dagster.kafka.admin import ensure_sink_topic
from dpone_dagster.kafka.boundary import Boundary
from dpone_dagster.kafka.windows import Recorded
from dpone_dagster.manifest.models import KafkaSource, Manifest, TimeWindowPartitions, TopicCreation
from dpone_dagster.sinks.dead_letters import DeadLetters
from dpone_dagster.sources.kafka import ExtractResult, KafkaBatchSource, Log, default_group_id, late_window
from dpone_dagster.state.base import StateStore


def is_time_window(manifest: Manifest) -> bool:
    source = manifest.source
    return isinstance(source, KafkaSource) and source.options.read_mode == "time_window"


def load_recorded(manifest: Manifest, store: StateStore) -> Recorded:
    """The offset ranges earlier runs of the manifest's windows recorded ({} for other reads)."""
    if not is_time_window(manifest):
        return {}
    return store.load_windows(manifest.source.topic, default_group_id(manifest))


def judge_late_records(policy: str, late: dict[str, int], result: RunResult, log: Log) -> int:
    """Record the late records counted per window (start, ISO 8601) in the run's boundary, and
    apply the policy before anything is produced: `fail` raises, `next_window` notes them;
    `dead_letter` is left to the caller, which holds them back. Returns how many there are."""
    total = sum(late.values())
    result.boundary["late_records"] = total
    for window in result.boundary.get("windows", []):
        window["late_records"] = late.get(window["start"], 0)
    if not total:
        return 0
    where = {w: n for w, n in late.items() if n}
    if policy == "fail":
        raise DataRefused(
            f"{total} late record(s) (timestamp before the start of the window holding them: {where}); "
            "nothing was produced. Set source.options.partitions.late_records: next_window to deliver "
            "them with that window (or dead_letter), or raise allowed_lateness_seconds"
        )
    if policy == "next_window":
        result.notes.append(f"{total} late record(s) delivered with the window holding them: {where}")
        log(f"extract: {result.notes[-1]}")
    return total


class LateRecordScreen:
    """The source, with the late-record policy applied before the extract: the counts land in the
    run's boundary (`late_records`, and per window), which the state and Dagster record."""

    def __init__(self, source: KafkaBatchSource, result: RunResult, sink_config: dict[str, Any]):
        self.source = source
        self.result = result
        self.sink_config = sink_config
        settings = source.options.partitions or TimeWindowPartitions()
        self.policy = settings.late_records
        self._letters: tuple[DataFrame, DataFrame, int] | None = None  # (raw, bad, count) to dead-letter

    def extract(self, spark: SparkSession, boundary: Boundary, log: Log) -> Any:
        late = self.source.late_records(spark, boundary)
        total = judge_late_records(self.policy, late, self.result, log)
        if total and self.policy == "dead_letter":
            return self._hold_back(spark, boundary, total, {w: n for w, n in late.items() if n}, log)
        return self.source.extract(spark, boundary, log)

    def widen(self, spark: SparkSession, boundary: Boundary, extracted: ExtractResult, staged: DataFrame, log: Log) -> ExtractResult:
        widened = self.source.widen(spark, boundary, extracted, staged, log)
        return _without_late(widened, boundary) if self._letters is not None else widened

    def send_dead_letters(self) -> None:
        """Produce the held-back late records (dead_letter); call once the sink succeeded and
        before the state advances."""
        if self._letters is None:
            return
        raw, bad, count = self._letters
        letters = DeadLetters(self.source.manifest, raw, self.sink_config)
        letters.add(bad, count)
        letters.publish(self.result)
        self.result.notes.append(f"{count} late record(s) sent to {self.source.options.dead_letter.topic}")

    def _hold_back(self, spark: SparkSession, boundary: Boundary, total: int, where: dict[str, int], log: Log) -> ExtractResult:
        self.hold_back(spark, boundary, total, where, log)
        return _without_late(self.source.extract(spark, boundary, log), boundary)

    def hold_back(self, spark: SparkSession, boundary: Boundary, total: int, where: dict[str, int], log: Log) -> None:
        """Hold the `total` late records of `boundary` back for the dead-letter topic (sent by
        send_dead_letters, with their reason); the caller leaves them out of the batch."""
        options = self.source.options.dead_letter
        assert options is not None  # the manifest validation asks for it
        # The topic is checked (or created) before anything is produced: a missing dead-letter
        # topic fails the run here, not after the sink received the batch.
        ensure_sink_topic(self.sink_config, options.topic, TopicCreation(enabled=options.create, partitions=options.partitions))
        raw = self.source.raw_records(spark, boundary)
        window = late_window(boundary, F.col("partition"), F.col("offset"), F.col("timestamp"))
        assert window is not None
        starts = F.array(*(F.lit(w["start"]) for w in boundary.windows))
        bad = raw.where(window.isNotNull()).select(
            "partition",
            "offset",
            F.concat(
                F.lit("late record: timestamp "),
                F.date_format(F.timestamp_millis("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"),
                F.lit(" is before the start of the window holding it ("),
                F.element_at(starts, window + 1),
                F.lit(")"),
            ).alias("reason"),
        )
        self._letters = (raw, bad, total)
        self.result.notes.append(f"{total} late record(s) held back for {options.topic}: {where}")
        log(f"extract: {self.result.notes[-1]}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)  # plan, sample_values, ...: the source's own


def _without_late(extracted: ExtractResult, boundary: Boundary) -> ExtractResult:
    """The batch without its late records (the decoded frame, not the read tasks' output)."""
    late = late_window(boundary, F.col(C.SOURCE_PARTITION), F.col(C.SOURCE_OFFSET), F.unix_millis(F.col(C.SOURCE_TIMESTAMP)))
    if late is None:
        return extracted
    return replace(extracted, build=lambda: extracted.df.where(late.isNull()), records=None, decode_kept=None)
