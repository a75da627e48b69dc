"""The repository's dagster.yaml as production loads it: dagster-postgres storage on a fresh
PostgreSQL database (DAGSTER_PG_* variables), the queued run coordinator and the pools. A broken
production instance config fails here, not on the first deployment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from conftest import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    REPO,
    consume_all,
    create_topic,
    dagster_home_on_postgres,
    kafka_pipeline_yaml,
    produce_json,
    unique_topic,
    write_manifest,
)
from dagster import AssetKey, DagsterInstance, DagsterRunStatus
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

from dpone_dagster.assets.factory import COMMITTED_OFFSETS
from dpone_dagster.manifest import load_manifest
from dpone_dagster.sources.kafka import default_group_id
from dpone_dagster.state import open_state_store

DAGSTER = str(Path(sys.executable).parent / "dagster")


@pytest.fixture(scope="module")
def dagster_home(tmp_path_factory) -> Iterator[tuple[Path, dict[str, str]]]:
    home = tmp_path_factory.mktemp("dagster_home")
    with dagster_home_on_postgres(home) as env:
        yield home, env


def _instance(dagster_home: tuple[Path, dict[str, str]], monkeypatch) -> DagsterInstance:
    home, env = dagster_home
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return DagsterInstance.from_config(str(home))


def _manifest(name: str, src: str, dst: str, state_path: Path) -> str:
    strategy = "{mode: incremental_merge, unique_key: order_id}"
    return kafka_pipeline_yaml(name, src, dst, state_path, strategy, "{create_topic: {enabled: true, partitions: 2}}")


def test_the_repository_instance_config_loads_postgres_storage_queue_and_pools(dagster_home, monkeypatch):
    with _instance(dagster_home, monkeypatch) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        # One slot per pool: two runs of one pipeline never overlap.
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        # The tables live in the module's database.
        with psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=dagster_home[1]["DAGSTER_PG_DB"]) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name IN ('runs', 'event_logs')")
                assert cur.fetchone()[0] == 2


@pytest.mark.slow
def test_dagster_cli_materializes_through_the_repository_instance_on_postgres(broker, dagster_home, tmp_path, monkeypatch):
    """The real `dagster asset materialize` with DAGSTER_HOME holding the repository's dagster.yaml:
    the data reaches the target, and the materialization with its offsets lands in PostgreSQL."""
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("dginst_src"), unique_topic("dginst_dst")
    create_topic(bootstrap, src, 2)
    produce_json(bootstrap, src, [{"order_id": i, "amount": i * 2.0} for i in range(6)], partition=0)
    produce_json(bootstrap, src, [{"order_id": i, "amount": i * 2.0} for i in range(50, 54)], partition=1)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    path = write_manifest(manifests / "inst.yaml", _manifest("dginst_pipe", src, dst, tmp_path / "state"))
    env: dict[str, Any] = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_CLUSTER_", "DPONE_CONN_KAFKA_CLUSTER_", "DAGSTER_"))},
        **dagster_home[1],
        "DPONE_MANIFESTS_DIR": str(manifests),
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bootstrap,
        "DPONE_SPARK_MASTER": "local[2]",
    }
    proc = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "dpone_dagster.definitions", "--select", "dginst_pipe"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = consume_all(bootstrap, dst)
    assert sorted(int(r["key"]) for r in out) == [*range(6), *range(50, 54)]
    assert {int(r["key"]): r["value"]["amount"] for r in out}[52] == 104.0

    with _instance(dagster_home, monkeypatch) as instance:
        event = instance.get_latest_materialization_event(AssetKey(["dginst_pipe"]))
        assert event is not None
        metadata = event.asset_materialization.metadata
        assert metadata["rows_extracted"].value == 10
        assert metadata[COMMITTED_OFFSETS].value == {"0": 6, "1": 4}
        runs = instance.get_runs()
        assert [r.status for r in runs if "dginst_pipe" in str(r.asset_selection)] == [DagsterRunStatus.SUCCESS]
    # ... and the manifest's own state store holds the same offsets.
    manifest = load_manifest(path)
    store = open_state_store(manifest.state, manifest.name, None)
    try:
        assert store.load_offsets(src, default_group_id(manifest)) == {0: 6, 1: 4}
    finally:
        store.close()

