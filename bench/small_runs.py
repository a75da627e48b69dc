"""Small runs, cold against warm: what one run of N messages costs end to end when every run starts
its own Spark (cold) and when runs share a long-lived Spark Connect server (warm).

    python -m bench.small_runs --small 1000 [--repeat 3] [--json]

For each of `dpone run` and `dagster asset materialize` (the same manifest, a Kafka -> Kafka
incremental_append on the embedded broker), N new messages are produced before every run and the
run is timed as a whole process. Warm runs go to a server started with `dpone spark-server start`
(its start and one warm-up run are reported, not counted). Afterwards the target must hold every
message exactly once and the stored offsets must equal the source's end: a fast wrong run fails.

Goals: warm `dpone run` <= 1.5 s, warm materialize <= 6 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.common import create_topic
from dpone_dagster.embedded_broker import EmbeddedBroker

GOALS = {"warm_run_s": 1.5, "warm_materialize_s": 6.0}

MANIFEST = """
name: small_runs
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append}}
state: {{type: local, path: {state}}}
"""


def produce(bootstrap: str, topic: str, count: int, first: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(topic, json.dumps({"order_id": i, "status": "paid", "amount": i % 500 + 0.5}).encode(), str(i).encode())
    assert producer.flush(30) == 0


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return elapsed, done.stdout


def stage_seconds(stdout: str) -> dict[str, float]:
    """The run's own stage timings from `dpone run --format json` (the engine, without process
    start, imports and session creation)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line).get("timings", {})
    return {}


def target_count(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records, distinct order ids) in the target, read until every partition reports EOF."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "enable.partition.eof": True})
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending, ids, records = set(partitions), set(), 0
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
                continue
            records += 1
            ids.add(json.loads(m.value())["order_id"])
    consumer.close()
    return records, len(ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1000, help="messages per run")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per mode")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--server-conf", action="append", default=[], help="KEY=VALUE for the Connect server (via DPONE_SPARK_CONF)")
    args = parser.parse_args(argv)
    python = sys.executable
    figures: dict[str, Any] = {"messages_per_run": args.small, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        work = Path(tmp)
        bs = broker.bootstrap_servers
        create_topic(bs, "orders", 2)
        create_topic(bs, "orders_out", 2)
        (work / "manifests").mkdir()
        path = work / "manifests" / "small_runs.yaml"
        path.write_text(MANIFEST.format(src="orders", dst="orders_out", state=work / "state"))
        env = {
            **os.environ,
            "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs,
            "DPONE_MANIFESTS_DIR": str(work / "manifests"),
            "DAGSTER_HOME": str(work / "dagster_home"),
        }
        env.pop("DPONE_SPARK_REMOTE", None)
        # An installed package has its bytecode (pip compiles it); an editable checkout run with
        # PYTHONDONTWRITEBYTECODE would compile ~130 modules in every run (~0.16 s).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        (work / "dagster_home").mkdir()
        run = [python, "-m", "dpone_dagster.cli", "run", str(path), "--format", "json"]
        materialize = [python, "-m", "dagster", "asset", "materialize", "-m", "dpone_dagster.definitions", "--select", "small_runs"]
        sent = 0

        stages: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}

        def series(command: list[str], run_env: dict[str, str], count: int, kind: str | None = None) -> list[float]:
            nonlocal sent
            out = []
            for _ in range(count):
                produce(bs, "orders", args.small, sent)
                sent += args.small
                elapsed, stdout = timed(command, run_env, work)
                out.append(round(elapsed, 2))
                if kind:
                    stages[kind].append(stage_seconds(stdout))
            return out

        figures["cold_run_s"] = series(run, env, args.repeat, "cold")
        figures["cold_materialize_s"] = series(materialize, env, args.repeat)
        server_started = time.perf_counter()
        server_env = {**env, "DPONE_SPARK_CONF": json.dumps(dict(item.split("=", 1) for item in args.server_conf))}
        subprocess.run([python, "-m", "dpone_dagster.cli", "spark-server", "start", "--port", "15012"], env=server_env, cwd=work, check=True, capture_output=True)
        figures["server_start_s"] = round(time.perf_counter() - server_started, 2)
        warm_env = {**env, "DPONE_SPARK_REMOTE": "sc://127.0.0.1:15012"}
        try:
            figures["warm_up_run_s"] = series(run, warm_env, 1)[0]
            figures["warm_run_s"] = series(run, warm_env, args.repeat, "warm")
            figures["warm_materialize_s"] = series(materialize, warm_env, args.repeat)
        finally:
            subprocess.run([python, "-m", "dpone_dagster.cli", "spark-server", "stop"], env=env, cwd=work, check=False, capture_output=True)
        records, distinct = target_count(bs, "orders_out")
        figures["check"] = {"sent": sent, "delivered": records, "distinct": distinct, "ok": records == distinct == sent}
    for kind, runs in stages.items():
        figures[f"{kind}_engine_s"] = round(statistics.median(sum(t.values()) for t in runs), 2)
        figures[f"{kind}_stages_s"] = {name: round(statistics.median(t.get(name, 0.0) for t in runs), 2) for name in runs[0]}
    for key in ("cold_run_s", "cold_materialize_s", "warm_run_s", "warm_materialize_s"):
        figures[key.replace("_s", "_median_s")] = round(statistics.median(figures[key]), 2)
    figures["ratios"] = {
        "run cold/warm": round(figures["cold_run_median_s"] / figures["warm_run_median_s"], 1),
        "materialize cold/warm": round(figures["cold_materialize_median_s"] / figures["warm_materialize_median_s"], 1),
    }
    figures["goals"] = {
        name: {"goal_s": goal, "measured_s": figures[name.replace("_s", "_median_s")], "pass": figures[name.replace("_s", "_median_s")] <= goal}
        for name, goal in GOALS.items()
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{args.small} messages per run, median of {args.repeat} (seconds, whole process):")
        print(f"  dpone run              cold {figures['cold_run_median_s']:6.2f}   warm {figures['warm_run_median_s']:6.2f}   cold/warm {figures['ratios']['run cold/warm']}")
        print(f"  dagster materialize    cold {figures['cold_materialize_median_s']:6.2f}   warm {figures['warm_materialize_median_s']:6.2f}   cold/warm {figures['ratios']['materialize cold/warm']}")
        print(f"  engine stages of dpone run (sum)   cold {figures['cold_engine_s']:6.2f}   warm {figures['warm_engine_s']:6.2f}")
        print(f"  warm stages: {figures['warm_stages_s']}")
        print(f"  server start {figures['server_start_s']} s, first warm run {figures['warm_up_run_s']} s")
        for name, goal in figures["goals"].items():
            print(f"  goal {name} <= {goal['goal_s']} s: {goal['measured_s']} s {'PASS' if goal['pass'] else 'FAIL'}")
        print(f"  check: {figures['check']}")
    return 0 if figures["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
