"""Exactly-once Kafka → Kafka replication: the engine against a plain transactional copy loop, on
one embedded broker, in one process.

    python -m bench.replication --messages 300000 [--partitions 6] [--json]
    python -m bench.replication --messages 200 --value-bytes 900000    # large records

Phases:
  generate  JSON order events (~230 bytes) with keys, two headers and explicit timestamps
  (t) txn   one consumer (read_committed) → one transactional producer, single-threaded; one
            transaction per partition (or per --txn-records records), each also writing a control
            record, keeping key/value/headers/timestamp/partition
  (r) dpone run_pipeline of a replication manifest (prefix mapping, partition_mapping keep,
            replicate_headers, keep_timestamps), the code the Dagster asset runs; the Spark
            session is started (and timed) before (r)

After each copy the target is read back read_committed and compared with the source record by
record (count, key, value, headers, timestamp per partition, in order), so a fast wrong copy
never passes. Goals: stage r/t >= 1.0 and whole-run r/t >= 0.8 (stretch 1.5) at 2M records.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
    MB,
    TreeSampler,
    create_topic,
    dump_json,
    machine_info,
    order_event,
    parse_settings,
    rate,
)
from bench.k2k import start_spark, stdout_to_stderr

TIMESTAMP_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
GOAL_STAGE = 1.0
GOAL_RUN = 0.8
STRETCH = 1.5


@dataclass
class Phase:
    name: str
    messages: int
    seconds: float
    verified: bool = False
    memory_mb: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msgs_per_s": round(rate(self.messages, self.seconds)),
            "verified": self.verified,
            "memory_mb": self.memory_mb,
            "cpu": self.cpu,
            **self.details,
        }


# --------------------------------------------------------------------------- source


def record_value(i: int, value_bytes: int | None) -> bytes:
    value = order_event(i)
    if value_bytes and value_bytes > len(value):
        # Still JSON: the padding goes into a string field.
        pad = value_bytes - len(value) - len(',"pad":""')
        value = value[:-1] + b',"pad":"' + b"x" * max(0, pad) + b'"}'
    return value


def generate(bootstrap: str, topic: str, messages: int, partitions: int, value_bytes: int | None) -> dict[str, Any]:
    """Keyed records with headers and explicit timestamps, round-robin over the partitions."""
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "linger.ms": 50,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 262_144,
        "message.max.bytes": 2_000_000,
        "acks": 1,
    })
    failed = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    started = time.perf_counter()
    total = 0
    for i in range(messages):
        value = record_value(i, value_bytes)
        total += len(value)
        headers = [("origin", b"bench"), ("seq", str(i).encode())]
        while True:
            try:
                producer.produce(
                    topic, value, b"order-%d" % i, i % partitions, on_delivery=on_delivery,
                    timestamp=TIMESTAMP_BASE_MS + i, headers=headers,
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    seconds = time.perf_counter() - started
    if remaining or failed[0]:
        raise RuntimeError(f"generate: {failed[0]} failed, {remaining} undelivered")
    return {"messages": messages, "seconds": round(seconds, 2), "msgs_per_s": round(rate(messages, seconds)),
            "avg_value_bytes": round(total / max(1, messages), 1)}


# --------------------------------------------------------------------------- verification


def digest(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, str]]:
    """Per partition: (records, sha256 over key/value/headers/timestamp in log order), read_committed."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-verify-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
    })
    hashes = {p: hashlib.sha256() for p in range(partitions)}
    counts = dict.fromkeys(range(partitions), 0)
    done: set[int] = set()
    idle = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        while len(done) < partitions:
            batch = consumer.consume(10_000, 1.0)
            idle = 0 if batch else idle + 1
            if idle > 30:
                raise RuntimeError(f"verify {topic}: no progress (done {sorted(done)})")
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise RuntimeError(f"verify {topic}: {err}")
                h = hashes[m.partition()]
                key, value = m.key() or b"", m.value() or b""
                h.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
                h.update(repr(m.headers()).encode() + m.timestamp()[1].to_bytes(8, "big"))
                counts[m.partition()] += 1
    finally:
        consumer.close()
    return {p: (counts[p], hashes[p].hexdigest()) for p in range(partitions)}


