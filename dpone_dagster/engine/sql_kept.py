"""Where the direct path of a SQL source keeps a batch's messages between the scan and the produce
(driver side), and the jobs that read them. Nothing can read a SQL partition again and be sure of
the same rows, so the messages are written once, judged, then produced from where they are kept:

- `KeptOnHost`: an Arrow file per scan task on its host (direct/sql_task.py), where every task
  runs on one host (a local session, or a Spark Connect server with a local master). The messages
  never return to the JVM: the fastest way.
- `KeptInSpark`: the rows of a local checkpoint on the executors' disks (direct/sql_in_spark.py),
  on a cluster, where a produce task may run on another host than the scan task. Each message
  crosses into the JVM and back once more; a block lost with its executor fails the run.

Every wait is bounded (spark/jobs.py); both give the driver the same reports, candidate records
and delivery statistics, so the judgement above them (engine/direct_sql.py) is one.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, StructField, StructType

from dpone_dagster import columns as C
from dpone_dagster.direct import sql_in_spark, sql_task
from dpone_dagster.direct.sql_in_spark import FILE, POSITION, REPORT, ROW
from dpone_dagster.engine.stages.timing import Log
from dpone_dagster.sinks.kafka import ProducerSettings
from dpone_dagster.spark.jobs import BoundedJobs
from dpone_dagster.spark.keep import release_batch
from dpone_dagster.spark.session import session_time_zone
from dpone_dagster.spark.slots import one_host

# The rows of keys that repeat and are all published, in the order they are produced: (partition,
# row number in its kept messages), each key's rows in source order.
Listed = tuple[np.ndarray, np.ndarray]
KEPT_CLEANUP_S = 60.0


class KeptMessages(Protocol):
    jobs: BoundedJobs
    where: str  # where the messages are kept, for the run's log

    def keep_read(self, frame: DataFrame, seconds: float) -> DataFrame:
        """The read kept, for the scan and the row-level checks to judge the same rows; release it
        with spark/keep.release_batch."""

    def scan(self, settings: sql_task.SqlSettings, frame: DataFrame, seconds: float) -> list[sql_task.SqlReport]:
        """Every partition of `frame` scanned by its task, the messages kept; the reports, one per
        partition in partition order."""

    def candidate_records(self, reports: list[sql_task.SqlReport], found: np.ndarray, seconds: float) -> list[pa.Table]:
        """The kept messages whose key hash is among `found` (sorted): key, file (partition), row
        and source order (where kept)."""

    def produce(
        self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], left_out: dict[int, np.ndarray], seconds: float, what: str
    ) -> list[dict]:
        """Produce the kept messages but the rows `left_out` (per partition, sorted); the delivery
        statistics rows."""

    def produce_listed(self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], listed: Listed, seconds: float, what: str) -> list[dict]:
        """Produce the messages `listed`, in that order, from one producer; its statistics rows."""

    def messages(self, settings: sql_task.SqlSettings, reports: list[sql_task.SqlReport]) -> DataFrame:
        """The kept messages as a frame (file, row, key, value, order and sent key where kept),
        for keys that repeat past what the driver settles: Spark settles them."""

    def remove(self, settings: sql_task.SqlSettings, log: Log) -> None:
        """Free what the batch's messages hold (best effort, bounded)."""


def kept_messages(jobs: BoundedJobs, spark: SparkSession) -> KeptMessages:
    return KeptOnHost(jobs) if one_host(spark) else KeptInSpark(jobs)


def _partition() -> int:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a scan outside a Spark task")
    return context.partitionId()


# The published read's partition and row columns (a table may have columns named file or row).
_FILE, _ROW = "__dpone__kept_file", "__dpone__kept_row"


def published_read(settings: sql_task.SqlSettings, read: DataFrame, left_out: dict[int, np.ndarray] | None, settled: DataFrame | None) -> DataFrame:
    """The kept read's rows as published, for the checks of that stage: those the scan kept a
    message of (a skipped delete has none), but the rows keep_last / keep_first leave out, listed
    by the driver (`left_out`) or kept in the messages Spark settled (`settled`). `read` must be
    the kept read the scan wrote its messages from: rows are matched by partition and number."""
    schema = StructType([*read.schema.fields, StructField(_FILE, IntegerType()), StructField(_ROW, LongType())])
    numbered = read.mapInArrow(lambda batches: sql_in_spark.published_rows(settings, _partition(), batches, left_out, _FILE, _ROW), schema)
    if settled is not None:
        numbered = numbered.join(settled.select(F.col(FILE).alias(_FILE), F.col(ROW).alias(_ROW)), [_FILE, _ROW], "left_semi")
    return numbered.drop(_FILE, _ROW)


def _rows(batches: list[pa.RecordBatch]) -> list[dict]:
    return [row for batch in batches for row in batch.to_pylist()]


