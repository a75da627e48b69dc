from __future__ import annotations

from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.manifest import parse_manifest


def test_kafka_to_kafka_round_trip(broker, spark, kafka_env, tmp_path):
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(broker.bootstrap_servers, src, 3)
    create_topic(broker.bootstrap_servers, dst, 2)
    for p in range(3):
        produce_json(broker.bootstrap_servers, src, [{"order_id": p * 100 + i, "amount": i * 1.5} for i in range(50)], partition=p)
    manifest = parse_manifest(
        f"""
name: smoke
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
state: {{type: local, path: {tmp_path}/state}}
"""
    )
    logs: list[str] = []
    result = run_pipeline(manifest, spark, RunRequest(log=logs.append))
    assert result.status == "success", result.error
    assert result.rows_extracted == 150
    assert result.messages_produced == 150
    out = consume_all(broker.bootstrap_servers, dst)
    assert sorted(int(r["key"]) for r in out) == sorted(p * 100 + i for p in range(3) for i in range(50))
    assert {r["value"]["order_id"]: r["value"]["amount"] for r in out}[105] == 7.5
    assert result.committed_offsets == {0: 50, 1: 50, 2: 50}
    again = run_pipeline(manifest, spark, RunRequest())
    assert again.rows_extracted == 0 and again.messages_produced == 0
