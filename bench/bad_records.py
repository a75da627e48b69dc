"""Poisoned topics: the direct path against the Spark SQL path on the same bad records, in one
process, one embedded broker and one Spark session.

    python -m bench.bad_records --messages 200000 [--bad 0.125] [--kind cut --kind mistyped] [--json]

Per kind of bad record (`cut`: values cut short, no JSON object; `mistyped`: whole objects whose
`amount` is text where the manifest declares a double), a fraction `--bad` of a source topic of
order events is bad. The same `incremental_append` manifest with `on_error: dead_letter` runs on
the direct path and then with `DPONE_DIRECT_PATH=off`, each into its own topics. Both must deliver
and dead-letter the same counts (a fast wrong run fails); printed per kind: each path's seconds,
the ratio Spark SQL / direct (goal: ≥ 1.0, the direct path never slower), and the path each took.
One untimed run of each path on a small poisoned topic first starts the session's Python workers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Producer

from bench.common import create_topic, dump_json, machine_info, topic_count
from bench.k2k import engine_manifest_text

GOAL = 1.0
KINDS = ("cut", "mistyped")

# The declared schema makes a mistyped record a bad record (an inferred one would widen to text).
SCHEMA = [{"name": "order_id", "type": "long"}, {"name": "amount", "type": "double"}, {"name": "customer", "type": "string"}]


def record(i: int, bad: bool, kind: str) -> bytes:
    if not bad:
        return json.dumps({"order_id": i, "amount": round(i * 0.25, 2), "customer": f"c{i % 997}"}).encode()
    if kind == "cut":
        return b'{"order_id": %d, "amount": 1' % i
    return json.dumps({"order_id": i, "amount": "n/a", "customer": f"c{i % 997}"}).encode()


def produce(bootstrap: str, topic: str, messages: int, partitions: int, bad: float, kind: str, seed: int = 7) -> int:
    """The topic's records, a `bad` fraction of them bad; the number of bad ones."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 200_000})
    count = 0
    for i in range(messages):
        is_bad = rng.random() < bad
        count += is_bad
        producer.produce(topic, record(i, is_bad, kind), partition=i % partitions)
        if i % 50_000 == 0:
            producer.flush()
    producer.flush()
    return count


def run(spark: Any, kind: str, bootstrap: str, src: str, partitions: int, direct: bool, count: bool = True) -> dict[str, Any]:
    from dpone_dagster.engine.run import run_pipeline
    from dpone_dagster.manifest import parse_manifest

    dst, dlq = f"bench_bad_{kind}_{uuid.uuid4().hex[:6]}", f"bench_bad_{kind}_dlq_{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, dst, partitions)
    create_topic(bootstrap, dlq, 1)
    previous = os.environ.get("DPONE_DIRECT_PATH")
    os.environ["DPONE_DIRECT_PATH"] = "on" if direct else "off"
    try:
        with tempfile.TemporaryDirectory(prefix="dpone-bench-bad-") as state:
            options = {"on_error": "dead_letter", "schema": SCHEMA, "dead_letter": {"topic": dlq}}
            text = engine_manifest_text(bootstrap, src, dst, state, mode="incremental_append", source_options=options)
            started = time.perf_counter()
            result = run_pipeline(parse_manifest(text), spark)
            seconds = time.perf_counter() - started
    finally:
        if previous is None:
            os.environ.pop("DPONE_DIRECT_PATH", None)
        else:
            os.environ["DPONE_DIRECT_PATH"] = previous
    outcome = {"seconds": round(seconds, 2), "path": result.execution_path, "stage_seconds": result.timings}
    if count:  # each count waits out the broker's cache: both at once
        with ThreadPoolExecutor(2) as pool:
            outcome["delivered"], outcome["dead_lettered"] = pool.map(lambda topic: topic_count(bootstrap, topic), (dst, dlq))
    return outcome


def bench(bootstrap: str, spark: Any, messages: int, partitions: int, bad: float, kinds: list[str], log: Any, warm_up: bool = True) -> dict[str, Any]:
    report: dict[str, Any] = {"bench": "bad_records", "messages": messages, "bad": bad, "machine": machine_info(), "kinds": {}}
    if warm_up:  # the first run of a session starts its Python workers: untimed
        warm = f"bench_bad_warm_{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, warm, partitions)
        produce(bootstrap, warm, 2_000, partitions, bad, "cut")
        for direct in (True, False):
            run(spark, "cut", bootstrap, warm, partitions, direct, count=False)
    for kind in kinds:
        src = f"bench_bad_src_{kind}_{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, src, partitions)
        n_bad = produce(bootstrap, src, messages, partitions, bad, kind)
        log(f"{kind}: {n_bad} bad records of {messages}; direct path")
        direct = run(spark, kind, bootstrap, src, partitions, direct=True)
        log(f"{kind}: Spark SQL path")
        spark_sql = run(spark, kind, bootstrap, src, partitions, direct=False)
        expected = (messages - n_bad, n_bad)
        for name, outcome in (("direct", direct), ("spark_sql", spark_sql)):
            if (outcome["delivered"], outcome["dead_lettered"]) != expected:
                raise SystemExit(f"{kind}, {name}: delivered/dead-lettered {outcome['delivered']}/{outcome['dead_lettered']}, expected {expected}")
        ratio = round(spark_sql["seconds"] / direct["seconds"], 2)
        report["kinds"][kind] = {"bad_records": n_bad, "direct": direct, "spark_sql": spark_sql, "ratio": ratio, "pass": ratio >= GOAL}
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['messages']:,} messages, {report['bad']:.1%} bad, dead-lettered (goal: Spark SQL / direct ≥ {GOAL})")
    print(f"{'kind':<10} {'bad':>8} {'direct s':>9} {'spark_sql s':>12} {'ratio':>6}  paths")
    for kind, row in report["kinds"].items():
        paths = f"{row['direct']['path']} / {row['spark_sql']['path']}"
        print(f"{kind:<10} {row['bad_records']:>8,} {row['direct']['seconds']:>9} {row['spark_sql']['seconds']:>12} {row['ratio']:>6}  {paths}  {'pass' if row['pass'] else 'FAIL'}")


def main(argv: list[str] | None = None) -> int:
    from bench.k2k import start_spark
    from dpone_dagster.embedded_broker import EmbeddedBroker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--bad", type=float, default=0.125, help="the fraction of bad records")
    parser.add_argument("--kind", action="append", choices=KINDS, help="a kind of bad record (default: both)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        spark, _ = start_spark()
        report = bench(broker.bootstrap_servers, spark, args.messages, args.partitions, args.bad, args.kind or list(KINDS), lambda m: print(m, file=sys.stderr))
    print(dump_json(report) if args.json else "", end="")
    if not args.json:
        print_report(report)
    return 0 if all(row["pass"] for row in report["kinds"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
