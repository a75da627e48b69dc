"""Every route against the loop a user writes by hand for it, in one process, on one embedded
broker and one source topic of JSON order events.

    python -m bench.routes --messages 1000000 [--route avro --route json_merge ...] [--json]

Per route: (h) one confluent-kafka consumer → json.loads → the route's encoding → one producer;
(e) `run_pipeline` on the route's manifest (the Spark session is started once, before the first
(e), and not counted). Printed per route: throughput e/h, messages per CPU second e/h (the whole
process tree of each phase, the broker excluded), the engine's peak memory (driver, JVM, Python
workers: run at 1M and at 4M messages to see whether it stays flat), the path the engine took,
and pass/fail against the goals (throughput ≥ 1.2, CPU ≥ 0.8).

`postgres_json` is seed 002's route on PostgreSQL: as many rows of a fresh database's
`public.orders` (bench/sql2k.py: 127.0.0.1:5432, user postgres) into Kafka JSON; (h) is a psycopg2
server-side cursor → json.dumps → one producer, (e) a `source.type: postgres` manifest.

Hand loops use the engine's consumer and producer settings (bench/k2k.py), so the figures compare
the loops. The registry is the in-memory one; the hand loops register their schema once and frame
each value as confluent's serializers do (magic byte, schema id, payload).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench import sql2k
from bench.common import (
    TreeSampler,
    create_topic,
    dump_json,
    generate_events,
    machine_info,
    topic_count,
    topic_end_offsets,
)
from bench.k2k import _cpu, _mb, _phase, engine_consumer_config, engine_producer_config

GOALS = {"throughput": 1.2, "cpu": 0.8}
Encode = Callable[[bytes], tuple[bytes, bytes, list[tuple[str, bytes]] | None]]

MANIFEST = """
name: bench_route_{route}
source:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}", schema_registry_url: "{registry}"}}
  topic: {src}
  options: {{group_id: "bench.{group}", start_from: earliest{source_options}}}
sink:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}", schema_registry_url: "{registry}"}}
  topic: {dst}
  strategy: {strategy}
  options: {options}
