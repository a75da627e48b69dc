"""Kafka → Kafka throughput: the dpone engine against plain confluent-kafka loops, on one embedded
broker, in one process.

    python -m bench.k2k --messages 2000000 [--partitions 6] [--json]
    python -m bench.k2k --messages 2000000 --memory-check      # (c) at messages/2 and messages*2

Phases (each reads the same source topic and writes its own sink topic):
  generate  JSON order events (~200 bytes, unique order_id unless --duplicate-every), one producer
  (a) raw   one consumer (assign all partitions, consume in batches) → one producer, bytes copied
  (b) hand  the same loop with json.loads → key = order_id → json.dumps (what a user writes by hand)
  (c) dpone run_pipeline on an incremental_merge manifest (unique_key order_id, keep_last), the
            code the Dagster asset runs; the Spark session is created (and timed) before (c)

(a) and (b) use the engine's own consumer fetch settings and producer settings (acks=all,
linger.ms=20, batch.num.messages=10000, no compression), so the figures compare the loops, not the
client configuration.

One file on purpose (over 500 lines): the phases run in order and compare like with like, so
they read best side by side; shared helpers live in bench/common.py and bench/variants.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    MB,
    TreeSampler,
    create_topic,
    dump_json,
    generate_events,
    machine_info,
    parse_settings,
    rate,
    topic_count,
    topic_end_offsets,
)
from dpone_dagster.stdio import stdout_for_output_only as stdout_to_stderr  # noqa: F401 - the bench CLIs use it


@dataclass
class PhaseResult:
    name: str
    messages: int
    seconds: float
    delivered: int = 0
    failed: int = 0
    in_topic: int | None = None  # messages found in the sink topic afterwards
    memory_mb: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return rate(self.messages, self.seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msgs_per_s": round(self.msgs_per_s),
            "delivered": self.delivered,
            "failed": self.failed,
            "in_topic": self.in_topic,
            "memory_mb": self.memory_mb,
            "cpu": self.cpu,
            # Messages per CPU second of the driver's process tree (broker excluded): robust
            # against other load on the machine, unlike msgs_per_s.
            "msgs_per_cpu_s": round(self.messages / self.cpu["tree_cpu_s"]) if self.cpu.get("tree_cpu_s") else None,
            **self.details,
        }


# --------------------------------------------------------------------------- client settings


def engine_consumer_config(bootstrap: str) -> dict[str, Any]:
    """The consumer settings the engine's Spark tasks use (kafka_reader), for the plain loops."""
    from dpone_dagster.sources.kafka_reader import ReaderSettings, _consumer_config

    config = _consumer_config(ReaderSettings({"bootstrap.servers": bootstrap}, f"bench-{uuid.uuid4().hex[:8]}"))
    # The plain loops read every partition of one assignment until the planned ends.
    config["enable.partition.eof"] = False
    return config


def engine_producer_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The producer settings the engine derives from a default `delivery:` block."""
    from dpone_dagster.kafka.config import producer_config
    from dpone_dagster.manifest.models import DeliveryOptions

    config = producer_config({"bootstrap.servers": bootstrap}, DeliveryOptions())
    config.update(overrides or {})
    return config


# --------------------------------------------------------------------------- (a) and (b)


class _Deliveries:
    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1


def copy_loop(
    bootstrap: str,
    src: str,
    dst: str,
    ends: dict[int, int],
    transform: bool,
    consume_batch: int = 10_000,
    consumer_overrides: dict[str, Any] | None = None,
    producer_overrides: dict[str, Any] | None = None,
) -> tuple[int, float, _Deliveries]:
    """Consume [0, end) of every partition of `src` with one consumer and produce it to `dst`.

    transform=False: raw bytes, same partition. transform=True: json.loads → key = order_id →
    json.dumps, partitioned by the new key. Returns (messages, seconds, deliveries)."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    total = sum(ends.values())
    consumer = Consumer({**engine_consumer_config(bootstrap), **(consumer_overrides or {})})
    producer = Producer(engine_producer_config(bootstrap, producer_overrides))
    deliveries = _Deliveries()
    started = time.perf_counter()
    consumer.assign([TopicPartition(src, p, 0) for p, end in sorted(ends.items()) if end > 0])
    produce, poll = producer.produce, producer.poll
    loads, dumps = json.loads, json.dumps
    seen = 0
    empty = 0
    try:
        while seen < total:
            messages = consumer.consume(consume_batch, 1.0)
            if not messages:
                empty += 1
                if empty >= 30:
                    raise RuntimeError(f"{src}: stuck at {seen} of {total} messages")
                continue
            empty = 0
            for m in messages:
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"{src}: {m.error()}")
                if transform:
                    event = loads(m.value())
                    args: tuple[Any, ...] = (dst, dumps(event).encode(), str(event["order_id"]).encode())
                else:
                    args = (dst, m.value(), m.key(), m.partition())
                while True:
                    try:
                        produce(*args, on_delivery=deliveries)
                        break
                    except BufferError:
                        poll(0.05)
            seen += len(messages)
            poll(0)
        remaining = producer.flush(120)
        seconds = time.perf_counter() - started
    finally:
        consumer.close()
    deliveries.failed += remaining
    return seen, seconds, deliveries


