"""Micro-benchmarks of single Spark steps of a run, on synthetic order rows (no Kafka):
JVM CPU seconds (and wall) of one job each, repeated, in one session.

    python -m bench.micro --rows 500000 [--repeat 3] [--only transfer,cache,json,dedupe]

transfer: the produce stage's JVM → Python Arrow transfer (mapInArrow that only counts rows) of
          key/value/headers/partition with headers null (what kafka_messages.to_messages yields without
          configured headers), headers as empty arrays, and without the headers column.
cache:    persist(MEMORY_AND_DISK) + count of the decoded rows, compressed vs uncompressed columnar
          cache, against a plain count.
json:     from_json (decode) and to_json (encode) of the rows; json_object_keys (the drift pass).
dedupe:   keep_last by window (kafka_messages.dedupe) vs by hash aggregate (max_by), count of the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import descendants


def _jvm_pid() -> int:
    import os

    from bench.common import _kind

    for pid in descendants(os.getpid()):
        if _kind(pid) == "jvm":
            return pid
    raise RuntimeError("no Spark JVM below this process")


def _measure(name: str, fn: Callable[[], Any], repeat: int, jvm: int, out: list[dict[str, Any]]) -> None:
    import os

    from bench.common import tree_cpu_by_kind

    for i in range(repeat):
        before = tree_cpu_by_kind(os.getpid())
        wall0 = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - wall0
        after = tree_cpu_by_kind(os.getpid())
        row = {
            "step": name,
            "rep": i,
            "wall_s": round(wall, 2),
            "jvm_cpu_s": round(after["jvm"] - before["jvm"], 2),
            "python_worker_cpu_s": round(after["python_worker"] - before["python_worker"], 2),
            "result": result,
        }
        out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    del jvm


def orders_df(spark: Any, rows: int, partitions: int) -> Any:
    """Rows shaped like the decoded order events (same fields and types as the k2k events)."""
    from pyspark.sql import functions as F

    i = F.col("id")
    statuses = F.array(*[F.lit(s) for s in ("created", "paid", "packed", "shipped", "delivered", "cancelled")])
    return spark.range(0, rows, 1, partitions).select(
        i.alias("order_id"),
        F.format_string("c%07d", (i * 7919) % 10_000_000).alias("customer_id"),
        F.element_at(statuses, (i % 6 + 1).cast("int")).alias("status"),
        ((i * 37) % 5000 + (i % 100) / 100).alias("amount"),
        F.lit("EUR").alias("currency"),
        (1 + i % 9).alias("items"),
        F.lit("web").alias("channel"),
        F.lit("DE").alias("country"),
        F.lit("2026-11-01T10:00:00.123Z").alias("created_at"),
        F.format_string("order %d for customer %d via web", i, (i * 7919) % 10_000_000).alias("note"),
        F.struct(F.lit(0).cast("long").alias("ts"), (i % 6).cast("int").alias("p"), i.alias("o")).alias("__dpone__order"),
    )


def _count_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default="transfer,cache,json,dedupe")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V")
    args = p.parse_args(argv)

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from bench.k2k import start_spark, stdout_to_stderr
    from dpone_dagster.sinks import kafka_messages
    from dpone_dagster.sinks.kafka_messages import JSON_WRITE_OPTIONS

    out: list[dict[str, Any]] = []
    with stdout_to_stderr(True):
        spark, _ = start_spark(dict(item.split("=", 1) for item in args.spark_conf) or None)
        jvm = _jvm_pid()
        base = orders_df(spark, args.rows, args.partitions).persist(StorageLevel.MEMORY_ONLY)
        base.count()
        payload = [c for c in base.columns if not c.startswith("__dpone__")]
        messages = base.select(
            F.col("order_id").cast("string").cast("binary").alias("key"),
            F.to_json(F.struct(*payload), JSON_WRITE_OPTIONS).cast("binary").alias("value"),
            F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
            F.lit(-1).cast("int").alias("partition"),
        ).persist(StorageLevel.MEMORY_ONLY)
        messages.count()
        only = args.only.split(",")
        if "transfer" in only:
            empty = F.array().cast("array<struct<key:string,value:binary>>")
            variants = {
                "transfer headers=null": messages,
                "transfer headers=[]": messages.withColumn("headers", F.coalesce("headers", empty)),
                "transfer no headers column": messages.drop("headers"),
            }
            for name, df in variants.items():
                _measure(name, lambda df=df: sum(r.n for r in df.mapInArrow(_count_batches, "n long").collect()), args.repeat, jvm, out)
        if "cache" in only:
            spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "true")

            def stored_mb() -> float:
                infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
                return sum(i.memSize() + i.diskSize() for i in infos) / 2**20

            def cached(level: Any = StorageLevel.MEMORY_AND_DISK) -> dict[str, Any]:
                before = stored_mb()
                df = base.select("*", F.lit("x").alias("fresh")).persist(level)
                n = df.count()
                size = stored_mb() - before
                df.unpersist(blocking=True)
                return {"rows": n, "cached_mb": round(size, 1)}

            _measure("count (no persist)", lambda: base.select("*", F.lit("x").alias("fresh")).count(), args.repeat, jvm, out)
            _measure("persist+count compressed", cached, args.repeat, jvm, out)
            spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
            _measure("persist+count uncompressed", cached, args.repeat, jvm, out)
            spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "true")
        if "json" in only:
            text = messages.select(F.col("value").cast("string").alias("value"))
            schema = base.select(payload).schema
            _measure("from_json", lambda: text.select(F.from_json("value", schema).alias("j")).where(F.col("j").isNotNull()).count(), args.repeat, jvm, out)
            _measure("json_object_keys distinct", lambda: text.select(F.explode(F.json_object_keys("value"))).distinct().count(), args.repeat, jvm, out)
            _measure("to_json", lambda: base.select(F.to_json(F.struct(*payload), JSON_WRITE_OPTIONS).alias("v")).where(F.length("v") > 0).count(), args.repeat, jvm, out)
        if "dedupe" in only:
            keyed = base.withColumn(kafka_messages.KEY, F.col("order_id").cast("string").cast("binary")).withColumn("__dpone__op", F.lit("upsert"))
            _measure("dedupe window", lambda: kafka_messages.dedupe(keyed, "keep_last").count(), args.repeat, jvm, out)

            def broadcast_winners() -> int:  # the engine's plan up to BROADCAST_DEDUPE_KEYS repeated keys
                winners = kafka_messages.duplicate_winners(keyed, kafka_messages.duplicated_keys(keyed), "keep_last")
                return kafka_messages.keep_winners(keyed, winners).count()

            _measure("dedupe broadcast winners", broadcast_winners, args.repeat, jvm, out)
    print(json.dumps({"rows": args.rows, "results": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