state: {{type: local, path: "{state}"}}
{quality}
"""

APPEND = "{mode: incremental_append, unique_key: order_id}"
MERGE = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
ROUTES: dict[str, tuple[str, str]] = {  # route -> (strategy, sink options)
    "json_append": (APPEND, "{}"),
    "json_merge": (MERGE, "{}"),
    # Every key repeats (8 countries): the whole batch is produced in source order per key first.
    "json_append_repeated_keys": ("{mode: incremental_append, unique_key: country}", "{}"),
    "json_merge_expectations": (MERGE, "{}"),  # json_merge with the checks of QUALITY
    "json_envelope_headers": (APPEND, "{envelope: dpone, headers: {static: {team: dwh}, lineage: true}}"),
    "avro": (APPEND, "{message_format: avro, schema_registry: {enabled: true}}"),
    "json_schema": (APPEND, "{message_format: json_schema, schema_registry: {enabled: true}}"),
    "protobuf": (APPEND, "{message_format: protobuf, schema_registry: {enabled: true, protobuf_message: 'bench.orders_pb2:Order'}}"),
    "avro_source_to_json": (APPEND, "{}"),
    "json_schema_source_to_json": (APPEND, "{}"),
    "protobuf_source_to_json": (APPEND, "{}"),
    "postgres_json": (MERGE, "{}"),  # bench/sql2k.py's manifest and loop
}
SQL_ROUTES = ("postgres_json",)
# Checks the tasks do not measure: Spark SQL judges them on the batch read again (engine/direct_checks.py).
QUALITY = {
    "json_merge_expectations": (
        "quality: {mode: warn, checks: [{type: unique, columns: [customer_id]}, {type: great_expectations, "
        "expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, min_value: 0, max_value: 5000}}]}"
    ),
}
# Routes that read the events framed by the registry instead of as JSON (a copy of the source topic).
SOURCE_FORMATS = {"avro_source_to_json": "avro", "json_schema_source_to_json": "json_schema", "protobuf_source_to_json": "protobuf"}


def hand_encoder(route: str, src: str, dst: str, registry_url: str) -> Encode:
    """The per-message work a hand-written loop does for `route`."""
    loads, dumps = json.loads, json.dumps
    if route == "avro_source_to_json":
        import fastavro

        reader, parsed = fastavro.schemaless_reader, fastavro.parse_schema(_bench_avro_schema())

        def from_avro(raw: bytes) -> tuple[bytes, bytes, None]:
            event = reader(io.BytesIO(raw[5:]), parsed)
            return dumps(event).encode(), str(event["order_id"]).encode(), None
        return from_avro
    if route == "json_schema_source_to_json":
        return lambda raw: (dumps(event := loads(raw[5:])).encode(), str(event["order_id"]).encode(), None)
    if route == "protobuf_source_to_json":
        from bench.orders_pb2 import FIELDS, Order

        names = [name for name, _ in FIELDS]

        def from_protobuf(raw: bytes) -> tuple[bytes, bytes, None]:
            message = Order.FromString(raw[6:])  # past the frame and the message index
            event = {name: getattr(message, name) for name in names}
            return dumps(event).encode(), str(event["order_id"]).encode(), None
        return from_protobuf
    if route == "json_append_repeated_keys":
        return lambda raw: (dumps(event := loads(raw)).encode(), event["country"].encode(), None)
    if route in ("json_append", "json_merge", "json_merge_expectations"):
        return lambda raw: (dumps(event := loads(raw)).encode(), str(event["order_id"]).encode(), None)
    if route == "json_envelope_headers":
        def envelope(raw: bytes) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
            event = loads(raw)
            value = {"op": "upsert", "data": event, "metadata": {"strategy": "incremental_append", "run_id": "r"}, "source": {"topic": src}, "schema_version": 1}
            return dumps(value).encode(), str(event["order_id"]).encode(), [("team", b"dwh"), ("dpone.source.topic", src.encode())]
        return envelope
    schema_id, framed = _registered(route, dst, registry_url)
    if route == "avro":
        import fastavro

        parsed = fastavro.parse_schema(framed)
        writer = fastavro.schemaless_writer

        def avro(raw: bytes) -> tuple[bytes, bytes, None]:
            event = loads(raw)
            out = io.BytesIO()
            out.write(schema_id)
            writer(out, parsed, event)
            return out.getvalue(), str(event["order_id"]).encode(), None
        return avro
    if route == "protobuf":
        from bench.orders_pb2 import Order

        head = schema_id + b"\x00"  # message indexes [0]: the file's first message
        return lambda raw: (head + Order(**(event := loads(raw))).SerializeToString(), str(event["order_id"]).encode(), None)
    compact = (",", ":")  # as the engine writes JSON Schema values
    return lambda raw: (schema_id + dumps(event := loads(raw), separators=compact).encode(), str(event["order_id"]).encode(), None)


def _registered(route: str, dst: str, registry_url: str) -> tuple[bytes, Any]:
    """Register the route's value schema (as the engine derives it from the events) once."""
    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema import avro, json_schema
    from dpone_dagster.schema.registry import registry_client

    struct = _bench_struct()
    client = registry_client({"url": registry_url})
    if route == "avro":
        schema: Any = avro.spark_to_avro(struct, "orders", "hand")
        kind = "AVRO"
    elif route == "protobuf":
        from bench.orders_pb2 import Order
        from dpone_dagster.schema.protobuf import schema_string

        schema_id = client.register_schema(f"{dst}-value", Schema(schema_string(Order), "PROTOBUF"))
        return b"\x00" + schema_id.to_bytes(4, "big"), None
    else:
        schema = json_schema.spark_to_json_schema(struct, "hand.orders")
        kind = "JSON"
    schema_id = client.register_schema(f"{dst}-value", Schema(json.dumps(schema), kind))
    return b"\x00" + schema_id.to_bytes(4, "big"), schema


