"""The code location as users see it: `dagster-webserver` started headless, queried over GraphQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dpone_dagster.embedded_broker import free_port

ROOT = Path(__file__).resolve().parent.parent

QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        locationOrLoadError {
          __typename
          ... on PythonError { message }
          ... on RepositoryLocation {
            repositories {
              name
              assetNodes {
                assetKey { path }
                dependencyKeys { path }
                isPartitioned
                partitionDefinition { description }
                hasAssetChecks
              }
              sensors { name }
            }
          }
        }
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    home = tmp_path_factory.mktemp("dagster_home")
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DPONE_MANIFESTS_DIR": str(ROOT / "manifests"),
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "127.0.0.1:1",  # loading the location needs no broker
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"webserver exited: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.5)
    else:
        os.killpg(process.pid, signal.SIGTERM)
        raise RuntimeError("webserver did not answer /server_info within 120 s")
    yield url
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)


def test_location_loads_with_assets_partitions_and_sensors(webserver):
    response = httpx.post(f"{webserver}/graphql", json={"query": QUERY}, timeout=60)
    response.raise_for_status()
    [entry] = response.json()["data"]["workspaceOrError"]["locationEntries"]
    assert entry["name"] == "dpone_dagster"
    location = entry["locationOrLoadError"]
    assert location["__typename"] == "RepositoryLocation", location
    [repository] = location["repositories"]
    nodes = {"/".join(n["assetKey"]["path"]): n for n in repository["assetNodes"]}
    assert {"orders_to_dwh", "orders_hourly", "kafka/orders_events"} <= set(nodes)
    assert nodes["orders_to_dwh"]["dependencyKeys"] == [{"path": ["kafka", "orders_events"]}]
    assert nodes["orders_hourly"]["isPartitioned"]
    assert "Hourly" in nodes["orders_hourly"]["partitionDefinition"]["description"]
    assert not nodes["orders_to_dwh"]["isPartitioned"]
    assert nodes["orders_to_dwh"]["hasAssetChecks"]  # min_rows and source_target_count
    sensors = {s["name"] for s in repository["sensors"]}
    assert {"orders_to_dwh_on_orders_events", "orders_hourly_on_orders_events"} <= sensors
