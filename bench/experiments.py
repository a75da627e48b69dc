"""A/B measurements of candidate engine changes on one broker, one topic and one Spark session:
each variant runs (c) — `run_pipeline`, incremental_merge keep_last — with a change swapped in
(monkeypatched for the run), interleaved over `--rounds` so that load drifting on the machine hits
every variant alike. CPU seconds of the process tree (by kind) are the robust figure; wall time
is reported too.

    python -m bench.experiments --messages 500000 --variants baseline,conf:spark.sql.inMemoryColumnarStorage.compressed=true --rounds 2

Variants (combine with '+', e.g. rpt=100000+linger=50):
  baseline        the engine as it is
  conf:K=V        any runtime SQL conf for the run
  rpt=N           records_per_task N
  bs=N            source batch_size N (consume() size)
  spN             spark.sql.shuffle.partitions N for the run
  linger=N        producer linger.ms N;  bsize=N producer batch.size N;  bnm=N batch.num.messages N
  window_dedupe   resolve duplicate keys by sorting the whole batch (the fallback beyond
                  engine.stages.shape.BROADCAST_DEDUPE_KEYS duplicated keys)
  spark_sql       the Spark SQL path for a run the direct path would take (engine/direct.py)
  window          read_mode time_window, one window holding every record (join with spark_sql
                  to compare the paths: window+spark_sql)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.common import TreeSampler, create_topic, generate_events, machine_info
from bench.k2k import run_engine, start_spark, stdout_to_stderr
from bench.variants import variant


def _jcmd(sampler: TreeSampler, *command: str) -> None:
    import subprocess

    from bench.common import _kind, descendants

    jvms = [pid for pid in descendants(sampler.root, sampler.exclude) if _kind(pid) == "jvm"]
    for pid in jvms:
        subprocess.run(["jcmd", str(pid), *command], check=True, capture_output=True)


def summarize(path: str) -> list[dict[str, Any]]:
    """Median per variant of the runs appended to `path` by --out."""
    import statistics

    runs: dict[str, list[dict[str, Any]]] = {}
    for line in open(path):
        row = json.loads(line)
        runs.setdefault(row["variant"], []).append(row)
    out = []
    for name, rows in runs.items():
        def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return round(statistics.median(r[key] for r in rows), 2)

        out.append(
            {
                "variant": name,
                "runs": len(rows),
                "tree_cpu_s": med("tree_cpu_s"),
                "jvm_cpu_s": med("jvm_cpu_s"),
                "python_worker_cpu_s": med("python_worker_cpu_s"),
                "driver_cpu_s": med("driver_cpu_s"),
                "wall_s": med("wall_s"),
                "msgs_per_cpu_s": med("msgs_per_cpu_s"),
                "cpu_runs": [r["tree_cpu_s"] for r in rows],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        for row in summarize(sys.argv[2]):
            print(json.dumps(row))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--variants", default="baseline,window_dedupe")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=int, default=20_000, help="a small run first so JIT/worker start is not billed to the first variant")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V")
    p.add_argument("--out", help="append one JSON line per run here")
    p.add_argument(
        "--jfr",
        metavar="PATH",
        help="record the Spark JVM with Java Flight Recorder during the measured runs and dump it to PATH "
        "(summarize with python -m bench.jfr PATH)",
    )
    args = p.parse_args(argv)

    from dpone_dagster.embedded_broker import EmbeddedBroker

    conf = dict(item.split("=", 1) for item in args.spark_conf)
    results: list[dict[str, Any]] = []
    with stdout_to_stderr(True), EmbeddedBroker() as broker:
        bs = broker.bootstrap_servers
        sampler = TreeSampler(exclude={broker._process.pid}).start()  # type: ignore[union-attr]
        src = "exp_src"
        create_topic(bs, src, args.partitions)
        generate_events(bs, src, args.messages, args.partitions)
        spark, start = start_spark(conf or None)
        print(f"spark start {start}", file=sys.stderr, flush=True)
        if args.warmup:
            create_topic(bs, "exp_warm", args.partitions)
            generate_events(bs, "exp_warm", args.warmup, args.partitions)
            run_engine(spark, bs, "exp_warm", args.partitions, None, name="warm")
        if args.jfr:
            _jcmd(sampler, "JFR.start", "name=bench", "settings=profile")
        for rnd in range(args.rounds):
            for name in args.variants.split(","):
                with variant(name, spark) as kw:
                    r = run_engine(spark, bs, src, args.partitions, sampler, name="v", **kw)
                row = {
                    "variant": name,
                    "round": rnd,
                    "messages": r.messages,
                    "delivered": r.delivered,
                    "wall_s": round(r.seconds, 2),
                    "msgs_per_s": round(r.msgs_per_s),
                    **r.cpu,
                    "msgs_per_cpu_s": round(r.messages / r.cpu["tree_cpu_s"]) if r.cpu.get("tree_cpu_s") else None,
                    "stages": r.details["stage_seconds"],
                    "memory_mb": r.memory_mb,
                    "time": time.strftime("%X"),
                }
                assert r.delivered == args.messages, row
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps({**row, "spark_conf": conf}) + "\n")
        if args.jfr:
            _jcmd(sampler, "JFR.dump", "name=bench", f"filename={args.jfr}")
        sampler.stop()
    print(json.dumps({"machine": machine_info(), "spark_conf": conf, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