def _bench_struct() -> Any:
    """The events' fields as the engine derives them (every field nullable)."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    fields = [("order_id", LongType()), ("customer_id", StringType()), ("status", StringType()), ("amount", DoubleType()),
              ("currency", StringType()), ("items", LongType()), ("channel", StringType()), ("country", StringType()),
              ("created_at", StringType()), ("note", StringType())]
    return StructType([StructField(n, t, True) for n, t in fields])


def _bench_avro_schema() -> dict[str, Any]:
    from dpone_dagster.schema import avro

    return avro.spark_to_avro(_bench_struct(), "orders", "bench")


def registry_copy(bootstrap: str, src: str, registry_url: str, partitions: int, fmt: str) -> str:
    """A copy of `src` with each event framed by the registry in `fmt` (untimed), same partitions."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client

    copy = f"bench_{fmt}_src_{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, copy, partitions)
    schema, kind, encode = _source_encoding(fmt)
    schema_id = registry_client({"url": registry_url}).register_schema(f"{copy}-value", Schema(schema, kind))
    head = b"\x00" + schema_id.to_bytes(4, "big") + (b"\x00" if fmt == "protobuf" else b"")  # protobuf: message index 0
    ends = topic_end_offsets(bootstrap, src)
    consumer = Consumer({**engine_consumer_config(bootstrap)})
    producer = Producer(engine_producer_config(bootstrap))
    consumer.assign([TopicPartition(src, p, 0) for p, end in sorted(ends.items()) if end > 0])
    seen, total = 0, sum(ends.values())
    try:
        while seen < total:
            for m in consumer.consume(10_000, 1.0):
                if m.error() is not None:
                    continue
                value = head + encode(json.loads(m.value()))
                while True:
                    try:
                        producer.produce(copy, value, partition=m.partition())
                        break
                    except BufferError:
                        producer.poll(0.05)
                seen += 1
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError(f"{copy}: events not delivered")
    finally:
        consumer.close()
    return copy


def _source_encoding(fmt: str) -> tuple[str, str, Callable[[dict[str, Any]], bytes]]:
    """(schema text, schema type, event encoder) of a registry-framed copy of the events."""
    if fmt == "avro":
        import fastavro

        schema = _bench_avro_schema()
        parsed, writer = fastavro.parse_schema(schema), fastavro.schemaless_writer

        def avro(event: dict[str, Any]) -> bytes:
            out = io.BytesIO()
            writer(out, parsed, event)
            return out.getvalue()
        return json.dumps(schema), "AVRO", avro
    if fmt == "json_schema":
        from dpone_dagster.schema import json_schema

        compact = (",", ":")
        return json.dumps(json_schema.spark_to_json_schema(_bench_struct(), "bench.orders")), "JSON", lambda e: json.dumps(e, separators=compact).encode()
    from bench.orders_pb2 import Order
    from dpone_dagster.schema.protobuf import schema_string

    return schema_string(Order), "PROTOBUF", lambda e: Order(**{k: v for k, v in e.items() if v is not None}).SerializeToString()