def run_plain(
    name: str,
    bootstrap: str,
    src: str,
    partitions: int,
    transform: bool,
    sampler: TreeSampler | None = None,
    **kwargs: Any,
) -> PhaseResult:
    dst = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, dst, partitions)
    ends = topic_end_offsets(bootstrap, src)
    with _phase(sampler, name) as peaks:
        messages, seconds, deliveries = copy_loop(bootstrap, src, dst, ends, transform, **kwargs)
    return PhaseResult(
        name,
        messages,
        seconds,
        deliveries.delivered,
        deliveries.failed,
        topic_count(bootstrap, dst),
        _mb(peaks),
        {"sink_topic": dst},
        _cpu(peaks),
    )


# --------------------------------------------------------------------------- (c)


MANIFEST = """
name: bench_k2k
source:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}"}}
  topic: {src}
  options:
    group_id: {group}
    start_from: earliest
    message_format: json
{source_options}
sink:
  type: kafka
  connection_id: bench_kafka
  connection_type: params
  params: {{bootstrap_servers: "{bootstrap}"}}
  topic: {dst}
  strategy:
    mode: {mode}
    unique_key: order_id
{strategy_extra}
  options:
    message_format: json
    envelope: flat
    key: {{mode: unique_key}}
{delivery}
state: {{type: local, path: "{state}"}}
"""


def engine_manifest_text(
    bootstrap: str,
    src: str,
    dst: str,
    state_dir: str,
    mode: str = "incremental_merge",
    policy: str = "keep_last",
    source_options: dict[str, Any] | None = None,
    delivery: dict[str, Any] | None = None,
) -> str:
    strategy_extra = f"    merge_policy: event_upsert\n    duplicate_policy: {policy}" if mode == "incremental_merge" else ""
    source_lines = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in (source_options or {}).items())
    delivery_block = f"    delivery: {json.dumps(delivery)}" if delivery else ""
    return MANIFEST.format(
        bootstrap=bootstrap,
        src=src,
        dst=dst,
        group=f"bench.{uuid.uuid4().hex[:8]}",
        state=state_dir,
        mode=mode,
        strategy_extra=strategy_extra,
        source_options=source_lines,
        delivery=delivery_block,
    )


def run_engine(
    spark: Any,
    bootstrap: str,
    src: str,
    partitions: int,
    sampler: TreeSampler | None = None,
    mode: str = "incremental_merge",
    policy: str = "keep_last",
    source_options: dict[str, Any] | None = None,
    delivery: dict[str, Any] | None = None,
    name: str = "c",
    log: Any = None,
) -> PhaseResult:
    from dpone_dagster.engine.run import RunRequest, run_pipeline
    from dpone_dagster.manifest import parse_manifest

    dst = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, dst, partitions)
    expected = topic_count(bootstrap, src)
    with tempfile.TemporaryDirectory(prefix="dpone-bench-state-") as state_dir:
        manifest = parse_manifest(
            engine_manifest_text(bootstrap, src, dst, state_dir, mode, policy, source_options, delivery)
        )
        with _phase(sampler, name) as peaks:
            started = time.perf_counter()
            result = run_pipeline(manifest, spark, RunRequest(log=log or (lambda _m: None)))
            seconds = time.perf_counter() - started
    in_topic = topic_count(bootstrap, dst)
    return PhaseResult(
        name,
        result.rows_extracted,
        seconds,
        result.messages_produced,
        expected - result.messages_produced,
        in_topic,
        _mb(peaks),
        {
            "sink_topic": dst,
            "strategy": mode + (f"/{policy}" if mode == "incremental_merge" else ""),
            "duplicates_removed": result.duplicates_removed,
            "stage_seconds": result.timings,
            "spark_tasks": _task_count(expected, source_options, partitions),
            "source_options": source_options or {},
            "delivery": delivery or {},
        },
        _cpu(peaks),
    )