def same_records(expected: dict[int, tuple[int, str]], got: dict[int, tuple[int, str]], what: str) -> bool:
    if expected != got:
        diff = {p: (expected.get(p), got.get(p)) for p in expected if expected.get(p) != got.get(p)}
        raise RuntimeError(f"{what}: target differs from the source (partition: (source, target)) {diff}")
    return True


# --------------------------------------------------------------------------- (t) the copy loop


def txn_copy(bootstrap: str, src: str, dst: str, control: str, partitions: int, per_txn: int | None) -> tuple[int, int]:
    """Copy every partition of `src` to the same partition of `dst`, transactionally; (records, transactions)."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    from dpone_dagster.kafka.config import producer_config
    from dpone_dagster.kafka.inspect import make_consumer, verified_watermarks
    from dpone_dagster.manifest.models import DeliveryOptions

    inspect = make_consumer({"bootstrap.servers": bootstrap}, "bench-plan")
    try:
        ends = {p: wm.high for p, wm in verified_watermarks(inspect, src, list(range(partitions))).items()}
    finally:
        inspect.close()
    producer = Producer({
        **producer_config({"bootstrap.servers": bootstrap}, DeliveryOptions(mode="exactly_once")),
        "transactional.id": f"bench-txn-{uuid.uuid4().hex[:8]}",
    })
    producer.init_transactions(30)
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-txn-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
    })
    produce, poll = producer.produce, producer.poll
    records = transactions = 0

    def commit(partition: int, next_offset: int) -> None:
        nonlocal transactions
        produce(control, b'["bench","%s",%d]' % (src.encode(), partition), b'{"offset":%d}' % next_offset, 0)
        producer.commit_transaction()
        transactions += 1

    try:
        for p in range(partitions):
            end = ends[p]
            consumer.assign([TopicPartition(src, p, 0)])
            producer.begin_transaction()
            in_txn = position = 0
            while position < end:
                # Never ask for more than is left: consume() waits its full timeout for a short batch.
                for m in consumer.consume(min(10_000, end - position), 1.0):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise RuntimeError(f"txn copy: {m.error()}")
                    while True:
                        try:
                            produce(dst, m.value(), m.key(), p, headers=m.headers(), timestamp=m.timestamp()[1])
                            break
                        except BufferError:
                            poll(0.05)
                    position = m.offset() + 1
                    records += 1
                    in_txn += 1
                    if per_txn and in_txn >= per_txn and position < end:
                        commit(p, position)
                        producer.begin_transaction()
                        in_txn = 0
                poll(0)
            commit(p, end)
    finally:
        consumer.close()
    return records, transactions


# --------------------------------------------------------------------------- (r) the engine


MANIFEST = """
name: bench_replication
source:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}"}}
  topic: {src}
  options: {{start_from: earliest{source_extra}}}
