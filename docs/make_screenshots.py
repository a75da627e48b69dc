"""Regenerate docs/asset_graph.png and docs/partitioned_asset.png with headless Chromium.

    .venv/bin/python docs/make_screenshots.py

Starts the embedded broker, seeds `orders_events` with timestamped order events, materializes
`orders_to_dwh` and a few `orders_hourly` partitions through `dagster asset materialize`, starts
`dagster-webserver` and captures two pages. Needs Debian's `chromium` and `chromium-driver`.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from dpone_dagster.embedded_broker import EmbeddedBroker, free_port

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1600,1000",
]


def seed(bootstrap: str, start: datetime, hours: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("orders_events", 3, 1)])["orders_events"].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    rng = random.Random(3)
    for i in range(hours * 60):
        ts = start + timedelta(minutes=i)
        event = {"order_id": rng.randrange(500), "status": "paid", "amount": round(rng.uniform(5, 300), 2)}
        producer.produce("orders_events", json.dumps(event).encode(), timestamp=int(ts.timestamp() * 1000))
    producer.flush(30)


def materialize(env: dict[str, str], *args: str) -> None:
    command = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "dpone_dagster.definitions", *args]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)


class Browser:
    """Headless Chromium driven through chromedriver's WebDriver HTTP API."""

    def __init__(self) -> None:
        driver = shutil.which("chromedriver")
        if driver is None:
            raise SystemExit("install Debian's chromium and chromium-driver to take screenshots")
        self.port = free_port()
        self.process = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(50):
            try:
                httpx.get(f"{self.base}/status", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        args = [*CHROMIUM_FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}"]
        capabilities = {"alwaysMatch": {"goog:chromeOptions": {"args": args, "binary": shutil.which("chromium")}}}
        session = httpx.post(f"{self.base}/session", json={"capabilities": capabilities}, timeout=60).json()
        self.session = f"{self.base}/session/{session['value']['sessionId']}"

    def open(self, url: str) -> None:
        httpx.post(f"{self.session}/url", json={"url": url}, timeout=60)
        time.sleep(8)
        # Dismiss the first-visit community dialog if it is shown.
        found = httpx.post(
            f"{self.session}/elements", json={"using": "xpath", "value": "//button[normalize-space()='Skip']"}, timeout=10
        ).json()["value"]
        for element in found:
            element_id = next(iter(element.values()))
            httpx.post(f"{self.session}/element/{element_id}/click", json={}, timeout=10)
            time.sleep(2)

    def screenshot(self, out: Path) -> None:
        data = httpx.get(f"{self.session}/screenshot", timeout=60).json()["value"]
        out.write_bytes(base64.b64decode(data))
        print(f"wrote {out}")

    def close(self) -> None:
        httpx.delete(self.session, timeout=30)
        self.process.terminate()


def main() -> None:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(hours=6)
    home = Path(tempfile.mkdtemp(prefix="dpone-shots-"))
    with EmbeddedBroker() as broker:
        seed(broker.bootstrap_servers, start, 5)
        env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "DAGSTER_HOME": str(home)}
        shutil.rmtree(ROOT / ".dpone" / "state", ignore_errors=True)
        materialize(env, "--select", "orders_to_dwh")
        first, last = start.strftime("%Y-%m-%d-%H:00"), (start + timedelta(hours=3)).strftime("%Y-%m-%d-%H:00")
        materialize(env, "--select", "orders_hourly", "--partition-range", f"{first}...{last}")
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(120):
                try:
                    if httpx.get(f"{base}/server_info", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            browser = Browser()
            try:
                browser.open(f"{base}/asset-groups")
                browser.open(f"{base}/assets/orders_to_dwh?view=lineage&lineageScope=neighbors")
                browser.screenshot(ROOT / "docs" / "asset_graph.png")
                browser.open(f"{base}/assets/orders_hourly?view=partitions")
                browser.screenshot(ROOT / "docs" / "partitioned_asset.png")
            finally:
                browser.close()
        finally:
            os.killpg(server.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
