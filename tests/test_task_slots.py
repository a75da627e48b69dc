"""In local mode the read and produce work runs as one Spark task per task slot (`spark/slots.py`):
the grouping is even, every planned slice is read exactly once, and every message is produced
once. On the embedded broker and the shared local[2] session."""

from __future__ import annotations

from conftest import consume_raw, create_topic, produce_json, unique_topic
from pyspark.sql import functions as F

from dpone_dagster.kafka.boundary import Boundary, PartitionRange, ReadTask, pack_tasks, split_into_tasks
from dpone_dagster.sinks.kafka import ProducerSettings, produce
from dpone_dagster.sources.kafka_reader import ReaderSettings, read_ranges
from dpone_dagster.spark.slots import local_task_slots


def _sizes(tasks: list[ReadTask], groups: list[list[int]]) -> list[int]:
    return [sum(tasks[i].end - tasks[i].start for i in group) for group in groups]


def test_slices_are_grouped_evenly_into_the_task_slots():
    # One large partition and several small ones: in planned order, half the slices would go to
    # one task and all the large ones with them.
    boundary = Boundary("t", "offsets", (PartitionRange(0, 0, 100), PartitionRange(1, 0, 10), PartitionRange(2, 0, 10), PartitionRange(3, 0, 30)))
    tasks = split_into_tasks(boundary, 25)
    groups = pack_tasks(tasks, 2)
    assert sorted(i for group in groups for i in group) == list(range(len(tasks)))
    assert all(group == sorted(group) for group in groups)  # slices keep their order in a task
    assert sorted(_sizes(tasks, groups)) == [75, 75]

    assert pack_tasks(tasks, None) == [[i] for i in range(len(tasks))]  # not local mode
    assert pack_tasks(tasks[:2], 4) == [[0], [1]]  # fewer slices than slots
    assert pack_tasks([], 2) == []


def test_local_mode_reads_every_slice_once_in_one_task_per_slot(broker, spark):
    bs = broker.bootstrap_servers
    topic = unique_topic("slots")
    create_topic(bs, topic, 3)
    for p in range(3):
        produce_json(bs, topic, [{"p": p, "i": i} for i in range(20 + 5 * p)], partition=p)
    boundary = Boundary(topic, "offsets", tuple(PartitionRange(p, 0, 20 + 5 * p) for p in range(3)))
    tasks = split_into_tasks(boundary, 7)  # 11 slices
    assert local_task_slots(spark) == 2 < len(tasks)

    raw = read_ranges(spark, tasks, ReaderSettings({"bootstrap.servers": bs}, "g-slots"))
    assert raw.rdd.getNumPartitions() == 2
    got = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in raw.collect())
    expected = sorted((p, i, f'{{"p": {p}, "i": {i}}}'.encode()) for p in range(3) for i in range(20 + 5 * p))
    assert got == expected


def test_local_mode_produces_from_one_task_per_slot(broker, spark):
    bs = broker.bootstrap_servers
    dst = unique_topic("slots_out")
    create_topic(bs, dst, 2)
    messages = spark.range(0, 300, 1, 6).select(
        F.col("id").cast("string").cast("binary").alias("key"), F.format_string('{"n": %d}', "id").cast("binary").alias("value")
    )
    spark.sparkContext.setJobGroup("slots-produce", "produce from 6 partitions")
    try:
        stats = produce(messages, ProducerSettings(dst, (("bootstrap.servers", bs),), headers_or_partitions=False), 300)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    stage_ids = [s for job in tracker.getJobIdsForGroup("slots-produce") for s in tracker.getJobInfo(job).stageIds]
    assert [tracker.getStageInfo(s).numTasks for s in stage_ids] == [2]

    assert stats.ok and stats.delivered == 300
    values = sorted(r["value"] for r in consume_raw(bs, dst))
    assert values == sorted(f'{{"n": {n}}}'.encode() for n in range(300))
