"""Spark jobs the driver waits for with a bound.

Each job runs in a daemon thread of its own (inheriting the caller's Spark job group, pool and
tags) under the run's tag (classic sessions: a SparkContext
job tag; Spark Connect: a session operation tag, both thread-local). The driver waits for the first
of its jobs to finish, never past the earliest deadline; a job still running at its deadline is
cancelled with every other job of the tag and the wait raises `JobTimedOut`, naming the job. The
threads are daemons, so a job that ignores its cancellation never keeps the process alive.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.util import InheritableThread

from dpone_dagster.errors import RunFailed
from dpone_dagster.spark.session import is_connect

T = TypeVar("T")
G = TypeVar("G")

# A produce or read task bounds its own waits on the broker (delivery.flush_timeout_s, the
# reader's empty polls); a job deadline is the safety net above them: that wait plus a margin
# plus a floor rate for the records of the job's largest task.
MARGIN_S = 60.0
FLOOR_RECORDS_PER_S = 200.0


def deadline_s(records_per_task: int, broker_wait_s: float, waves: int = 1) -> float:
    """The bound of a job whose tasks each handle at most `records_per_task` records and may
    wait up to `broker_wait_s` on the broker, run in `waves` rounds of the task slots (pure)."""
    return max(1, waves) * (broker_wait_s + MARGIN_S + records_per_task / FLOOR_RECORDS_PER_S)


def waves(tasks: int, slots: int) -> int:
    """Rounds of `slots` task slots that `tasks` tasks take (pure)."""
    return max(1, -(-tasks // max(1, slots)))


class JobTimedOut(RunFailed):
    """A Spark job outlived its bound; every job of the run was cancelled."""


@dataclass(frozen=True)
class Job(Generic[T]):
    what: str  # names the work in errors ("produce of orders[0] offsets 0-20000")
    seconds: float
    deadline: float  # time.monotonic()
    future: Future[T]


class BoundedJobs:
    """The Spark jobs of one run, started in threads and waited for with deadlines."""

    def __init__(self, spark: SparkSession, run_id: str) -> None:
        self.spark = spark
        self.tag = f"dpone-{run_id}".replace(",", "_")

    def start(self, work: Callable[[], T], seconds: float, what: str) -> Job[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                self._tag_thread()
                future.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting driver
                future.set_exception(exc)

        # The caller's job group, pool and tags (Dagster's, a user's) carry over to the job's thread.
        InheritableThread(target=run, session=self.spark, name=f"{self.tag}-job", daemon=True).start()
        return Job(what, seconds, time.monotonic() + seconds, future)

    def first_done(self, jobs: list[Job[Any]]) -> list[Job[Any]]:
        """The jobs of `jobs` that have finished, waiting until at least one has. Raises
        JobTimedOut, after cancelling the run's jobs, when a deadline passes first."""
        while True:
            now = time.monotonic()
            late = [j for j in jobs if not j.future.done() and j.deadline <= now]
            if late:
                self.cancel()
                job = late[0]
                raise JobTimedOut(
                    f"{job.what} did not finish within {job.seconds:.0f} s (its tasks stopped answering: "
                    "the broker or a Spark worker does not respond); the run's Spark jobs were cancelled"
                )
            finished, _ = wait([j.future for j in jobs], timeout=min(j.deadline for j in jobs) - now, return_when=FIRST_COMPLETED)
            if finished:
                return [j for j in jobs if j.future in finished]

    def run(self, work: Callable[[], T], seconds: float, what: str) -> T:
        """One job, waited for with its bound; cancelled when the wait is interrupted."""
        job = self.start(work, seconds, what)
        try:
            self.first_done([job])
        except BaseException:  # a time-out (cancelled already) or the run interrupted
            self.cancel()
            raise
        return job.future.result()

    def in_tasks(self, groups: list[G], work: Callable[[G], T], seconds: float, what: str) -> list[T]:
        """`in_tasks` as one job of the run, waited for at most `seconds`."""
        return self.run(lambda: in_tasks(self.spark, groups, work), seconds, what)

    def cancel(self) -> None:
        """Cancel every job of the run still running (best effort: the session may be gone)."""
        try:
            if is_connect(self.spark):
                self.spark.interruptTag(self.tag)
            else:
                self.spark.sparkContext.cancelJobsWithTag(self.tag)
        except Exception:  # noqa: BLE001 - the run fails with the time-out either way
            pass

    def _tag_thread(self) -> None:
        if is_connect(self.spark):
            self.spark.addTag(self.tag)
        else:
            self.spark.sparkContext.addJobTag(self.tag)


def in_tasks(spark: SparkSession, groups: list[G], work: Callable[[G], T]) -> list[T]:
    """`work(group)` for every group, one Spark task each; the results in group order. A classic
    session runs them as a plain RDD of indexes (its workers skip the Arrow/pandas set-up of a
    UDF: ~2 CPU s less per run, measured); Spark Connect, which has no RDDs, as an Arrow map over
    the same indexes."""
    if not is_connect(spark):
        indexes = spark.sparkContext.parallelize(range(len(groups)), max(1, len(groups)))
        return indexes.map(lambda index: work(groups[index])).collect()

    def run(batches: Any) -> Any:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                out = pickle.dumps((index, work(groups[index])))
                yield pa.RecordBatch.from_arrays([pa.array([out], pa.binary())], names=["out"])

    frame = spark.range(0, len(groups), 1, max(1, len(groups))).mapInArrow(run, "out binary")
    results = dict(pickle.loads(row["out"]) for row in frame.collect())
    return [results[i] for i in range(len(groups))]