def hand_loop(bootstrap: str, src: str, dst: str, encode: Encode) -> tuple[int, float, int]:
    """Consume every record of `src` once, encode it, produce it to `dst`; (messages, s, failed)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    ends = topic_end_offsets(bootstrap, src)
    total = sum(ends.values())
    consumer = Consumer({**engine_consumer_config(bootstrap)})
    producer = Producer(engine_producer_config(bootstrap))
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    started = time.perf_counter()
    consumer.assign([TopicPartition(src, p, 0) for p, end in sorted(ends.items()) if end > 0])
    seen = 0
    try:
        while seen < total:
            for m in consumer.consume(10_000, 1.0):
                if m.error() is not None:
                    continue
                value, key, headers = encode(m.value())
                while True:
                    try:
                        producer.produce(dst, value, key, headers=headers, on_delivery=report)
                        break
                    except BufferError:
                        producer.poll(0.05)
                seen += 1
            producer.poll(0)
        failed[0] += producer.flush(120)
        return seen, time.perf_counter() - started, failed[0]
    finally:
        consumer.close()


def engine_run(spark: Any, route: str, bootstrap: str, src: str, dst: str, registry_url: str) -> tuple[Any, float]:
    from dpone_dagster.engine.run import run_pipeline
    from dpone_dagster.manifest import parse_manifest

    strategy, options = ROUTES[route]
    with tempfile.TemporaryDirectory(prefix="dpone-bench-route-") as state:
        text = MANIFEST.format(
            route=route, bootstrap=bootstrap, registry=registry_url, src=src, dst=dst, group=uuid.uuid4().hex[:8],
            strategy=strategy, options=options, state=state, quality=QUALITY.get(route, ""),
            source_options=f", message_format: {SOURCE_FORMATS[route]}, schema_registry: {{enabled: true}}" if route in SOURCE_FORMATS else "",
        )
        started = time.perf_counter()
        result = run_pipeline(parse_manifest(text), spark)
        return result, time.perf_counter() - started


def run_routes(
    bootstrap: str, messages: int, partitions: int, routes: list[str], log: Callable[[str], None], spark: Any = None,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    # the broker is left out of CPU and memory: it stores the topics (its memory grows with them)
    sampler = TreeSampler(interval_s=0.5, exclude={broker_pid} if broker_pid else None)
    sampler.start()
    src = f"bench_routes_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, src, partitions)
    log(f"generating {messages} events into {src}")
    generate_events(bootstrap, src, messages, partitions)
    report: dict[str, Any] = {"bench": "routes", "messages": messages, "partitions": partitions, "machine": machine_info(), "routes": {}}
    for route in routes:
        registry_url = f"mock://bench-{uuid.uuid4().hex[:8]}"
        hand_dst, engine_dst = f"bench_{route}_h_{uuid.uuid4().hex[:6]}", f"bench_{route}_e_{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, hand_dst, partitions)
        create_topic(bootstrap, engine_dst, partitions)
        route_src = src
        if route in SOURCE_FORMATS:
            log(f"{route}: copying the events as {SOURCE_FORMATS[route]} (untimed)")
            route_src = registry_copy(bootstrap, src, registry_url, partitions, SOURCE_FORMATS[route])
        if spark is None and route in SQL_ROUTES:
            log("starting Spark (with the PostgreSQL JDBC driver)")
            spark, _ = sql2k.start_spark_with_jdbc()
        if route in SQL_ROUTES:
            hand, engine = _sql_route(spark, sampler, route, bootstrap, messages, partitions, hand_dst, engine_dst, log)
        else:
            log(f"{route}: (h) hand-written loop")
            encode = hand_encoder(route, route_src, hand_dst, registry_url)
            with _phase(sampler, f"{route}_h") as peaks:
                n, seconds, failed = hand_loop(bootstrap, route_src, hand_dst, encode)
            hand = {"messages": n, "seconds": round(seconds, 2), "failed": failed, "cpu": _cpu(peaks)}
            if spark is None:
                log("starting Spark (with the PostgreSQL JDBC driver)")
                spark, _ = sql2k.start_spark_with_jdbc()
            log(f"{route}: (e) dpone run_pipeline")
            with _phase(sampler, f"{route}_e") as peaks:
                result, seconds = engine_run(spark, route, bootstrap, route_src, engine_dst, registry_url)
            engine = {
                "messages": result.messages_produced, "seconds": round(seconds, 2), "path": result.execution_path,
                "in_topic": topic_count(bootstrap, engine_dst), "stage_seconds": result.timings, "cpu": _cpu(peaks),
                "memory_mb": _mb(peaks),
            }
        topics = {"hand": hand_dst, "engine": engine_dst}
        report["routes"][route] = {"hand": hand, "engine": engine, "topics": topics, **ratios(hand, engine)}
    sampler.stop()
    return report


def _sql_route(
    spark: Any, sampler: TreeSampler, route: str, bootstrap: str, rows: int, partitions: int, hand_dst: str, engine_dst: str, log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A database of `rows` orders (untimed), the psycopg2 loop (h) and the engine (e) from it."""
    log(f"{route}: filling a PostgreSQL table with {rows} rows (untimed)")
    database, _ = sql2k.create_database(rows)
    try:
        log(f"{route}: (h) psycopg2 loop")
        with _phase(sampler, f"{route}_h") as peaks:
            loop = sql2k.plain_loop({"host": sql2k.PG_HOST, "port": sql2k.PG_PORT, "user": sql2k.PG_USER, "dbname": database}, bootstrap, hand_dst, False)
        hand = {"messages": loop["messages"], "seconds": round(loop["seconds"], 2), "failed": loop["failed"], "cpu": _cpu(peaks)}
        log(f"{route}: (e) dpone run_pipeline")
        with _phase(sampler, f"{route}_e") as peaks:
            run = sql2k.engine_run(spark, database, bootstrap, engine_dst, partitions)
        if "skipped" in run:
            raise RuntimeError(f"{route}: {run['skipped']}")
        engine = {
            "messages": run["delivered"], "seconds": round(run["seconds"], 2), "path": run["path"],
            "in_topic": topic_count(bootstrap, engine_dst), "stage_seconds": run["stage_seconds"], "cpu": _cpu(peaks),
            "memory_mb": _mb(peaks),
        }
        return hand, engine
    finally:
        sql2k.drop_database(database)