sink:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}"}}
  options:
    delivery: {{mode: exactly_once}}
    create_topic: {{enabled: true, partitions: {partitions}}}
    replication:
      topic_mapping: prefix
      prefix: "{prefix}"
      partition_mapping: keep
      replicate_headers: true
      keep_timestamps: true
      control_topic: {{name: "{control}"}}
{replication_extra}
state: {{type: local, path: "{state}"}}
"""


def engine_run(spark: Any, bootstrap: str, src: str, partitions: int, state_dir: str,
               replication_options: dict[str, Any], source_options: dict[str, Any], log: Any) -> tuple[Any, str]:
    from dpone_dagster.engine.run import RunRequest, run_pipeline
    from dpone_dagster.manifest import parse_manifest

    prefix = f"r{uuid.uuid4().hex[:6]}."
    text = MANIFEST.format(
        bootstrap=bootstrap, src=src, partitions=partitions, prefix=prefix, state=state_dir,
        control=f"__bench_ctl_{uuid.uuid4().hex[:8]}",
        source_extra="".join(f", {k}: {v}" for k, v in source_options.items()),
        replication_extra="".join(f"      {k}: {v}\n" for k, v in replication_options.items()).rstrip("\n"),
    )
    result = run_pipeline(parse_manifest(text), spark, RunRequest(log=log))
    return result, prefix + src


# --------------------------------------------------------------------------- the benchmark


def _phase(sampler: TreeSampler | None, name: str) -> Any:
    from contextlib import nullcontext

    return sampler.phase(name) if sampler is not None else nullcontext(None)


def run_bench(
    bootstrap: str, args: argparse.Namespace, sampler: TreeSampler | None, log: Any, spark: Any = None
) -> dict[str, Any]:
    """Generate, run the phases of `args.only`, verify each target; a `spark` passed in is used as is."""
    src = f"bench_rsrc_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, src, args.partitions)
    log(f"generating {args.messages} records into {src} ({args.partitions} partitions)")
    with _phase(sampler, "generate") as peaks:
        generated = generate(bootstrap, src, args.messages, args.partitions, args.value_bytes)
    report: dict[str, Any] = {
        "bench": "replication", "messages": args.messages, "partitions": args.partitions,
        "generate": {**generated, "memory_mb": peaks.as_mb() if peaks else {}}, "phases": {},
    }
    expected = digest(bootstrap, src, args.partitions)
    if sum(n for n, _ in expected.values()) != args.messages:
        raise RuntimeError(f"source holds {sum(n for n, _ in expected.values())} records, not {args.messages}")
    phases: dict[str, Phase] = {}
    only = set(args.only.split(","))

    if "t" in only:
        dst, control = f"bench_t_{uuid.uuid4().hex[:8]}", f"__bench_tctl_{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, dst, args.partitions)
        create_topic(bootstrap, control, 1)
        log(f"(t) transactional copy loop ({args.txn_records or 'one transaction per partition'})")
        with _phase(sampler, "t") as peaks:
            started = time.perf_counter()
            records, transactions = txn_copy(bootstrap, src, dst, control, args.partitions, args.txn_records)
            seconds = time.perf_counter() - started
        phases["t"] = Phase("t", records, seconds, memory_mb=peaks.as_mb() if peaks else {},
                            cpu=peaks.cpu() if peaks else {}, details={"transactions": transactions, "target": dst})
        phases["t"].verified = same_records(expected, digest(bootstrap, dst, args.partitions), "(t)")

    if "r" in only:
        if spark is None:
            log("starting Spark")
            with _phase(sampler, "spark_start") as peaks:
                spark, start = start_spark()
            report["spark_start"] = {**start, "memory_mb": peaks.as_mb() if peaks else {}}
        with tempfile.TemporaryDirectory(prefix="dpone-bench-state-") as state_dir:
            log("(r) dpone run_pipeline (replication)")
            with _phase(sampler, "r") as peaks:
                started = time.perf_counter()
                result, target = engine_run(spark, bootstrap, src, args.partitions, state_dir,
                                            parse_settings(args.replication), parse_settings(args.source_option), log)
                seconds = time.perf_counter() - started
        phases["r"] = Phase("r", result.messages_produced, seconds, memory_mb=peaks.as_mb() if peaks else {},
                            cpu=peaks.cpu() if peaks else {},
                            details={"stage_seconds": result.timings, "target": target,
                                     "replication_options": parse_settings(args.replication)})
        phases["r"].verified = same_records(expected, digest(bootstrap, target, args.partitions), "(r)")

    report["phases"] = {k: v.as_dict() for k, v in phases.items()}
    report["ratios"], report["goals"] = ratios(phases)
    return report


def ratios(phases: dict[str, Phase]) -> tuple[dict[str, float | None], dict[str, bool]]:
    """r/t as throughput ratios (>1: the engine is faster), for the replicate stage and the whole run."""
    t, r = phases.get("t"), phases.get("r")
    if t is None or r is None or not t.seconds:
        return {}, {}
    stage_s = r.details["stage_seconds"].get("replicate") or r.seconds
    out = {"stage r/t": round(t.seconds / stage_s, 3), "run r/t": round(t.seconds / r.seconds, 3)}
    goals = {
        "verified": t.verified and r.verified,
        f"stage r/t >= {GOAL_STAGE}": out["stage r/t"] >= GOAL_STAGE,
        f"run r/t >= {GOAL_RUN}": out["run r/t"] >= GOAL_RUN,
        f"stage r/t >= {STRETCH} (stretch)": out["stage r/t"] >= STRETCH,
    }
    return out, goals


def print_report(report: dict[str, Any], out: Any = sys.stdout) -> None:
    w = out.write
    gen = report["generate"]
    w(f"replication: {report['messages']} records, {report['partitions']} partitions, ~{gen['avg_value_bytes']} B/value\n")
    w(f"  generate: {gen['seconds']} s ({gen['msgs_per_s']} msg/s)\n")
    if "spark_start" in report:
        s = report["spark_start"]
        w(f"  spark start: session {s['session_s']} s + first job {s['first_job_s']} s (not in (r))\n")
    w(f"  {'phase':<10}{'msgs/s':>9}{'seconds':>9}{'verified':>9}{'driver MB':>10}{'JVM MB':>8}{'workers MB':>11}"
      f"{'CPU s':>7}{'drv':>6}{'jvm':>6}{'py':>6}{'broker':>7}{'load':>6}\n")
    for key, p in report["phases"].items():
        mem, cpu = p.get("memory_mb") or {}, p.get("cpu") or {}
        w(f"  ({key}){'':<7}{p['msgs_per_s']:>9}{p['seconds']:>9}{str(p['verified']):>9}{mem.get('driver_rss', '-'):>10}"
          f"{mem.get('jvm_rss', '-'):>8}{mem.get('workers_rss', '-'):>11}{cpu.get('tree_cpu_s', '-'):>7}"
          f"{cpu.get('driver_cpu_s', '-'):>6}{cpu.get('jvm_cpu_s', '-'):>6}{cpu.get('python_worker_cpu_s', '-'):>6}"
          f"{cpu.get('broker_cpu_s', '-'):>7}{cpu.get('load_end', '-'):>6}\n")
    r = report["phases"].get("r")
    if r:
        w(f"  (r) stages (s): {r['stage_seconds']}\n")
    if report.get("ratios"):
        w(f"  ratios: {report['ratios']}\n  goals: {report['goals']}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--only", default="t,r", help="phases to run: t, r or t,r")
    p.add_argument("--value-bytes", type=int, default=None, help="pad every value to this size (large records)")
    p.add_argument("--txn-records", type=int, default=None, help="(t): records per transaction (default: per partition)")
    p.add_argument("--replication", action="append", default=[], metavar="K=V",
                   help="extra sink.options.replication entry for (r)")
    p.add_argument("--source-option", action="append", default=[], metavar="K=V", help="extra source.options entry for (r)")
    p.add_argument("--no-sampler", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    out = sys.stderr if args.json else sys.stdout

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.2f}] {message}", file=out, flush=True)

    from dpone_dagster.embedded_broker import EmbeddedBroker

    with stdout_to_stderr(args.json), EmbeddedBroker() as broker:
        assert broker._process is not None
        sampler = None if args.no_sampler else TreeSampler(exclude={broker._process.pid}).start()
        try:
            report = run_bench(broker.bootstrap_servers, args, sampler, log)
        finally:
            if sampler is not None:
                sampler.stop()
        from bench.common import hwm_bytes

        report["broker_peak_rss_mb"] = round(hwm_bytes(broker._process.pid) / MB, 1)
    report["machine"] = machine_info()
    if args.json:
        print(dump_json(report))
    else:
        print_report(report)
    return 0 if all(report.get("goals", {}).values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
