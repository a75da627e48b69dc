"""The run's success line names every topic the run produced to (replication: the mapped targets)."""

from __future__ import annotations

import uuid

from conftest import create_topic, produce_json, unique_topic

from dpone_dagster.assets.factory import materialization_metadata
from dpone_dagster.cli import main, success_line
from dpone_dagster.engine.results import RunResult


def replication_result() -> RunResult:
    boundary = {
        "method": "replication",
        "control_topic": "__dpone_ctl",
        "commit_group": "dr",
        "targets": {"orders": "dr.orders", "payments": "dr.payments", "refunds": "dr.payments"},
        "partitions": [],
    }
    return RunResult("r1", "dr", status="success", boundary=boundary, rows_extracted=7, messages_produced=7)


def test_replication_success_line_names_every_target_topic():
    line = success_line("", replication_result())
    assert "7 messages produced to dr.orders, dr.payments;" in line
    assert replication_result().target_topics("") == ["dr.orders", "dr.payments"]
    assert materialization_metadata(replication_result())["target_topics"].value == ["dr.orders", "dr.payments"]


def test_other_runs_name_the_sink_topic():
    result = RunResult("r2", "p", status="success", boundary={"method": "offsets"}, messages_produced=3)
    assert "3 messages produced to orders_out;" in success_line("orders_out", result)


def test_dpone_run_of_a_replication_prints_its_target_topics(broker, spark, kafka_env, tmp_path, capsys):
    bs = broker.bootstrap_servers
    a, b = unique_topic("ra"), unique_topic("rb")
    for topic in (a, b):
        create_topic(bs, topic, 1)
        produce_json(bs, topic, [{"n": 1}, {"n": 2}], partition=0)
    path = tmp_path / "dr.yaml"
    path.write_text(f"""
name: dr_targets
source: {{type: kafka, connection_id: kafka_cluster, topics: [{a}, {b}]}}
sink:
  type: kafka
  connection_id: kafka_cluster
  options:
    delivery: {{mode: exactly_once}}
    create_topic: {{enabled: true, partitions: 1}}
    replication: {{topic_mapping: prefix, prefix: "dr.", control_topic: {{name: __ctl_{uuid.uuid4().hex[:8]}}}}}
state: {{type: local, path: {tmp_path}}}
""")
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"4 messages produced to dr.{a}, dr.{b};" in out
