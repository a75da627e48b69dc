"""The Dagster resources are what a run uses: the Kafka resource's `extra_config` reaches every
client the run creates (read tasks, record and dead-letter producers, admin, the control-topic
store and the transactional producers of exactly-once replication), and the Schema Registry
resource's `url` is the registry the run registers with. The real `dagster asset materialize`
runs with run config for both resources and the client spy of tests/client_spy on PYTHONPATH,
which records each real confluent-kafka client's settings in the driver and in every Spark task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, consume_all, create_topic, produce_json, unique_topic
from test_client_security import consume_all_raw, records, spy_env

DAGSTER = str(Path(sys.executable).parent / "dagster")
EXTRA = {"client.id": "via-dagster-resource", "socket.keepalive.enable": "true"}


def test_runs_from_dagster_use_the_kafka_and_schema_registry_resources(broker, tmp_path: Path) -> None:
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("res_src"), unique_topic("res_dst"), unique_topic("res_dlq")
    rsrc, rdst, control = unique_topic("res_rsrc"), unique_topic("res_rdst"), unique_topic("res_ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"order_id": i, "amount": i * 1.5} for i in range(4)], partition=0)
    produce_json(bs, src, [b"{not json"], partition=0)  # a bad record: the dead-letter producer runs
    for topic in (rsrc, rdst):
        create_topic(bs, topic, 1)
    produce_json(bs, rsrc, [{"n": i} for i in range(3)], partition=0, key="k")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    # The connection names no Schema Registry: only the resource's url can make the avro sink work.
    (manifests / "etl.yaml").write_text(f"""
name: res_etl
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    schema: [{{name: order_id, type: long}}, {{name: amount, type: double}}]
    on_error: dead_letter
    dead_letter: {{topic: {dlq}, create: true}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    create_topic: {{enabled: true, partitions: 1}}
    message_format: avro
    schema_registry: {{enabled: true}}
state: {{type: local, path: {tmp_path / 'state'}}}
""")
    (manifests / "eos.yaml").write_text(f"""
name: res_eos
source: {{type: kafka, connection_id: kafka_cluster, topic: {rsrc}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {rdst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    replication:
      control_topic: {{name: {control}, commit_group: grp_{rsrc}}}
state: {{type: kafka_control_topic}}
""")
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    env = {
        **spy_env(spy_dir, {"kafka_cluster": {"bootstrap_servers": bs}}),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DPONE_MANIFESTS_DIR": str(manifests),
    }
    (tmp_path / "dagster_home").mkdir()
    run_config = {
        "resources": {
            "kafka": {"config": {"extra_config": EXTRA}},
            "schema_registry": {"config": {"url": f"mock://{src}"}},
        }
    }
    proc = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "dpone_dagster.definitions", "--select", "res_etl,res_eos",
         "--config-json", json.dumps(run_config)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    # The avro sink registered with the resource's registry: values in the registry wire format.
    values = [r["value"] for r in consume_all_raw(bs, dst)]
    assert len(values) == 4 and all(v[:1] == b"\x00" and len(v) > 5 for v in values)
    assert len(consume_all_raw(bs, dlq)) == 1
    assert sorted(r["value"]["n"] for r in consume_all(bs, rdst)) == [0, 1, 2]

    clients = records(spy_dir, "client")
    roles = {(c["kind"], tuple(c["topics"])) for c in clients}
    assert ("Producer", (dst,)) in roles and ("Producer", (dlq,)) in roles and ("AdminClient", ()) in roles
    assert any("transactional.id" in c["config"] for c in clients)  # replication's producers
    assert any(c["kind"] == "Consumer" for c in clients)
    wrong = [(c["kind"], c["topics"], {k: c["config"].get(k) for k in EXTRA}) for c in clients if any(c["config"].get(k) != v for k, v in EXTRA.items())]
    assert wrong == [], wrong
