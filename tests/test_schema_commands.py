"""`dpone schema infer` and `dpone schema physical-plan` against the embedded broker and the
in-memory registry (no registry server can run here)."""

from __future__ import annotations

import json
import uuid

from conftest import create_topic, produce_json, unique_topic

from dpone_dagster.cli import main


def write(tmp_path, src: str, dst: str, sink_options: str = "") -> str:
    path = tmp_path / "m.yaml"
    path.write_text(
        f"""
name: schema_cmd
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  options: {{{sink_options}}}
state: {{type: local, path: {tmp_path}/state}}
"""
    )
    return str(path)


def test_infer_reports_types_nullability_and_confidence(broker, kafka_env, tmp_path, capsys):
    src = unique_topic("inf")
    create_topic(broker.bootstrap_servers, src, 2)
    rows = [{"id": i, "price": 1.5 if i else 2, "note": None if i % 2 else "", "tag": "x"} for i in range(10)]
    rows.append({"id": 10, "price": 3.0, "tag": 7})  # tag seen once as a number; note missing
    produce_json(broker.bootstrap_servers, src, rows, partition=0)
    assert main(["schema", "infer", "--manifest", write(tmp_path, src, "out"), "--format", "json"]) == 0
    fields = {f["name"]: f for f in json.loads(capsys.readouterr().out)["fields"]}
    assert fields["id"]["type"] == "bigint" and not fields["id"]["nullable"] and fields["id"]["confidence"] == 1.0
    assert fields["price"]["type"] == "double"  # long and double merge to double
    assert fields["note"]["nullable"] and fields["note"]["empty_strings"] == 5
    assert fields["tag"]["type"] == "string" and fields["tag"]["confidence"] == round(10 / 11, 4)


def test_physical_plan_shows_subject_schema_and_evolution(broker, kafka_env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    src, dst = unique_topic("pp"), unique_topic("ppdst")
    create_topic(broker.bootstrap_servers, src, 1)
    produce_json(broker.bootstrap_servers, src, [{"order_id": 1, "amount": 2.5}], partition=0)
    options = "message_format: avro, schema_registry: {enabled: true, record_name: Order, record_namespace: shop}"
    assert main(["schema", "physical-plan", "--manifest", write(tmp_path, src, dst, options), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["subject"] == f"{dst}-value" and plan["latest_version"] is None
    schema = plan["schema_to_register"]
    assert schema["name"] == "Order" and schema["namespace"] == "shop"
    assert [f["name"] for f in schema["fields"]] == ["order_id", "amount"]
    assert main(["schema", "physical-plan", "--manifest", write(tmp_path, src, dst, options)]) == 0
    assert "# Physical plan for" in capsys.readouterr().out
