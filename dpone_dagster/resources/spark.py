"""Spark resource: dagster-pyspark's lazy session with the engine's defaults (local[*] unless
DPONE_SPARK_MASTER or the resource config says otherwise), or a Spark Connect session when
DPONE_SPARK_REMOTE (or spark.remote in DPONE_SPARK_CONF) names a server. One session per run process."""

from __future__ import annotations

import json
import os
from typing import Any

from dagster_pyspark import LazyPySparkResource

from dpone_dagster.child_env import withheld_from_children
from dpone_dagster.spark.session import client_conf, default_spark_conf, ensure_executor_python, with_jars


class DponeSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, started without credential variables in the environment
    its JVM and Python workers inherit (`child_env`)."""

    def _init_session(self) -> None:
        with withheld_from_children():
            super()._init_session()


def spark_config_from_env() -> dict[str, Any]:
    """Defaults plus DPONE_SPARK_CONF (a JSON object of extra Spark settings)."""
    extra = json.loads(os.environ.get("DPONE_SPARK_CONF", "{}") or "{}")
    return {**default_spark_conf(), **extra}


def spark_resource(jars: list[str] | None = None) -> DponeSparkResource:
    """The run's Spark session settings; `jars` (JDBC drivers) join any from DPONE_SPARK_CONF."""
    ensure_executor_python()
    return DponeSparkResource(spark_config=client_conf(with_jars(spark_config_from_env(), jars or [])))
