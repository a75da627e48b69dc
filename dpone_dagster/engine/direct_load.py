"""The load stage of the direct path (engine/direct.py): the tasks produce their kept messages, and
the offsets are stored by the rule that keeps the guarantees.

- Stored as slices are delivered (`checkpoint`), at most `window` slices open at once
  (direct/progress.py): a run that dies re-sends at most `window` slices, on every kind of Spark
  deployment (the window is the driver's, spark/slots.produce_slots).
- Stored once, with the whole batch, at the commit: under a target reconciliation (the state moves
  after it), and when keep_last / keep_first left records of repeated keys out. A left-out record
  and the one kept over it may sit in different partitions or slices; storing one partition before
  the other could let a rerun, which no longer sees the kept record, publish the left-out one after
  it (a stale last value per key). Also when keys repeat where every record is published (an
  append, duplicate_policy: allow): their records are produced first, in source order per key
  (`produce_ordered`), so they are delivered from every slice before any slice is stored.
Every wait is bounded (spark/jobs.py): a job that outlives its bound cancels the run's jobs and
fails the run, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from dpone_dagster.direct import task
from dpone_dagster.direct.ordered import ORDERED_DDL, SOURCE_ORDER, ordered_messages
from dpone_dagster.direct.progress import Slice, SliceSchedule
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.commit import reconciles
from dpone_dagster.engine.stages.load import check_delivery
from dpone_dagster.engine.stages.timing import Log
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.boundary import Boundary
from dpone_dagster.kafka.delivery import STATS_COLUMNS, aggregate
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches
from dpone_dagster.spark.jobs import BoundedJobs, Job, deadline_s, in_tasks, waves
from dpone_dagster.spark.slots import local_task_slots

Checkpoint = Callable[[dict[int, int]], None]
Skip = dict[int, np.ndarray]  # source offsets left out, per partition


def storing_rule(manifest: Manifest, planned_checkpoint: Checkpoint | None, removed: int, ordered: int, result: RunResult) -> Checkpoint | None:
    """The checkpoint to store offsets with while the run produces, or None: once, at the commit."""
    if planned_checkpoint is None or reconciles(manifest):
        return None
    if removed:
        result.notes.append(
            f"direct path: {manifest.sink.strategy.duplicate_policy} left out {removed} record(s) of repeated keys; "
            "offsets are stored once, with the whole batch, so a rerun never publishes a left-out record after the one kept"
        )
        return None
    if ordered:
        result.notes.append(
            f"direct path: {ordered} record(s) of repeated keys are produced first, in source order per key; "
            "offsets are stored once, with the whole batch"
        )
        return None
    return planned_checkpoint


def largest_group(groups: list[list[Slice]]) -> int:
    """The most offsets one task's slices hold: what a job's time bound is sized by."""
    return max(sum(p[3] - p[2] for p in group) for group in groups)


def check_ordered_delivery(manifest: Manifest, rows: list[dict[str, Any]], count: int, result: RunResult) -> None:
    """The ordered produce of repeated keys (either direct path) delivered the `count` messages the
    batch was judged with: a failed delivery fails the run before the rest is produced (the rest
    would only be sent again by the rerun); another count means other messages than judged."""
    stats = aggregate(rows)
    if not stats.ok:
        check_delivery(manifest, stats, result)
    if stats.delivered != count:
        raise RunFailed(f"{stats.delivered} message(s) of repeated keys acknowledged where the batch was judged with {count}; nothing was stored")


def produce_ordered(
    jobs: BoundedJobs,
    window: int,
    settings: task.DirectSettings,
    producer: ProducerSettings,
    groups: list[list[Slice]],
    ordered: Skip,
    set_aside: Skip,
    log: Log,
) -> list[dict[str, Any]]:
    """Produce the messages of keys that repeat where every record is published (`ordered`: their
    source offsets per partition), before the rest: the tasks read them from the slices, Spark
    hands each key's messages to one producing task (a shuffle by key) in source order, as the
    Spark SQL path orders them (sinks/kafka_messages.ordered_by_key). The delivery statistics rows
    (for check_ordered_delivery)."""
    count = sum(len(offsets) for offsets in ordered.values())
    spark = jobs.spark

    def read(batches: Any) -> Any:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from ordered_messages(settings, groups[index], ordered, set_aside).to_batches()

    frame = spark.range(0, len(groups), 1, max(1, len(groups))).mapInArrow(read, ORDERED_DDL)
    by_key = frame.repartition("key").sortWithinPartitions(*SOURCE_ORDER).select("key", "value", "headers", "partition")
    slots = local_task_slots(spark)
    if slots is not None:
        by_key = by_key.coalesce(slots)  # one producer per slot; a key stays in one partition, its order kept
    # The tasks read their groups' slices (from Kafka again where a spill is not on their host),
    # then one task may produce every message (a single key).
    largest = largest_group(groups)
    seconds = deadline_s(largest, producer.flush_timeout_s, waves(len(groups), window)) + deadline_s(count, producer.flush_timeout_s)
    bounded = producer.bounded(seconds)

    def produce_task(batches: Any) -> Any:
        yield from produce_batches(bounded, batches)

    log(f"load: {count} message(s) of repeated keys produced first, in source order per key (direct path)")
    return [row.asDict() for row in jobs.run(by_key.mapInArrow(produce_task, STATS_COLUMNS).collect, seconds, f"the ordered produce of {count} message(s) to '{producer.topic}'")]


def produce_all(
    jobs: BoundedJobs,
    window: int,
    settings: task.DirectSettings,
    producer: ProducerSettings,
    groups: list[list[Slice]],
    skip: Skip,
    expected: dict[Slice, int],
    boundary: Boundary,
    checkpoint: Checkpoint | None,
    log: Log,
    result: RunResult,
) -> list[dict[str, Any]]:
    """Produce every kept message; the delivery statistics rows of every task. Slice by slice,
    storing as they are delivered, unless the state moves once or every slice fits in one wave
    (storing slice by slice would bound nothing then): one job over the groups. `expected`: the
    messages each slice must deliver before its offsets may be stored (the scan's, less those
    left out)."""
    pieces = [piece for group in groups for piece in group]
    if checkpoint is not None and len(pieces) > window:
        result.notes.append(
            f"direct path: offsets stored as slices are delivered; at most {window} slice(s) of at most "
            f"{max(p[3] - p[2] for p in pieces)} offsets delivered and not yet stored at any moment"
        )
        return _slice_by_slice(jobs, window, settings, producer, pieces, skip, expected, boundary, checkpoint, log)
    largest = largest_group(groups)
    seconds = deadline_s(largest, producer.flush_timeout_s, waves(len(groups), window))
    bounded = producer.bounded(seconds)
    produced = jobs.in_tasks(
        groups, lambda g: produce_rows(settings, bounded, g, skip), seconds, f"the produce of {len(pieces)} slice(s) to '{producer.topic}'"
    )
    return [row for rows_of_task in produced for row in rows_of_task]


def produce_rows(settings: task.DirectSettings, producer: ProducerSettings, slices: list[Slice], skip: Skip) -> list[dict[str, Any]]:
    """Executor side: produce `slices`; the delivery statistics rows."""
    rows: list[dict[str, Any]] = []
    for batch in task.produce(settings, producer, slices, skip):
        rows.extend(batch.to_pylist())
    return rows


def _slice_by_slice(
    jobs: BoundedJobs,
    window: int,
    settings: task.DirectSettings,
    producer: ProducerSettings,
    pieces: list[Slice],
    skip: Skip,
    expected: dict[Slice, int],
    boundary: Boundary,
    checkpoint: Checkpoint,
    log: Log,
) -> list[dict[str, Any]]:
    """One Spark job per slice, started while fewer than `window` slices are open; a partition's
    offset is stored as soon as its slices up to there are delivered. After a failed slice nothing
    new starts; the slices running then finish (and are stored) before the error is raised."""
    schedule = SliceSchedule(pieces, {r.partition: r.start for r in boundary.ranges}, window)
    spark = jobs.spark
    running: dict[Future[Any], tuple[Slice, Job[Any]]] = {}
    rows: list[dict[str, Any]] = []
    failure: BaseException | None = None
    try:
        while True:
            piece = schedule.next()
            while piece is not None:
                seconds = deadline_s(piece[3] - piece[2], producer.flush_timeout_s)
                bounded = producer.bounded(seconds)
                job = jobs.start(
                    lambda piece=piece, bounded=bounded: in_tasks(spark, [[piece]], lambda g: produce_rows(settings, bounded, g, skip))[0],
                    seconds,
                    f"the produce of {piece[0]}[{piece[1]}] offsets {piece[2]}-{piece[3]}",
                )
                running[job.future] = (piece, job)
                piece = schedule.next()
            if not running:
                break
            for job in jobs.first_done([job for _, job in running.values()]):
                piece, _ = running.pop(job.future)
                try:
                    piece_rows = job.future.result()
                except Exception as exc:  # the job failed: nothing of this slice may be stored
                    failure = failure or exc
                    schedule.stop()
                    continue
                rows.extend(piece_rows)
                stats = aggregate(piece_rows)
                if not stats.ok:
                    schedule.stop()  # check_delivery reports it
                    continue
                if stats.delivered != expected.get(piece, stats.delivered):  # the slice read again gave other messages
                    failure = failure or RunFailed(
                        f"{piece[0]}[{piece[1]}] offsets {piece[2]}-{piece[3]}: {stats.delivered} message(s) acknowledged where the "
                        f"batch was judged with {expected[piece]}; nothing of it was stored"
                    )
                    schedule.stop()
                    continue
                moved = schedule.delivered(piece)
                if moved:
                    checkpoint(moved)
                    log(f"load: {piece[0]}[{piece[1]}] delivered up to offset {moved[piece[1]]}; stored")
    except BaseException as exc:  # the state store failed, a job timed out, or the run was interrupted
        schedule.stop()
        jobs.cancel()
        if failure is not None and exc is not failure:
            raise exc from failure  # the first failure stays in the chain
        raise
    if failure is not None:
        raise failure
    if not schedule.done and aggregate(rows).ok:  # a stop always has a cause; never commit without one
        raise RunFailed(f"the produce stopped with slices of '{producer.topic}' left; no state was advanced past them")
    return rows
