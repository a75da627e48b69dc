"""envelope: auto decides per record in a run: a topic that mixes flat records and dpone envelopes."""

from __future__ import annotations

from conftest import consume_raw, create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.manifest import parse_manifest


def test_a_topic_mixing_flat_records_and_envelopes(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("msrc"), unique_topic("mdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    # Mostly flat: the sample says flat, the minority of envelopes must still be unwrapped.
    flat = [{"order_id": i, "status": "new"} for i in range(1, 9)]
    envelopes = [{"op": "upsert", "data": {"order_id": 9, "status": "paid"}}, {"op": "delete", "data": {"order_id": 2}}]
    produce_json(bs, src, [*flat, *envelopes], partition=0)
    manifest = parse_manifest(f"""
name: mixed_envelopes
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {{envelope: auto}}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id, duplicate_policy: allow}}
  options: {{deletes: {{enabled: true, tombstone: true}}}}
state: {{type: local, path: {tmp_path}}}
""")
    result = run_pipeline(manifest, spark)
    assert result.rows_extracted == 10 and result.messages_produced == 10
    # The envelopes are decoded by Spark and put in at their records: the direct path runs.
    assert result.execution_path == "direct", result.notes
    by_key: dict[bytes, list[bytes | None]] = {}
    for r in consume_raw(bs, dst):
        by_key.setdefault(r["key"], []).append(r["value"])
    assert len(by_key[b"9"]) == 1 and b'"status":"paid"' in (by_key[b"9"][0] or b"")
    assert by_key[b"2"][-1] is None and len(by_key[b"2"]) == 2  # the envelope's delete became a tombstone, after the flat record
