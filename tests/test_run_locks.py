"""Two pipelines that read one topic with one consumer group share its offsets, so they never run
at once: a real run holds the lock while a second real run of the other pipeline is refused, and
both assets sit in one Dagster pool."""

from __future__ import annotations

import threading

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.engine.locks import dagster_pool
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state import open_state_store


def manifest(name: str, src: str, dst: str, state: str, group: str) -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options: {{group_id: {group}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}, strategy: {{mode: incremental_append}}}}
state: {{type: local, path: {state}}}
"""


def test_pipelines_sharing_a_topic_and_group_never_run_at_once(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst_a, dst_b = unique_topic("shared"), unique_topic("shared_a"), unique_topic("shared_b")
    for topic in (src, dst_a, dst_b):
        create_topic(bs, topic, 1)
    produce_json(bs, src, [{"i": i} for i in range(5)], partition=0)
    group = f"{src}.readers"
    first = parse_manifest(manifest("reader_a", src, dst_a, str(tmp_path / "state"), group))
    second = parse_manifest(manifest("reader_b", src, dst_b, str(tmp_path / "state"), group))
    assert dagster_pool(first) == dagster_pool(second) == f"dpone_kafka_{src}_{group}"
    assert build_manifest_asset(first).op.pool == build_manifest_asset(second).op.pool

    reading, release = threading.Event(), threading.Event()

    def pause_while_reading(message: str) -> None:
        if message == "extract: started":
            reading.set()
            release.wait(120)

    outcome: dict[str, object] = {}
    thread = threading.Thread(target=lambda: outcome.update(a=run_pipeline(first, spark, RunRequest(log=pause_while_reading))))
    thread.start()
    try:
        assert reading.wait(120), "the first run never started reading"
        with pytest.raises(RunFailed, match=f"another run holds topic '{src}' with consumer group '{group}'"):
            run_pipeline(second, spark)
    finally:
        release.set()
        thread.join(180)
    assert outcome["a"].messages_produced == 5
    assert consume_all(bs, dst_b) == []  # the refused run produced nothing
    store = open_state_store(first.state, first.name, None)
    try:
        assert store.load_offsets(src, group) == {0: 5}
    finally:
        store.close()
    # Once the first run is done the second one runs, and finds the shared offsets already moved.
    assert run_pipeline(second, spark).messages_produced == 0
