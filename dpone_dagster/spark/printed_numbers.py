"""Doubles and floats as Spark prints them (Java 17's `Double.toString` / `Float.toString`), for
the numbers the task encoder does not print alike (sinks/json_encode.SparkNumbers: 1e16 or more,
below 1e-307, a power of two below 1e-3). A small job per type on the driver: `cast(... as string)` is
the text Spark's `to_json` writes for a finite number, so both paths write the same bytes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dpone_dagster.sinks.json_encode import NumberKey, number_of
from dpone_dagster.spark.jobs import BoundedJobs


class CollectsNumbers(Protocol):
    """A scan task's report: the numbers it found without Spark's text."""

    @property
    def numbers(self) -> frozenset[NumberKey]: ...


def unprinted_numbers(reports: Iterable[CollectsNumbers]) -> set[NumberKey]:
    """Every number the scan tasks found without Spark's text."""
    return set().union(*(r.numbers for r in reports))


# (kind, Spark type, type of its bits)
_KINDS = (("double", "double", "long"), ("float", "float", "int"))


def printed_by_spark(spark: SparkSession, jobs: BoundedJobs, keys: Iterable[NumberKey], seconds: float) -> dict[NumberKey, str]:
    """The text Spark prints for each number of `keys`, in one job per kind, waited for at most
    `seconds` each."""
    wanted = set(keys)
    texts: dict[NumberKey, str] = {}
    for kind, spark_type, bits_type in _KINDS:
        rows = [(bits, number_of((kind, bits))) for k, bits in wanted if k == kind]
        if not rows:
            continue
        schema = f"bits {bits_type}, value {spark_type}"

        def printing(rows: list[tuple[int, float]] = rows, schema: str = schema) -> list:  # bounded whole (a Connect round trip too)
            return spark.createDataFrame(rows, schema).select("bits", F.col("value").cast("string")).collect()

        printed = jobs.run(printing, seconds, f"printing {len(rows)} {kind}(s) as Spark prints them")
        texts.update({(kind, int(bits)): text for bits, text in printed})
    return texts