@dataclass
class KeptOnHost:
    jobs: BoundedJobs
    where: str = "on this host"
    order: dict[str, DataType] = field(default_factory=dict)  # the kept source order's type
    time_zone: str = "UTC"

    def keep_read(self, frame: DataFrame, seconds: float) -> DataFrame:
        # Kept by the first pass that reads it (one host: no executor to lose); a checkpoint, not
        # a cache, which a Connect server shares between sessions reading the same plan.
        return frame.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)

    def scan(self, settings: sql_task.SqlSettings, frame: DataFrame, seconds: float) -> list[sql_task.SqlReport]:
        self.order, self.time_zone = _order_type(settings, frame), _time_zone(frame)

        def scanned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            report = sql_task.scan(settings, _partition(), batches)
            yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(report)], pa.binary())], names=["report"])

        rows = self.jobs.run(lambda: frame.mapInArrow(scanned, "report binary").collect(), seconds, "the scan of the batch")
        return [pickle.loads(row["report"]) for row in rows]

    def candidate_records(self, reports: list[sql_task.SqlReport], found: np.ndarray, seconds: float) -> list[pa.Table]:
        files = [(r.partition, r.path) for r in reports if r.messages]
        picked = self.jobs.in_tasks([[f] for f in files], lambda group: sql_task.candidate_records(group, found), seconds, "the read of repeated keys")
        return [t for t in picked if t is not None]

    def produce(
        self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], left_out: dict[int, np.ndarray], seconds: float, what: str
    ) -> list[dict]:
        groups = [[(r.partition, r.path)] for r in reports if r.messages]
        produced = self.jobs.in_tasks(groups, lambda files: _rows(list(sql_task.produce(settings, producer, files, left_out))), seconds, what)
        return [row for rows in produced for row in rows]

    def produce_listed(self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], listed: Listed, seconds: float, what: str) -> list[dict]:
        assert [r.partition for r in reports] == list(range(len(reports))), "one report per partition, in order"
        paths = [r.path for r in reports]
        return self.jobs.in_tasks([None], lambda _: _rows(list(sql_task.produce_listed(settings, producer, paths, *listed))), seconds, what)[0]

    def messages(self, settings: sql_task.SqlSettings, reports: list[sql_task.SqlReport]) -> DataFrame:
        """Read from the files by Spark tasks (every task runs on their host)."""
        struct = _struct([c for c in sql_in_spark.kept_columns(settings) if c != REPORT], self.order)
        schema = to_arrow_schema(struct, timezone=self.time_zone)
        files = [(r.partition, r.path) for r in reports if r.messages]

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from sql_in_spark.file_rows([files[index]], schema)

        return self.jobs.spark.range(0, len(files), 1, max(1, len(files))).mapInArrow(read, struct)

    def remove(self, settings: sql_task.SqlSettings, log: Log) -> None:
        """In a Spark task: a Python worker's local directory is not the driver's (in a local
        session every worker shares one). A session that failed the run may not run it; the next
        runs' sweep removes what stays."""
        try:
            removed = self.jobs.in_tasks([settings], sql_task.remove_kept, KEPT_CLEANUP_S, "the removal of the kept messages")[0]
        except Exception as exc:  # noqa: BLE001 - the run's outcome stands; the files are swept later
            log(f"direct path: the kept messages were not removed ({type(exc).__name__}); a later run sweeps them")
            return
        if removed:
            log(f"direct path: {removed} kept file(s) removed")