def ratios(hand: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """Throughput and messages per CPU second, engine over hand loop, and the goals they meet."""
    throughput = (engine["messages"] / engine["seconds"]) / (hand["messages"] / hand["seconds"])
    hand_cpu, engine_cpu = hand["cpu"].get("tree_cpu_s") or 0, engine["cpu"].get("tree_cpu_s") or 0
    cpu = (engine["messages"] / engine_cpu) / (hand["messages"] / hand_cpu) if hand_cpu and engine_cpu else None
    return {
        "throughput_ratio": round(throughput, 2),
        "cpu_ratio": round(cpu, 2) if cpu is not None else None,
        "meets_goals": throughput >= GOALS["throughput"] and cpu is not None and cpu >= GOALS["cpu"],
    }


def print_report(report: dict[str, Any], out: Any = sys.stdout) -> None:
    print(f"routes: {report['messages']} messages, {report['partitions']} partitions; goals: throughput e/h ≥ {GOALS['throughput']}, messages per CPU s e/h ≥ {GOALS['cpu']}", file=out)
    print(f"{'route':24} {'hand msg/s':>11} {'dpone msg/s':>12} {'e/h':>6} {'cpu e/h':>8} {'peak MB drv/jvm/py/py-anon':>26}  path       goals", file=out)
    for route, r in report["routes"].items():
        hand, engine = r["hand"], r["engine"]
        memory = engine.get("memory_mb") or {}
        peaks = "/".join(f"{memory.get(k, 0):.0f}" for k in ("driver_rss", "jvm_rss", "workers_rss", "workers_anon"))
        print(
            f"{route:24} {hand['messages'] / hand['seconds']:>11,.0f} {engine['messages'] / engine['seconds']:>12,.0f} "
            f"{r['throughput_ratio']:>6.2f} {r['cpu_ratio'] if r['cpu_ratio'] is not None else '-':>8} {peaks:>26}  {engine['path']:10} "
            f"{'pass' if r['meets_goals'] else 'FAIL'}",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    from dpone_dagster.embedded_broker import EmbeddedBroker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--route", action="append", choices=sorted(ROUTES), help="a route (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        report = run_routes(
            broker.bootstrap_servers, args.messages, args.partitions, args.route or list(ROUTES), lambda m: print(m, file=sys.stderr),
            broker_pid=broker._process.pid if broker._process else None,
        )
    if args.json:
        print(dump_json(report))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
