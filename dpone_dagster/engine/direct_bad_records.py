"""The records a direct-path scan set aside (undecodable, without their unique key, over
message.max.bytes), judged on the driver where and as the Spark SQL path judges them.

The tasks report where those records are, not the records: the driver reads them again in Spark
(only the slices that hold them, in one bounded job, kept for the judging and the dead letters), as
the Spark SQL path reads its dead letters from its batch. A record gone from the topic since the
scan (deleted, or compacted away) fails the run before anything is produced."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.direct import spark_rows, task
from dpone_dagster.direct.spark_rows import SparkRows
from dpone_dagster.engine import bad_records
from dpone_dagster.engine.bad_records import handle_bad_records
from dpone_dagster.engine.direct_attempt import DecodedBySpark, ScanAgain, ToSparkSql
from dpone_dagster.engine.direct_keys import CONNECT_CANDIDATES, by_partition
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.time_windows import LateRecordScreen
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.boundary import split_into_tasks
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sinks.dead_letters import DeadLetters
from dpone_dagster.sources.kafka import KafkaBatchSource
from dpone_dagster.sources.kafka_reader import read_ranges
from dpone_dagster.spark.decode import decode_json
from dpone_dagster.spark.jobs import BoundedJobs
from dpone_dagster.spark.keep import keep_batch, release_batch
from dpone_dagster.spark.session import is_connect


def batch_source(planned: PlannedRead) -> KafkaBatchSource | None:
    """The read's Kafka source, also behind the late-record screen of a time-window read."""
    source = planned.source.source if isinstance(planned.source, LateRecordScreen) else planned.source
    return source if isinstance(source, KafkaBatchSource) else None


class BadRecords:
    """The records the tasks set aside (direct/task.SET_ASIDE_KEPT), judged where the Spark SQL
    path judges them and by its rules (engine/bad_records.py): undecodable ones with the extract,
    JSON ones by Spark's own decoder (a record it reads widens the schema where it holds fields
    beyond it, or is decoded by Spark for the tasks), registry-framed ones with
    the reasons of the tasks' decoder, which is the Spark SQL path's; upserts without their unique key after the extracted
    gates; messages over message.max.bytes after the published gates. Each follows
    source.options.on_error: fail raises before anything is produced, dead letters are sent once
    every gate passed."""

    def __init__(
        self, manifest: Manifest, spark: SparkSession, planned: PlannedRead, reports: list[task.ScanReport], sink_config: dict, jobs: BoundedJobs, seconds: float
    ):
        """`jobs`, `seconds`: the run's bounded jobs and the bound of reading the batch."""
        tables = [r.set_aside for r in reports if r.set_aside is not None and r.set_aside.num_rows]
        self.manifest, self.spark, self.planned = manifest, spark, planned
        self.aside = pa.concat_tables(tables) if tables else None
        self.letters: DeadLetters | None = None
        self.raw: DataFrame | None = None  # the records set aside, read again (kept until `release`)
        if self.aside is not None and is_connect(spark) and self.aside.num_rows > CONNECT_CANDIDATES:
            raise ToSparkSql(f"more than {CONNECT_CANDIDATES:,} bad records (Spark Connect: their offsets would travel in the produce jobs' plans)")
        if self.aside is not None:
            self.raw = keep_batch(_read_again(spark, planned, self.aside))
            try:
                found = jobs.run(self.raw.count, seconds, "reading the batch's bad records again")
            except BaseException:
                self.release()  # the caller never holds what failed to be made
                raise
            if found != self.aside.num_rows:
                self.release()
                raise RunFailed(
                    f"{self.aside.num_rows - found} of the {self.aside.num_rows} bad record(s) the scan set aside are no longer in "
                    f"{planned.label} (deleted or compacted since); nothing was produced and no state moved: run again"
                )
            self.letters = DeadLetters(manifest, self.raw, sink_config)
        self.left_out = 0  # records judged so far (left out of the messages)

    def release(self) -> None:
        """Free the records read again (once the dead letters are sent, or the run has failed)."""
        if self.raw is not None:
            release_batch(self.raw)
            self.raw = None

    def count(self, kind: str) -> int:
        return 0 if self.aside is None else int(pc.sum(pc.equal(self.aside["kind"], kind)).as_py() or 0)

    def positions(self, kind: str | None = None) -> dict[int, np.ndarray]:
        """The source offsets of one kind (None: every kind), per partition (sorted)."""
        if self.aside is None or (kind is not None and not self.count(kind)):
            return {}
        picked = self.aside if kind is None else self.aside.filter(pc.equal(self.aside["kind"], kind))
        return by_partition(picked)

    def oversized_candidates(self) -> pa.Table:
        """The messages over message.max.bytes with a key, as the driver settles repeated keys
        (task.CANDIDATES): judged only if settling keeps them (`settled`)."""
        if not self.count("oversized"):
            return task.CANDIDATES.empty_table()
        picked = self.aside.filter(pc.and_(pc.equal(self.aside["kind"], "oversized"), self.aside["message_key"].is_valid()))
        return picked.select(["message_key", "offset", "timestamp", "partition"]).rename_columns(task.CANDIDATES.names).cast(task.CANDIDATES)

    def settled(self, left_out: dict[int, np.ndarray]) -> None:
        """Forget the records keep_last / keep_first leave out (`left_out`, per partition): a
        message they leave out is no bad record, as on the Spark SQL path, which measures the kept."""
        if self.aside is None or not left_out:
            return
        partitions, offsets = self.aside["partition"].to_numpy(), self.aside["offset"].to_numpy()
        dropped = np.zeros(len(offsets), bool)
        for partition, losers in left_out.items():
            mine = partitions == partition
            dropped[mine] = np.isin(offsets[mine], losers)
        self.aside = self.aside.filter(pa.array(~dropped))

    def judge_undecodable(self, result: RunResult, schema: pa.Schema) -> None:
        """Undecodable records as the Spark SQL path judges them. A JSON one Spark's decoder reads
        is no bad record: fields beyond an inferred schema widen it (ScanAgain), other values are
        decoded by Spark for the tasks (DecodedBySpark, in the tasks' payload `schema`)."""
        n = self.count("undecodable")
        if not n:
            return
        source = batch_source(self.planned)
        assert source is not None and self.letters is not None and self.letters.raw is not None
        what = f"record(s) of {self.planned.label} could not be decoded"
        if source.options.message_format != "json":  # the tasks' decoder is the Spark SQL path's, with its reasons
            self._handle(self._of("undecodable", with_reason=True), n, result, what)
            return
        plan = source.json_plan(self.planned.boundary)
        envelope = "auto" if source.options.envelope == "auto" else plan.envelope
        undecodable = self.letters.raw.join(self._of("undecodable"), on=["partition", "offset"], how="left_semi")
        # As the Spark SQL path looks for fields beyond an inferred schema (once: not past a widening).
        detect = source.options.schema_ is None and not plan.widened
        decoded = decode_json(undecodable, plan.schema, envelope, detect_unknown=detect)
        if detect and decoded.where(F.col(C.UNKNOWN_KEYS).isNotNull()).limit(1).count():  # widened there, corrupt record or not
            raise ScanAgain(source.widen_plan(self.planned.boundary, decoded).notes[-1])
        readable = _spark_rows(decoded.where(F.col(C.CORRUPT).isNull()), schema)  # one decode, not a count first
        if readable.table.num_rows:
            raise DecodedBySpark(readable)
        bad = decoded.select(F.col(C.SOURCE_PARTITION).alias("partition"), F.col(C.SOURCE_OFFSET).alias("offset"), F.col(C.CORRUPT).alias("reason"))
        self._handle(bad, n, result, what)

    def judge_keyless(self, result: RunResult) -> None:
        n = self.count("keyless")
        if n:
            reason = f"missing unique key {list(self.manifest.sink.strategy.unique_key_columns)}"
            self._handle(self._of("keyless").withColumn("reason", F.lit(reason)), n, result, bad_records.KEYLESS)

    def judge_oversized(self, result: RunResult, limit: int) -> None:
        n = self.count("oversized")
        if n:
            reason = F.concat(F.lit("message of "), F.col("size").cast("string"), F.lit(f" bytes exceeds message.max.bytes {limit}"))
            bad = self._of("oversized", with_size=True).select("partition", "offset", reason.alias("reason"))
            self._handle(bad, n, result, bad_records.oversized(limit))

    def _of(self, kind: str, with_size: bool = False, with_reason: bool = False) -> Any:
        assert self.aside is not None
        picked = self.aside.filter(pc.equal(self.aside["kind"], kind)).select(["partition", "offset", "size", "reason"])
        frame = self.spark.createDataFrame(picked.cast(_WHERE_SCHEMA))  # from Arrow: a million rows in seconds
        return frame.drop(*(["size"] if not with_size else []), *(["reason"] if not with_reason else []))

    def _handle(self, bad: Any, n: int, result: RunResult, what: str) -> None:
        assert self.letters is not None
        handle_bad_records(self.manifest, bad, n, self.letters, result, what)
        self.left_out += n