@dataclass
class KeptInSpark:
    jobs: BoundedJobs
    where: str = "in Spark's storage (a cluster)"
    kept: DataFrame | None = None

    def keep_read(self, frame: DataFrame, seconds: float) -> DataFrame:
        return _checkpointed(self.jobs, frame, seconds, "the read of the batch")

    def scan(self, settings: sql_task.SqlSettings, frame: DataFrame, seconds: float) -> list[sql_task.SqlReport]:
        struct = _struct(sql_in_spark.kept_columns(settings), _order_type(settings, frame))
        schema = to_arrow_schema(struct, timezone=_time_zone(frame))

        def scanned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield from sql_in_spark.scan(settings, schema, _partition(), batches)

        self.kept = kept = _checkpointed(self.jobs, frame.mapInArrow(scanned, struct), seconds, "the scan of the batch")
        rows = self.jobs.run(kept.where(F.col(REPORT).isNotNull()).select(REPORT).collect, seconds, "the read of the scan's reports")
        return sorted((pickle.loads(row[REPORT]) for row in rows), key=lambda r: r.partition)

    def _messages(self) -> DataFrame:
        assert self.kept is not None, "scanned first"
        return self.kept.where(F.col(REPORT).isNull()).drop(REPORT)

    def messages(self, settings: sql_task.SqlSettings, reports: list[sql_task.SqlReport]) -> DataFrame:
        return self._messages()

    def candidate_records(self, reports: list[sql_task.SqlReport], found: np.ndarray, seconds: float) -> list[pa.Table]:
        messages = self._messages()
        order = {sql_task.ORDER: messages.schema[sql_task.ORDER].dataType} if sql_task.ORDER in messages.columns else {}
        picked = messages.mapInArrow(lambda batches: sql_in_spark.candidates(batches, found), _struct(["key", FILE, ROW, *order], order))
        table = self.jobs.run(picked.toArrow, seconds, "the read of repeated keys")
        return [table] if table.num_rows else []

    def produce(
        self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], left_out: dict[int, np.ndarray], seconds: float, what: str
    ) -> list[dict]:
        def produced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield _statistics(sql_in_spark.produce(settings, producer, batches, left_out))

        return _collected(self.jobs, self._messages().mapInArrow(produced, "out binary"), seconds, what)

    def produce_listed(self, settings: sql_task.SqlSettings, producer: ProducerSettings, reports: list[sql_task.SqlReport], listed: Listed, seconds: float, what: str) -> list[dict]:
        files, rows = listed
        places = np.arange(len(rows))
        rows_of = {}
        for partition in np.unique(files):
            mine = np.flatnonzero(files == partition)
            by_row = mine[np.argsort(rows[mine], kind="stable")]
            rows_of[int(partition)] = (rows[by_row], places[by_row])
        messages = self._messages()
        names = [POSITION, "key", "value", *([sql_in_spark.SENT_KEY] if sql_in_spark.SENT_KEY in messages.columns else [])]
        found = messages.mapInArrow(lambda batches: sql_in_spark.listed(batches, rows_of), _struct(names))

        # One partition, sorted by place: one producer sends every key's messages in order.
        return produce_frame(self.jobs, settings, producer, found.repartition(1).sortWithinPartitions(POSITION), seconds, what)

    def remove(self, settings: sql_task.SqlSettings, log: Log) -> None:
        """The checkpoint's blocks go with it. A Spark Connect server frees them only when its JVM
        collects the dropped frame (`spark.cleaner.periodicGC.interval`; `dpone spark-server`
        sets 5 minutes)."""
        kept, self.kept = self.kept, None
        if kept is not None:
            try:
                release_batch(kept)
            except Exception as exc:  # noqa: BLE001 - the session may be gone; its blocks go with it
                log(f"direct path: the kept messages were not released ({type(exc).__name__})")


# The types of the columns the store adds (the rest are those of the scanned frame).
_TYPES = {FILE: IntegerType(), ROW: LongType(), POSITION: LongType(), "key": BinaryType(), "value": BinaryType(), sql_in_spark.SENT_KEY: BinaryType(), REPORT: BinaryType()}


def _struct(names: list[str], more: dict[str, DataType] | None = None) -> StructType:
    """Spark's schema of columns the store writes; `more`: the types of the others (the order)."""
    types = {**_TYPES, **(more or {})}
    return StructType([StructField(n, types[n]) for n in names])


def _time_zone(frame: DataFrame) -> str:
    return session_time_zone(frame.sparkSession)


def _checkpointed(jobs: BoundedJobs, frame: DataFrame, seconds: float, what: str) -> DataFrame:
    """`frame` computed once and kept on the executors' disks (a local checkpoint), within the
    job's bound. Read only once it is complete: Spark fills in a part lost while it is made by
    computing it again, and never after (a part lost then fails the job that reads it)."""
    return jobs.run(lambda: frame.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY), seconds, what)


def produce_frame(jobs: BoundedJobs, settings: sql_task.SqlSettings, producer: ProducerSettings, frame: DataFrame, seconds: float, what: str) -> list[dict]:
    """Produce every message of `frame` (key, value, sent key where kept), each partition's in
    its order from one producer; the delivery statistics rows."""

    def produced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield _statistics(sql_in_spark.produce_all(settings, producer, batches))

    return _collected(jobs, frame.mapInArrow(produced, "out binary"), seconds, what)


def _collected(jobs: BoundedJobs, frame: DataFrame, seconds: float, what: str) -> list[dict]:
    return [row for out in jobs.run(frame.collect, seconds, what) for row in pickle.loads(out["out"])]


def _order_type(settings: sql_task.SqlSettings, frame: DataFrame) -> dict[str, DataType]:
    return {sql_task.ORDER: frame.schema[C.ORDER].dataType} if settings.keeps_order else {}


def _statistics(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
    """A task's delivery statistics as one row (pickled)."""
    return pa.RecordBatch.from_arrays([pa.array([pickle.dumps(_rows(list(batches)))], pa.binary())], names=["out"])
