"""Prometheus metrics of a run: the textfile a node-exporter collector reads, parsed with
prometheus_client's own parser, and a real Pushgateway (Debian's prometheus-pushgateway, started
here) scraped after the push."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpone_dagster.engine.results import RunResult
from dpone_dagster.manifest.models import MetricsConfig
from dpone_dagster.observability.metrics import export_run_metrics, textfile_path


def samples(text: str, pipeline: str) -> dict[tuple[str, str | None], float]:
    """(metric name, stage label) -> value, for one pipeline's series."""
    found: dict[tuple[str, str | None], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("pipeline") == pipeline and sample.name.startswith("dpone_"):
                found[(sample.name, sample.labels.get("stage"))] = sample.value
    return found


def a_run(status: str, **counts: float) -> RunResult:
    result = RunResult(run_id="r1", pipeline="orders_copy", status=status)
    for name, value in counts.items():
        setattr(result, name, value)
    result.timings = {"extract": 1.5, "load": 2.25}
    return result


def test_the_textfile_holds_the_run_and_a_failure_keeps_the_last_success(tmp_path):
    config = MetricsConfig(textfile_dir=str(tmp_path / "textfile"))
    good = a_run("success", rows_extracted=1000, messages_produced=990, rows_dead_lettered=10, bytes_produced=123456, lag_after=7)
    assert export_run_metrics(config, good, finished_at=1_700_000_000.0) == [str(textfile_path(config, "orders_copy"))]
    text = textfile_path(config, "orders_copy").read_text()
    assert samples(text, "orders_copy") == {
        ("dpone_last_run_records_read", None): 1000,
        ("dpone_last_run_messages_produced", None): 990,
        ("dpone_last_run_records_dead_lettered", None): 10,
        ("dpone_last_run_produced_bytes", None): 123456,
        ("dpone_last_run_duration_seconds", None): 3.75,
        ("dpone_last_run_lag_messages", None): 7,
        ("dpone_last_run_success", None): 1,
        ("dpone_last_run_stage_duration_seconds", "extract"): 1.5,
        ("dpone_last_run_stage_duration_seconds", "load"): 2.25,
        ("dpone_last_run_timestamp_seconds", None): 1_700_000_000.0,
        ("dpone_last_success_timestamp_seconds", None): 1_700_000_000.0,
    }

    failed = a_run("failed", rows_extracted=500)
    export_run_metrics(config, failed, finished_at=1_700_000_600.0)
    after = samples(textfile_path(config, "orders_copy").read_text(), "orders_copy")
    assert after[("dpone_last_run_success", None)] == 0
    assert after[("dpone_last_run_records_read", None)] == 500
    assert after[("dpone_last_run_timestamp_seconds", None)] == 1_700_000_600.0
    assert after[("dpone_last_success_timestamp_seconds", None)] == 1_700_000_000.0  # unchanged
    assert ("dpone_last_run_lag_messages", None) not in after  # unknown after a failed run
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["dpone_orders_copy.prom"]  # no temp files left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pushgateway(tmp_path) -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway")
    assert binary, "prometheus-pushgateway missing: scripts/setup-test-env installs it"
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([binary, f"--web.listen-address={address}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{address}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_pushgateway_keeps_the_last_success_across_a_failed_run(pushgateway):
    config = MetricsConfig(pushgateway_url=pushgateway, job="dpone_test")
    export_run_metrics(config, a_run("success", rows_extracted=40, messages_produced=40), finished_at=1_700_000_000.0)
    export_run_metrics(config, a_run("failed", rows_extracted=12), finished_at=1_700_000_900.0)
    scraped = samples(urllib.request.urlopen(f"{pushgateway}/metrics", timeout=5).read().decode(), "orders_copy")
    assert scraped[("dpone_last_run_success", None)] == 0
    assert scraped[("dpone_last_run_records_read", None)] == 12
    assert scraped[("dpone_last_run_timestamp_seconds", None)] == 1_700_000_900.0
    assert scraped[("dpone_last_success_timestamp_seconds", None)] == 1_700_000_000.0


def test_a_run_writes_its_own_figures_to_the_textfile(broker, spark, kafka_env, tmp_path):
    from conftest import create_topic, produce_json, unique_topic

    from dpone_dagster.engine.run import run_pipeline
    from dpone_dagster.manifest import parse_manifest

    src, dst = unique_topic("metrics_src"), unique_topic("metrics_dst")
    create_topic(broker.bootstrap_servers, src, 2)
    create_topic(broker.bootstrap_servers, dst, 2)
    produce_json(broker.bootstrap_servers, src, [{"order_id": i, "amount": i * 1.5} for i in range(30)], partition=0)
    produce_json(broker.bootstrap_servers, src, [{"order_id": i, "amount": 1.0} for i in range(100, 112)], partition=1)
    textfile_dir = tmp_path / "node_exporter"
    manifest = parse_manifest(
        f"""
name: metrics_pipe
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
state: {{type: local, path: {tmp_path}/state}}
observability: {{metrics: {{textfile_dir: {textfile_dir}}}}}
"""
    )
    result = run_pipeline(manifest, spark)
    found = samples((textfile_dir / "dpone_metrics_pipe.prom").read_text(), "metrics_pipe")
    assert found[("dpone_last_run_records_read", None)] == 42 == result.rows_extracted
    assert found[("dpone_last_run_messages_produced", None)] == 42 == result.messages_produced
    assert found[("dpone_last_run_produced_bytes", None)] == result.bytes_produced > 42 * 20
    assert found[("dpone_last_run_lag_messages", None)] == 0
    assert found[("dpone_last_run_success", None)] == 1
    assert {stage for (name, stage) in found if name == "dpone_last_run_stage_duration_seconds"} == set(result.timings)
    assert {"extract", "load", "commit"} <= set(result.timings)
