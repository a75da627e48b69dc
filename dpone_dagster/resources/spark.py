"""Spark resource: dagster-pyspark's lazy session with the engine's defaults (local[*] unless
DPONE_SPARK_MASTER or the resource config says otherwise). One session per run process."""

from __future__ import annotations

import json
import os
from typing import Any

from dagster_pyspark import LazyPySparkResource

from dpone_dagster.spark.session import default_spark_conf, ensure_executor_python


def spark_config_from_env() -> dict[str, Any]:
    """Defaults plus DPONE_SPARK_CONF (a JSON object of extra Spark settings)."""
    extra = json.loads(os.environ.get("DPONE_SPARK_CONF", "{}") or "{}")
    return {**default_spark_conf(), **extra}


def spark_resource(conf: dict[str, Any] | None = None) -> LazyPySparkResource:
    ensure_executor_python()
    return LazyPySparkResource(spark_config={**spark_config_from_env(), **(conf or {})})
