"""How many tasks run at once, where that is known for certain.

In local mode the driver is the only executor and `defaultParallelism` its task slots. Work that
pays a fixed cost per Spark task (a consumer or producer to start, a Python task to set up, a
producer flush to wait for) is then run as one task per slot: on 2 cores, 2M order events ran
~5% faster, with ~2 CPU s less, than as 12 tasks. On a cluster the slot count can change while
a run is planned (executors registering, dynamic allocation asks for executors by pending
tasks), so tasks are left as they are there.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from dpone_dagster.spark.session import is_connect


def local_mode(spark: SparkSession) -> bool:
    """True in local mode of a classic session (not `local-cluster`, whose executors are other
    processes; Spark Connect has no SparkContext here)."""
    try:
        master = spark.sparkContext.master
    except Exception:
        return False
    return master == "local" or master.startswith("local[")


def one_host(spark: SparkSession) -> bool:
    """Every task of the session runs on one host, where files one task writes are there for the
    others: a local-mode session, or a Spark Connect server whose master is local (as
    `dpone spark-server` starts it). A cluster's executors may be anywhere."""
    if local_mode(spark):
        return True
    if not is_connect(spark):
        return False
    try:
        master = spark.conf.get("spark.master", "") or ""
    except Exception:  # noqa: BLE001 - a server that does not say is taken for a cluster
        return False
    return master == "local" or master.startswith("local[")


def partition_count(frame: DataFrame) -> int | None:
    """The partitions (tasks) of `frame`'s read; None on Spark Connect, whose client cannot see
    them without running the read."""
    if is_connect(frame.sparkSession):
        return None
    return frame.rdd.getNumPartitions()


def local_task_slots(spark: SparkSession) -> int | None:
    """The task slots of a local-mode session; None elsewhere."""
    return spark.sparkContext.defaultParallelism if local_mode(spark) else None


# Where the session cannot tell how many tasks run at once (Spark Connect against a cluster).
DEFAULT_SLOTS = 4


def produce_slots(spark: SparkSession) -> int:
    """How many slices the direct path produces at once: the task slots where they are known
    (local mode; a classic session's default parallelism, the executors' cores when it is planned),
    else `spark.default.parallelism`, else the slots of a Connect server's `local[N]` master, else
    DEFAULT_SLOTS. It also bounds the slices delivered and not yet stored (direct/progress.py)."""
    slots = local_task_slots(spark)
    if slots is not None:
        return max(1, slots)
    try:
        return max(1, spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect: no SparkContext in this process
        pass
    try:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            return max(1, int(configured))
        master = spark.conf.get("spark.master", "") or ""
    except Exception:  # noqa: BLE001 - a server that does not say
        return DEFAULT_SLOTS
    if master.startswith("local[") and master[6:-1].split(",")[0].isdigit():
        return max(1, int(master[6:-1].split(",")[0]))
    return DEFAULT_SLOTS
