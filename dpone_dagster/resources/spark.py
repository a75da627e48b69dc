"""Spark resource: dagster-pyspark's lazy session with the engine's defaults (local[*] unless
DPONE_SPARK_MASTER or the resource config says otherwise), or a Spark Connect session when
DPONE_SPARK_REMOTE (or spark.remote in DPONE_SPARK_CONF) names a server. One session per run process."""

from __future__ import annotations

from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config

from dpone_dagster.child_env import withheld_from_children
from dpone_dagster.spark.session import (
    client_conf,
    ensure_executor_python,
    open_session,
    spark_config_from_env,
    with_jars,
)


class DponeSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, started without credential variables in the environment
    its JVM and Python workers inherit (`child_env`). On Spark Connect, runs share one session
    of the server (`session.shared_session`); a run whose shared session the server closed gets
    one of its own."""

    def _init_session(self) -> None:
        if self._spark_session is None:
            with withheld_from_children():
                self._spark_session = open_session(self.spark_config, spark_session_from_config)


def spark_resource(jars: list[str] | None = None) -> DponeSparkResource:
    """The run's Spark session settings; `jars` (JDBC drivers) join any from DPONE_SPARK_CONF."""
    ensure_executor_python()
    return DponeSparkResource(spark_config=client_conf(with_jars(spark_config_from_env(), jars or [])))