_POSITIONS = pa.schema([("partition", pa.int32()), ("offset", pa.int64())])
_WHERE_SCHEMA = pa.schema([*_POSITIONS, ("size", pa.int64()), ("reason", pa.string())])


def _read_again(spark: SparkSession, planned: PlannedRead, aside: pa.Table) -> DataFrame:
    """The raw records at the positions of `aside`, read again from the slices of the batch that
    hold them (lazy: computed by the first pass that reads it)."""
    source = batch_source(planned)
    assert source is not None
    where = by_partition(aside)
    holding = [
        t for t in split_into_tasks(planned.boundary, source.options.records_per_task)
        if t.partition in where and np.searchsorted(where[t.partition], t.start) < np.searchsorted(where[t.partition], t.end)
    ]
    positions = spark.createDataFrame(aside.select(_POSITIONS.names).cast(_POSITIONS))
    return read_ranges(spark, holding, source.reader_settings()).join(positions, on=["partition", "offset"], how="left_semi")


def _spark_rows(decoded: DataFrame, schema: pa.Schema) -> SparkRows:
    """The rows of `decoded` (decode_json's form) for the tasks: position, delete, payload."""
    position = [
        F.col(C.SOURCE_PARTITION).alias(spark_rows.PARTITION),
        F.col(C.SOURCE_OFFSET).alias(spark_rows.OFFSET),
        (F.col(C.OP) == F.lit(C.DELETE)).alias(spark_rows.IS_DELETE),
    ]
    # One row past the most that travel to the tasks is enough to refuse them (direct.copy).
    table = decoded.select(*position, *[decoded[name] for name in schema.names]).limit(spark_rows.MAX_ROWS + 1).toArrow()
    return SparkRows.of(table.select(spark_rows.POSITION.names), table, schema)
