"""The Spark session used by the engine: local[*] by default, any master through configuration."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession


def default_spark_conf() -> dict[str, Any]:
    """Embedded defaults; DPONE_SPARK_MASTER points the engine at a cluster."""
    return {
        "spark.master": os.environ.get("DPONE_SPARK_MASTER", "local[*]"),
        "spark.app.name": "dpone_dagster",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        # A failed producing task must fail the run rather than re-send silently.
        "spark.task.maxFailures": "1",
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    }


def ensure_executor_python() -> None:
    """Executors must run the interpreter that has pyarrow and confluent-kafka installed."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(conf: dict[str, Any] | None = None) -> SparkSession:
    ensure_executor_python()
    builder = SparkSession.builder
    for key, value in {**default_spark_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("DPONE_SPARK_LOG_LEVEL", "ERROR"))
    return session
