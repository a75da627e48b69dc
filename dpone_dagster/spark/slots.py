"""How many tasks run at once, where that is known for certain.

In local mode the driver is the only executor and `defaultParallelism` its task slots. Work that
pays a fixed cost per Spark task (a consumer or producer to start, a Python task to set up, a
producer flush to wait for) is then run as one task per slot: on 2 cores, 2M order events ran
~5% faster, with ~2 CPU s less, than as 12 tasks. On a cluster the slot count can change while
a run is planned (executors registering, dynamic allocation asks for executors by pending
tasks), so tasks are left as they are there.
"""

from __future__ import annotations

from pyspark.sql import SparkSession


def local_mode(spark: SparkSession) -> bool:
    """True in local mode of a classic session (not `local-cluster`, whose executors are other
    processes; Spark Connect has no SparkContext here)."""
    try:
        master = spark.sparkContext.master
    except Exception:
        return False
    return master == "local" or master.startswith("local[")


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
