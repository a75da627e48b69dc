"""`make demo`: run the example Kafka→Kafka asset through Dagster on embedded defaults.

Starts the embedded broker, seeds `orders_events` with order events, materializes the
`orders_to_dwh` asset with `dagster asset materialize`, prints what reached `dwh.orders`,
produces a few more events and materializes again (only the new events are read), then stops.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.manifest import load_manifest
from dpone_dagster.state import open_state_store

MANIFEST = Path("manifests/orders_to_dwh.yaml")
ASSET = "orders_to_dwh"


def seed_events(bootstrap: str, topic: str, count: int, first_id: int, rng: random.Random) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    statuses = ["created", "paid", "shipped", "delivered"]
    for i in range(count):
        order_id = first_id + rng.randrange(200)
        event = {
            "order_id": order_id,
            "status": statuses[i % len(statuses)],
            "amount": round(rng.uniform(5, 500), 2),
            "customer": f"c{order_id % 37}",
            "event_seq": first_id + i,
        }
        producer.produce(topic, key=str(order_id).encode(), value=json.dumps(event).encode())
    producer.flush(30)


def read_topic(bootstrap: str, topic: str) -> list[tuple[str | None, dict]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-reader-{uuid.uuid4().hex[:6]}",
            "enable.partition.eof": True,
            "allow.auto.create.topics": False,
        }
    )
    partitions = sorted(consumer.list_topics(timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending, out = set(partitions), []
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
                continue
            out.append((m.key().decode() if m.key() else None, json.loads(m.value())))
    consumer.close()
    return out


def materialize(env: dict[str, str]) -> None:
    command = [
        sys.executable, "-m", "dagster", "asset", "materialize",
        "-m", "dpone_dagster.definitions", "--select", ASSET,
    ]  # fmt: skip
    print(f"\n$ dagster asset materialize -m dpone_dagster.definitions --select {ASSET}", flush=True)
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in (completed.stdout + completed.stderr).splitlines():
        if any(word in line for word in ("plan:", "extract:", "commit:", "RUN_SUCCESS", "RUN_FAILURE", "Error", "error")):
            print("  " + line.strip()[:200])
    if completed.returncode != 0:
        print(completed.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"materialization failed (exit {completed.returncode})")


def main() -> None:
    manifest = load_manifest(MANIFEST)
    source_topic = manifest.source.topic
    sink_topic = manifest.sink.topic
    rng = random.Random(7)
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        print(f"embedded broker on {bootstrap}")
        admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the result arrives
        admin.create_topics([NewTopic(source_topic, 3, 1)])[source_topic].result(timeout=30)
        seed_events(bootstrap, source_topic, 1000, 1, rng)
        print(f"seeded {source_topic} with 1000 order events (200 orders)")

        # The embedded broker starts empty, so offsets kept from an earlier demo no longer apply.
        store = open_state_store(manifest.state, manifest.name)
        store.reset_offsets(source_topic, manifest.source.options.group_id or f"dpone.{manifest.name}", None)
        store.close()

        dagster_home = Path(tempfile.mkdtemp(prefix="dpone-demo-dagster-"))
        env = {
            **os.environ,
            "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bootstrap,
            "DAGSTER_HOME": str(dagster_home),
            "DPONE_MANIFESTS_DIR": str(MANIFEST.parent),
            "PYTHONWARNINGS": "ignore",
        }
        materialize(env)
        first = read_topic(bootstrap, sink_topic)
        print(f"\n{sink_topic} now holds {len(first)} messages (one per order: keep_last per key). Sample:")
        for key, value in sorted(first, key=lambda kv: int(kv[0] or 0))[:3]:
            print(f"  key={key} value={json.dumps(value)}")

        seed_events(bootstrap, source_topic, 100, 1001, rng)
        print(f"\nproduced 100 more events to {source_topic}; materializing again reads only those")
        materialize(env)
        second = read_topic(bootstrap, sink_topic)
        print(f"\n{sink_topic} now holds {len(second)} messages ({len(second) - len(first)} from the second run)")
    print("embedded broker stopped")


if __name__ == "__main__":
    main()