def _task_count(total: int, source_options: dict[str, Any] | None, partitions: int) -> int:
    per_task = (source_options or {}).get("records_per_task", 250_000)
    per_partition = -(-total // partitions)
    return partitions * max(1, -(-per_partition // per_task))


def start_spark(conf: dict[str, Any] | None = None) -> tuple[Any, dict[str, float]]:
    """The engine's session (session.get_spark: local[*] and the engine defaults); timed."""
    from dpone_dagster.spark.session import get_spark

    started = time.perf_counter()
    spark = get_spark(conf)
    session_s = time.perf_counter() - started
    started = time.perf_counter()
    spark.range(1).count()  # JVM-side first job (no Python worker)
    first_job_s = time.perf_counter() - started
    return spark, {"session_s": round(session_s, 2), "first_job_s": round(first_job_s, 2)}


# --------------------------------------------------------------------------- the benchmark


def _phase(sampler: TreeSampler | None, name: str) -> Any:
    if sampler is None:
        from contextlib import nullcontext

        return nullcontext(None)
    return sampler.phase(name)


def _mb(peaks: Any) -> dict[str, Any]:
    return peaks.as_mb() if peaks is not None else {}


def _cpu(peaks: Any) -> dict[str, Any]:
    return peaks.cpu() if peaks is not None else {}


def run_bench(
    bootstrap: str,
    messages: int,
    partitions: int = 6,
    spark: Any = None,
    spark_conf: dict[str, Any] | None = None,
    only: tuple[str, ...] = ("a", "b", "c"),
    sampler: TreeSampler | None = None,
    duplicate_every: int = 0,
    mode: str = "incremental_merge",
    policy: str = "keep_last",
    also_append: bool = False,
    source_options: dict[str, Any] | None = None,
    delivery: dict[str, Any] | None = None,
    consume_batch: int = 10_000,
    log: Any = None,
    compare_variants: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Generate events, run the selected phases; returns the report (see `print_report`).
    A `spark` session passed in is used as is (and its start is not measured)."""
    say = log or (lambda _m: None)
    src = f"bench_src_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, src, partitions)
    say(f"generating {messages} events into {src} ({partitions} partitions)")
    with _phase(sampler, "generate") as peaks:
        generated = generate_events(bootstrap, src, messages, partitions, duplicate_every)
    report: dict[str, Any] = {
        "bench": "k2k",
        "messages": messages,
        "partitions": partitions,
        "generate": {**generated.as_dict(), "memory_mb": _mb(peaks), "cpu": _cpu(peaks)},
        "phases": {},
    }
    phases: dict[str, PhaseResult] = {}
    if "a" in only:
        say("(a) raw byte copy")
        phases["a"] = run_plain("a", bootstrap, src, partitions, False, sampler, consume_batch=consume_batch)
    if "b" in only:
        say("(b) hand-written json.loads → re-key → json.dumps")
        phases["b"] = run_plain("b", bootstrap, src, partitions, True, sampler, consume_batch=consume_batch)
    if "c" in only or also_append or compare_variants:
        if spark is None:
            say("starting Spark")
            with _phase(sampler, "spark_start") as peaks:
                spark, start = start_spark(spark_conf)
            report["spark_start"] = {**start, "memory_mb": _mb(peaks), "cpu": _cpu(peaks)}
        else:
            report["spark_start"] = {"session_s": None, "first_job_s": None, "note": "session passed in"}
        report["spark_conf"] = {
            k: spark.conf.get(k, None)
            for k in ("spark.master", "spark.sql.shuffle.partitions", "spark.driver.memory", "spark.executor.memory")
        }
        report["spark_conf"]["defaultParallelism"] = spark.sparkContext.defaultParallelism
    if "c" in only:
        say(f"(c) dpone run_pipeline {mode}/{policy}")
        phases["c"] = run_engine(spark, bootstrap, src, partitions, sampler, mode, policy, source_options, delivery, "c", log)
    for name in compare_variants:
        # The same run with candidate engine changes swapped in (bench/variants.py).
        from bench.variants import variant

        say(f"(c) dpone run_pipeline with variant {name}")
        with variant(name, spark) as kw:
            merged_source = {**(source_options or {}), **kw["source_options"]}
            merged_delivery = {**(delivery or {}), **kw["delivery"]}
            phases[f"c[{name}]"] = run_engine(
                spark, bootstrap, src, partitions, sampler, mode, policy, merged_source or None, merged_delivery or None, "cv", log
            )
    if also_append:
        say("(c2) dpone run_pipeline incremental_append")
        phases["c_append"] = run_engine(
            spark, bootstrap, src, partitions, sampler, "incremental_append", "allow", source_options, delivery, "c_append", log
        )
    report["phases"] = {k: v.as_dict() for k, v in phases.items()}
    report["ratios"] = ratios(phases)
    report["targets"] = targets(report)
    if sampler is not None:
        report["sampler"] = {
            "interval_s": sampler.interval_s,
            "samples": sampler.sample_count,
            "mean_sample_ms": round(1000 * sampler.sample_cost_s / max(1, sampler.sample_count), 2),
        }
    return report


def ratios(phases: dict[str, PhaseResult]) -> dict[str, float | None]:
    def r(x: str, y: str) -> float | None:
        if x in phases and y in phases and phases[y].msgs_per_s:
            return round(phases[x].msgs_per_s / phases[y].msgs_per_s, 3)
        return None

    def rc(x: str, y: str) -> float | None:
        if x in phases and y in phases and phases[x].cpu.get("tree_cpu_s") and phases[y].cpu.get("tree_cpu_s"):
            return round(
                (phases[x].messages / phases[x].cpu["tree_cpu_s"]) / (phases[y].messages / phases[y].cpu["tree_cpu_s"]), 3
            )
        return None

    extra: dict[str, float | None] = {}
    for key in phases:
        if key.startswith("c[") or key == "c_append":
            extra[f"{key}/a"] = r(key, "a")
            extra[f"{key}/b"] = r(key, "b")
            extra[f"cpu {key}/b"] = rc(key, "b")
    return {
        **extra,
        "c/a": r("c", "a"),
        "c/b": r("c", "b"),
        "b/a": r("b", "a"),
        # The same ratios per CPU second (tree CPU, broker excluded).
        "cpu c/a": rc("c", "a"),
        "cpu c/b": rc("c", "b"),
    }


# Goals of the engine against the hand-written loop (b), measured in one run: throughput with
# both cores against one, and CPU per message at most 25% above the loop's.
GOAL_C_OVER_B = 1.2
GOAL_CPU_C_OVER_B = 0.8


def targets(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ratios_ = report["ratios"]
    if ratios_.get("c/b") is not None:
        out["c_at_least_b"] = ratios_["c/b"] >= 1.0
        out[f"goal c/b >= {GOAL_C_OVER_B}"] = ratios_["c/b"] >= GOAL_C_OVER_B
    if ratios_.get("cpu c/b") is not None:
        out[f"goal cpu c/b >= {GOAL_CPU_C_OVER_B}"] = ratios_["cpu c/b"] >= GOAL_CPU_C_OVER_B
    if ratios_.get("c/a") is not None:
        out["c_at_least_half_a"] = ratios_["c/a"] >= 0.5
    for key in report["phases"]:
        if key.startswith("c["):
            out[f"{key}_at_least_b"] = (ratios_.get(f"{key}/b") or 0) >= 1.0
            out[f"{key}_at_least_half_a"] = (ratios_.get(f"{key}/a") or 0) >= 0.5
    if ratios_.get("c_append/b") is not None:  # a second run of the session: warm (see --mode)
        out[f"goal c_append/b >= {GOAL_C_OVER_B} (warm)"] = ratios_["c_append/b"] >= GOAL_C_OVER_B
        out[f"goal cpu c_append/b >= {GOAL_CPU_C_OVER_B} (warm)"] = (ratios_.get("cpu c_append/b") or 0) >= GOAL_CPU_C_OVER_B
    c = report["phases"].get("c")
    if c is not None:
        out["c_delivered_all"] = c["delivered"] == report["messages"] - c.get("duplicates_removed", 0) and c["failed"] == 0
    return out


# --------------------------------------------------------------------------- memory check


def memory_check(messages: int, partitions: int, extra_args: list[str], log: Any) -> dict[str, Any]:
    """Run (c) alone in a fresh process at messages/2 and messages*2; compare driver peak RSS."""
    sizes = [max(1, messages // 2), messages * 2]
    runs = []
    for size in sizes:
        log(f"memory check: (c) at {size} messages in a fresh process")
        cmd = [sys.executable, "-m", "bench.k2k", "--messages", str(size), "--partitions", str(partitions), "--only", "c", "--json", *extra_args]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parent.parent)
        if proc.returncode != 0:
            raise RuntimeError(f"memory check run at {size} failed:\n{proc.stderr[-4000:]}")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        c = data["phases"]["c"]
        runs.append(
            {
                "messages": size,
                "msgs_per_s": c["msgs_per_s"],
                "seconds": c["seconds"],
                "delivered": c["delivered"],
                "driver_peak_rss_mb": c["memory_mb"]["driver_rss"],
                "driver_hwm_mb": data.get("driver_hwm_mb"),
                "jvm_peak_rss_mb": c["memory_mb"]["jvm_rss"],
                "workers_peak_rss_mb": c["memory_mb"]["workers_rss"],
                "tree_peak_rss_mb": c["memory_mb"]["tree_rss"],
                "tree_peak_pss_mb": c["memory_mb"]["tree_pss"],
            }
        )
    small, large = runs
    growth = (large["driver_peak_rss_mb"] - small["driver_peak_rss_mb"]) / small["driver_peak_rss_mb"]
    tree_growth = (large["tree_peak_pss_mb"] - small["tree_peak_pss_mb"]) / max(1e-9, small["tree_peak_pss_mb"])
    return {
        "bench": "k2k-memory-check",
        "runs": runs,
        "driver_growth_pct": round(100 * growth, 1),
        "tree_pss_growth_pct": round(100 * tree_growth, 1),
        # The target is about growth: a smaller peak at 4x the messages also meets it.
        "target_driver_within_15pct": growth <= 0.15,
    }


# --------------------------------------------------------------------------- output


def print_report(report: dict[str, Any], out: Any = sys.stdout) -> None:
    w = out.write
    gen = report["generate"]
    w(f"k2k: {report['messages']} messages, {report['partitions']} partitions, ~{gen['avg_value_bytes']} B/value\n")
    w(f"  generate: {gen['seconds']} s ({gen['msgs_per_s']} msg/s, one producer)\n")
    start = report.get("spark_start")
    if start and start.get("session_s") is not None:
        w(f"  spark start: session {start['session_s']} s + first job {start['first_job_s']} s (not in (c))\n")
    w(
        f"  {'phase':<11}{'msgs/s':>9}{'seconds':>9}{'delivered':>10}{'in topic':>10}{'driver MB':>10}{'JVM MB':>8}"
        f"{'tree MB':>9}{'tree PSS':>9}{'CPU s':>8}{'broker CPU':>11}{'msg/CPU s':>10}{'load':>6}\n"
    )
    labels = {"a": "(a) raw", "b": "(b) hand", "c": "(c) dpone", "c_append": "(c) append"}
    labels.update({k: f"(c) v{i + 1}" for i, k in enumerate(k for k in report["phases"] if k.startswith("c["))})
    for key, phase in report["phases"].items():
        mem = phase.get("memory_mb") or {}
        cpu = phase.get("cpu") or {}
        w(
            f"  {labels.get(key, key):<11}{phase['msgs_per_s']:>9}{phase['seconds']:>9}{phase['delivered']:>10}"
            f"{str(phase['in_topic']):>10}{mem.get('driver_rss', '-'):>10}{mem.get('jvm_rss', '-'):>8}"
            f"{mem.get('tree_rss', '-'):>9}{mem.get('tree_pss', '-'):>9}{cpu.get('tree_cpu_s', '-'):>8}"
            f"{cpu.get('broker_cpu_s', '-'):>11}{str(phase.get('msgs_per_cpu_s')):>10}{cpu.get('load_end', '-'):>6}\n"
        )
    for key, phase in report["phases"].items():
        cpu = phase.get("cpu") or {}
        if "driver_cpu_s" in cpu:
            w(
                f"  {labels.get(key, key)} CPU s: driver {cpu['driver_cpu_s']}, JVM {cpu['jvm_cpu_s']}, "
                f"Python workers {cpu['python_worker_cpu_s']}, broker {cpu['broker_cpu_s']}\n"
            )
    for key in report["phases"]:
        if key.startswith("c"):
            w(f"  {labels[key]} stages (s): {report['phases'][key]['stage_seconds']}\n")
    for key, label in labels.items():
        if key.startswith("c["):
            w(f"  {label} = variant {key[2:-1]}\n")
    r = report["ratios"]
    w(f"  ratios (wall): c/a={r['c/a']}  c/b={r['c/b']}  b/a={r['b/a']}   per CPU second: c/a={r['cpu c/a']}  c/b={r['cpu c/b']}\n")
    for key in report["phases"]:
        if key.startswith("c[") or key == "c_append":
            w(f"  ratios {labels[key]}: /a={r[key + '/a']}  /b={r[key + '/b']}  per CPU second /b={r['cpu ' + key + '/b']}\n")
    if report.get("targets"):
        w(f"  targets: {report['targets']}\n")
    if "driver_hwm_mb" in report:
        w(f"  driver lifetime peak RSS (VmHWM): {report['driver_hwm_mb']} MB\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.k2k", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--only", default="a,b,c", help="phases to run, e.g. a,b or c")
    p.add_argument("--memory-check", action="store_true", help="(c) alone at messages/2 and messages*2, fresh processes")
    p.add_argument("--mode", default="incremental_merge", choices=["incremental_merge", "incremental_append"])
    p.add_argument("--policy", default="keep_last", choices=["keep_last", "keep_first", "allow", "fail"])
    p.add_argument("--also-append", action="store_true", help="also run (c) as incremental_append (no de-duplication)")
    p.add_argument("--duplicate-every", type=int, default=0, help="every Nth event repeats the previous order_id")
    p.add_argument("--source-option", action="append", default=[], metavar="K=V", help="source.options entry, e.g. records_per_task=500000")
    p.add_argument("--delivery", action="append", default=[], metavar="K=V", help="sink delivery entry, e.g. linger_ms=50")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V")
    p.add_argument("--consume-batch", type=int, default=10_000, help="consume() batch of the plain loops")
    p.add_argument("--no-sampler", action="store_true", help="do not sample memory")
    p.add_argument(
        "--compare-variant",
        action="append",
        default=[],
        metavar="NAME",
        help="also run (c) with a variant, e.g. window_dedupe or rpt=100000+linger=50 "
        "(see python -m bench.experiments --help)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with stdout_to_stderr(args.json):
        report = _main(args)
    if args.json:
        print(dump_json(report))
    elif args.memory_check:
        print_memory_check(report)
    else:
        print_report(report)
    if args.memory_check:
        return 0 if report["target_driver_within_15pct"] else 1
    return 0


def print_memory_check(result: dict[str, Any]) -> None:
    for run in result["runs"]:
        print(
            f"  (c) {run['messages']:>9} msgs: {run['msgs_per_s']} msg/s, driver peak RSS {run['driver_peak_rss_mb']} MB, "
            f"JVM {run['jvm_peak_rss_mb']} MB, workers {run['workers_peak_rss_mb']} MB, tree PSS {run['tree_peak_pss_mb']} MB"
        )
    print(
        f"  driver growth {result['driver_growth_pct']}% (target: grows at most 15%: {result['target_driver_within_15pct']}), "
        f"tree PSS growth {result['tree_pss_growth_pct']}%"
    )


def _main(args: argparse.Namespace) -> dict[str, Any]:
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    if args.memory_check:
        passthrough = []
        for flag, values in (("--source-option", args.source_option), ("--delivery", args.delivery), ("--spark-conf", args.spark_conf)):
            for v in values:
                passthrough += [flag, v]
        passthrough += ["--mode", args.mode, "--policy", args.policy]
        result = memory_check(args.messages, args.partitions, passthrough, log)
        result["machine"] = machine_info()
        return result

    from dpone_dagster.embedded_broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        assert broker._process is not None
        sampler = None if args.no_sampler else TreeSampler(exclude={broker._process.pid}).start()
        try:
            report = run_bench(
                broker.bootstrap_servers,
                args.messages,
                args.partitions,
                spark_conf=parse_settings(args.spark_conf) or None,
                only=tuple(args.only.split(",")),
                sampler=sampler,
                duplicate_every=args.duplicate_every,
                mode=args.mode,
                policy=args.policy,
                also_append=args.also_append,
                source_options=parse_settings(args.source_option) or None,
                delivery=parse_settings(args.delivery) or None,
                consume_batch=args.consume_batch,
                log=log,
                compare_variants=tuple(args.compare_variant),
            )
        finally:
            if sampler is not None:
                sampler.stop()
        report["broker_peak_rss_mb"] = round(_broker_rss(broker._process.pid) / MB, 1)
    report["driver_hwm_mb"] = round(_hwm() / MB, 1)
    report["machine"] = machine_info()
    return report


def _hwm() -> int:
    from bench.common import hwm_bytes

    return hwm_bytes(os.getpid())


def _broker_rss(pid: int) -> int:
    from bench.common import hwm_bytes

    return hwm_bytes(pid)


if __name__ == "__main__":
    raise SystemExit(main())
