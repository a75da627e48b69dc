"""Unattended operation the way it is deployed: a real `dagster-daemon` with the repository's
dagster.yaml on a fresh PostgreSQL database, the embedded broker, the manifest's sensor ticking by
itself and runs launched through the queued run coordinator (each in its own process and Spark).

The fault is real: the sink topic is deleted on the broker while new data waits, so the sensor's
run fails; once the topic exists again the system recovers without anyone touching it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka.admin import AdminClient
from conftest import (
    REPO,
    consume_all,
    create_topic,
    dagster_home_on_postgres,
    kafka_pipeline_yaml,
    produce_json,
    unique_topic,
    write_manifest,
)
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

from dpone_dagster.assets.factory import COMMITTED_OFFSETS
from dpone_dagster.manifest import load_manifest
from dpone_dagster.sources.kafka import default_group_id
from dpone_dagster.state import open_state_store

DAEMON = str(Path(sys.executable).parent / "dagster-daemon")
T = TypeVar("T")

pytestmark = pytest.mark.slow


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, daemon: subprocess.Popen) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert daemon.poll() is None, f"dagster-daemon exited with {daemon.returncode} while waiting for {what}"
        value = probe()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def deployment(broker, tmp_path) -> Iterator[dict[str, Any]]:
    """DAGSTER_HOME (repository dagster.yaml on fresh PostgreSQL) + workspace + manifests dir."""
    home, manifests = tmp_path / "dagster_home", tmp_path / "manifests"
    manifests.mkdir()
    with dagster_home_on_postgres(home) as dagster_env:
        (home / "workspace.yaml").write_text(
            f"load_from:\n  - python_module:\n      module_name: dpone_dagster.definitions\n      working_directory: {REPO}\n"
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_CLUSTER_", "DPONE_CONN_", "DAGSTER_"))},
            **dagster_env,
            "DPONE_MANIFESTS_DIR": str(manifests),
            "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "DPONE_SPARK_MASTER": "local[1]",
        }
        yield {"home": home, "manifests": manifests, "env": env}


@pytest.fixture
def instance(deployment, monkeypatch) -> Iterator[DagsterInstance]:
    for key, value in deployment["env"].items():
        if key.startswith("DAGSTER_"):
            monkeypatch.setenv(key, value)
    with DagsterInstance.from_config(str(deployment["home"])) as opened:
        yield opened


def start_daemon(deployment: dict[str, Any], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [DAEMON, "run", "-w", str(deployment["home"] / "workspace.yaml")],
        cwd=REPO,
        env=deployment["env"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_daemon(daemon: subprocess.Popen) -> None:
    if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)


def manifest_yaml(name: str, src: str, dst: str, state_path: Path, sensor: str = "", dagster: str = "", quality: str = "") -> str:
    sensor_options = f"{{running_by_default: true, minimum_interval_seconds: 5, retry_backoff_seconds: 2{sensor}}}"
    return kafka_pipeline_yaml(
        name, src, dst, state_path, "{mode: incremental_append}", "{delivery: {producer_config: {message.timeout.ms: 5000}}}",
        f"{quality}\ndagster:\n  sensor: {sensor_options}\n{dagster}",
    )


class Pipeline:
    """One manifest of the deployment: its topics, its stored offsets, its runs."""

    def __init__(self, deployment: dict[str, Any], bootstrap: str, name: str, tmp_path: Path, **extra: str):
        self.name, self.bootstrap = name, bootstrap
        self.src, self.dst = unique_topic(f"{name}_src"), unique_topic(f"{name}_dst")
        create_topic(bootstrap, self.src, 2)
        create_topic(bootstrap, self.dst, 2)
        path = write_manifest(deployment["manifests"] / f"{name}.yaml", manifest_yaml(name, self.src, self.dst, tmp_path / name, **extra))
        self.manifest = load_manifest(path)

    def produce(self, values: range, partition: int) -> None:
        produce_json(self.bootstrap, self.src, [{"i": i} for i in values], partition=partition)

    def stored_offsets(self) -> dict[int, int]:
        store = open_state_store(self.manifest.state, self.manifest.name, None)
        try:
            return store.load_offsets(self.src, default_group_id(self.manifest))
        finally:
            store.close()

    def delivered(self) -> list[int]:
        return sorted(r["value"]["i"] for r in consume_all(self.bootstrap, self.dst))

    def delete_sink(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.delete_topics([self.dst])[self.dst].result(timeout=30)

    def runs(self, instance: DagsterInstance, status: DagsterRunStatus) -> list[Any]:
        runs = instance.get_runs(filters=RunsFilter(statuses=[status]))
        return [r for r in runs if AssetKey([self.name]) in (r.asset_selection or ()) or r.tags.get("dpone/pipeline") == self.name]


def test_the_daemon_keeps_topics_in_sync_retries_what_a_retry_can_fix_and_nothing_else(broker, deployment, instance, tmp_path):
    bootstrap = broker.bootstrap_servers
    # Recovers through its sensor: no Dagster retries, the sensor asks again after a failed run.
    by_sensor = Pipeline(deployment, bootstrap, "by_sensor", tmp_path, dagster="  retries: {max_attempts: 1}")
    # Recovers through Dagster's run retries: its sensor gives up after one failure.
    by_retry = Pipeline(
        deployment, bootstrap, "by_retry", tmp_path,
        dagster="  retries: {max_attempts: 3}", sensor=", max_attempts: 1",
    )
    # Fails on its data: neither Dagster nor the sensor runs it again.
    gated = Pipeline(deployment, bootstrap, "gated", tmp_path, quality="quality: {mode: fail, checks: [{type: min_rows, threshold: 1000}]}")
    for pipeline in (by_sensor, by_retry, gated):
        pipeline.produce(range(6), 0)
        pipeline.produce(range(50, 54), 1)

    daemon = start_daemon(deployment, tmp_path / "daemon.log")
    try:
        # 1. The sensors tick by themselves; queued runs materialize the assets.
        for pipeline in (by_sensor, by_retry):
            wait_for(f"{pipeline.name}: a successful run", lambda p=pipeline: p.runs(instance, DagsterRunStatus.SUCCESS), 300, daemon)
            assert pipeline.delivered() == [*range(6), *range(50, 54)]
            event = instance.get_latest_materialization_event(AssetKey([pipeline.name]))
            assert event.asset_materialization.metadata[COMMITTED_OFFSETS].value == {"0": 6, "1": 4}
            assert pipeline.stored_offsets() == {0: 6, 1: 4}

        # 2. The sink topic disappears while new data waits: the next run fails, nothing is
        # committed. Once the topic is back, the system recovers by itself.
        for pipeline in (by_sensor, by_retry):
            pipeline.delete_sink()
            pipeline.produce(range(100, 105), 0)
        for pipeline in (by_sensor, by_retry):
            wait_for(f"{pipeline.name}: a failed run", lambda p=pipeline: p.runs(instance, DagsterRunStatus.FAILURE), 300, daemon)
            assert pipeline.stored_offsets() == {0: 6, 1: 4}
            create_topic(bootstrap, pipeline.dst, 2)
        for pipeline in (by_sensor, by_retry):
            wait_for(f"{pipeline.name}: the waiting records committed", lambda p=pipeline: p.stored_offsets() == {0: 11, 1: 4}, 300, daemon)
            assert pipeline.delivered() == list(range(100, 105))  # the topic was recreated empty

        # The sensor's run failed once; Dagster retried it (a retry may also have started before
        # the topic was back), and a retry of it succeeded: no other run was asked for.
        failures = by_retry.runs(instance, DagsterRunStatus.FAILURE)
        [failed] = [r for r in failures if r.parent_run_id is None]
        assert all(r.root_run_id == failed.run_id for r in failures if r is not failed)
        # The offsets are stored inside the run, a moment before Dagster marks it a success.
        retried = wait_for(
            "by_retry: its retry marked a success",
            lambda: [r for r in by_retry.runs(instance, DagsterRunStatus.SUCCESS) if r.root_run_id == failed.run_id],
            60, daemon,
        )
        assert len(retried) == 1 and int(retried[0].tags["dagster/retry_number"]) == len(failures)
        assert all(r.parent_run_id is None for r in by_sensor.runs(instance, DagsterRunStatus.SUCCESS))

        # 3. A quality gate failure is final: the run is tagged so the daemon leaves it, and the
        # sensor does not ask again for the same data.
        [refused] = wait_for("gated: a failed run", lambda: gated.runs(instance, DagsterRunStatus.FAILURE), 300, daemon)
        time.sleep(12)  # two sensor ticks (minimum_interval_seconds: 5) that must not ask again
        assert [r.run_id for r in instance.get_runs() if AssetKey(["gated"]) in (r.asset_selection or ())] == [refused.run_id]
        tags = instance.get_run_by_id(refused.run_id).tags
        assert tags["dagster/retry_on_asset_or_op_failure"] == "false" and tags["dagster/will_retry"] == "false"
        assert gated.stored_offsets() == {}
    finally:
        stop_daemon(daemon)


def test_the_daemon_runs_a_schedule_and_an_automation_condition(broker, deployment, instance, tmp_path):
    """Both declared instead of a sensor, both launched by the daemon: one run per minute's tick."""
    bootstrap = broker.bootstrap_servers
    off = ", enabled: false"
    scheduled = Pipeline(
        deployment, bootstrap, "scheduled", tmp_path, sensor=off, dagster='  schedule: {cron: "* * * * *", running_by_default: true}'
    )
    automated = Pipeline(deployment, bootstrap, "automated", tmp_path, sensor=off, dagster='  automation: {on_cron: "* * * * *"}')
    for pipeline in (scheduled, automated):
        pipeline.produce(range(3), 0)
        pipeline.produce(range(10, 12), 1)

    daemon = start_daemon(deployment, tmp_path / "daemon.log")
    try:
        for pipeline in (scheduled, automated):
            wait_for(f"{pipeline.name}: a successful run", lambda p=pipeline: p.runs(instance, DagsterRunStatus.SUCCESS), 300, daemon)
            assert pipeline.stored_offsets() == {0: 3, 1: 2}
            assert pipeline.delivered() == [0, 1, 2, 10, 11]
        [run, *_] = scheduled.runs(instance, DagsterRunStatus.SUCCESS)
        assert run.tags["dagster/schedule_name"] == "scheduled_schedule"
        [run, *_] = automated.runs(instance, DagsterRunStatus.SUCCESS)
        assert "dagster/schedule_name" not in run.tags and "dagster/sensor_name" in run.tags, run.tags
    finally:
        stop_daemon(daemon)
