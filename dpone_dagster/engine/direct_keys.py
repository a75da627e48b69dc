"""Repeated keys of a Kafka direct-path batch (driver side; the hashes are found in the scan,
direct/keys.py): which records keep_last / keep_first leave out.

The tasks read back the records whose key hash is a candidate (direct/task.candidate_records).
Up to DRIVER_CANDIDATES candidate hashes the driver ranks those records itself with the rule both
direct paths share (direct/keys.left_out_by_policy); more are ranked by a Spark window over the
records, partitioned by key (a shuffle on the cluster), and only the records left out — source
partition and offset, 12 bytes each — come to the driver. The source order is (timestamp,
partition, offset), as on the Spark SQL path (sinks/kafka_messages.dedupe). Where every record is
published (an append, duplicate_policy: allow), the records of keys that repeat are found the
same way, and produced first, in that order per key (engine/direct_load.produce_ordered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dpone_dagster.direct import task
from dpone_dagster.direct.keys import is_candidate, left_out_by_policy, repeated_keys
from dpone_dagster.engine.direct_attempt import ToSparkSql
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sinks.kafka_messages import duplicates_refused, refuses_duplicates, uses_dedupe
from dpone_dagster.spark.jobs import BoundedJobs
from dpone_dagster.spark.session import is_connect

# Candidate key hashes whose records the driver ranks itself; more are ranked in Spark.
DRIVER_CANDIDATES = 1_000_000
# Over Spark Connect the candidate hashes (8 bytes each) travel inside the plan, whose messages
# the server takes up to 128 MiB by default: past this many the batch goes to the Spark SQL path.
CONNECT_CANDIDATES = 4_000_000
ORDER = ("timestamp", "partition", "offset")  # the source order, most significant first
CANDIDATE_SCHEMA = "key binary, offset long, timestamp long, partition int"

Offsets = dict[int, np.ndarray]  # sorted source offsets per partition


def settle_repeated_keys(
    manifest: Manifest,
    spark: SparkSession,
    jobs: BoundedJobs,
    settings: task.DirectSettings,
    groups: list[list[task.Slice]],
    found: np.ndarray,
    seconds: float,
    set_aside: Offsets,
    oversized: pa.Table,
) -> tuple[Offsets, int, Offsets]:
    """From the candidate key hashes `found`: the source offsets keep_last / keep_first leave out
    per partition and how many they are, and the source offsets of every record of a key that
    repeats where each record is published (an append, duplicate_policy: allow), which are
    produced first, in source order per key (engine/direct_load.produce_ordered). Keys that repeat
    under duplicate_policy: fail refuse the batch as the Spark SQL path does. `oversized`: the
    messages over message.max.bytes the scan set aside (task.CANDIDATES), settled with the others
    where keys are settled (where every record is published, each is a bad record)."""
    if not len(found):
        return {}, 0, {}
    policy = manifest.sink.strategy.duplicate_policy
    settles = uses_dedupe(manifest.sink) or refuses_duplicates(manifest.sink)
    extra = oversized.filter(pa.array(is_candidate(oversized["key"].combine_chunks(), found))) if settles and oversized.num_rows else task.CANDIDATES.empty_table()

    def read(group: list[task.Slice]) -> pa.Table:
        return task.candidate_records(settings, group, found, set_aside)

    if len(found) > DRIVER_CANDIDATES:
        if is_connect(spark) and len(found) > CONNECT_CANDIDATES:
            raise ToSparkSql(f"more than {CONNECT_CANDIDATES:,} keys may repeat (Spark Connect: their hashes would travel in the plan)")
        if refuses_duplicates(manifest.sink):
            refuse_repeats(*jobs.run(lambda: _repeats_in_spark(_candidates(spark, groups, read, extra)), seconds, "the count of repeated keys"))
            return {}, 0, {}
        if not uses_dedupe(manifest.sink):
            candidates = _candidates(spark, groups, read, extra)
            return {}, 0, _ordered(spark, jobs.run(lambda: repeated_records(candidates).toArrow(), seconds, "the records of repeated keys"))
        return (*_losers_in_spark(jobs, _candidates(spark, groups, read, extra), seconds, policy), {})
    picked = jobs.in_tasks(groups, read, seconds, "the read of repeated keys")
    records = pa.concat_tables([*picked, extra])
    repeated = repeated_keys(records)
    if not len(repeated):
        return {}, 0, {}  # hashes shared by different keys only
    if refuses_duplicates(manifest.sink):
        refuse_repeats(len(repeated), repeated.to_pylist())
    of_repeated = records.filter(pc.is_in(records["key"], repeated))
    if not uses_dedupe(manifest.sink):
        return {}, 0, _ordered(spark, of_repeated)
    return (*losers(of_repeated, policy), {})


def _ordered(spark: SparkSession, records: pa.Table) -> Offsets:
    """The source offsets of the records produced in order per key; over Spark Connect their
    offsets travel in the plan of the ordered produce, as candidate hashes do."""
    if is_connect(spark) and records.num_rows > CONNECT_CANDIDATES:
        raise ToSparkSql(f"more than {CONNECT_CANDIDATES:,} records of repeated keys (Spark Connect: their offsets would travel in the plan)")
    return by_partition(records)


def repeated_records(records: DataFrame) -> DataFrame:
    """The records (CANDIDATE_SCHEMA) whose key repeats, found by Spark (a shuffle by key):
    partition and offset."""
    count = F.count(F.lit(1)).over(Window.partitionBy("key"))
    return records.withColumn("__count", count).where(F.col("__count") > 1).select("partition", "offset")


SAMPLE = 10  # repeated keys named in a refusal


def refuse_repeats(count: int, keys: list[bytes]) -> None:
    """duplicate_policy: fail over `count` keys that repeat (`keys`: a sample), as the Spark SQL
    path refuses them (sinks/kafka_messages.duplicates_refused)."""
    if count:
        raise duplicates_refused(count, [bytes(k).decode("utf-8", "replace") for k in keys[:SAMPLE]])


def _repeats_in_spark(candidates: DataFrame) -> tuple[int, list[bytes]]:
    """How many keys repeat among the candidate records (counted by Spark: a shuffle by key), and a
    sample of them."""
    repeated = candidates.groupBy("key").count().where(F.col("count") > 1)
    count = repeated.count()
    return count, [row["key"] for row in repeated.select("key").limit(SAMPLE).collect()] if count else []


def losers(records: pa.Table, policy: str) -> tuple[Offsets, int]:
    """keep_last / keep_first among the records of repeated keys, ranked here: every record but
    one per key is left out."""
    dropped = left_out_by_policy(records, list(ORDER), policy)
    return by_partition(dropped), dropped.num_rows


def ranked_losers(records: DataFrame, policy: str) -> DataFrame:
    """The records (CANDIDATE_SCHEMA) keep_last / keep_first leave out, ranked by Spark: partition
    and offset. The order's columns are never null, so Spark's window orders them as `losers` does."""
    order = [F.col(c).desc() if policy == "keep_last" else F.col(c).asc() for c in ORDER]
    rank = F.row_number().over(Window.partitionBy("key").orderBy(*order))
    return records.withColumn("__rank", rank).where(F.col("__rank") > 1).select("partition", "offset")


def _losers_in_spark(jobs: BoundedJobs, records: DataFrame, seconds: float, policy: str) -> tuple[Offsets, int]:
    """`losers`, ranked by Spark over the candidate `records`."""
    dropped = jobs.run(lambda: ranked_losers(records, policy).toArrow(), seconds, "the ranking of repeated keys")
    return by_partition(dropped), dropped.num_rows


def _candidates(spark: SparkSession, groups: list[list[task.Slice]], read: Callable[[list[task.Slice]], pa.Table], extra: pa.Table) -> DataFrame:
    """The candidate records the tasks `read` (a group each), and the `extra` ones the driver
    holds, as a DataFrame of CANDIDATE_SCHEMA."""

    def records_of(batches: Any) -> Any:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read(groups[index]).to_batches()

    records = spark.range(len(groups), numPartitions=max(1, len(groups))).mapInArrow(records_of, CANDIDATE_SCHEMA)
    if not extra.num_rows:
        return records
    return records.unionByName(spark.createDataFrame(extra.to_pylist(), CANDIDATE_SCHEMA))


def by_partition(records: pa.Table) -> Offsets:
    """The source offsets of `records` (its partition and offset columns) grouped by partition,
    each sorted (the form the produce tasks skip by)."""
    partitions, offsets = records["partition"].to_numpy(), records["offset"].to_numpy()
    return {int(p): np.sort(offsets[partitions == p]) for p in np.unique(partitions)}
