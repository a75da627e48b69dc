"""Smoke test of the benchmarks (bench/): a tiny Kafka → Kafka run of every phase in-process on
the shared broker and Spark session, checking the report's structure and that the engine phase
delivered every message. The figures themselves are recorded in docs/performance.md."""

from __future__ import annotations

import io
import json

from bench.common import TreeSampler, topic_end_offsets
from bench.k2k import print_report, run_bench

MESSAGES = 2000


def test_k2k_bench_reports_every_phase_and_the_engine_delivers_all(broker, spark):
    sampler = TreeSampler(exclude={broker._process.pid}, interval_s=0.5).start()
    try:
        report = run_bench(broker.bootstrap_servers, MESSAGES, partitions=3, spark=spark, sampler=sampler)
    finally:
        sampler.stop()

    assert report["generate"]["messages"] == MESSAGES
    assert set(report["phases"]) == {"a", "b", "c"}
    for name, phase in report["phases"].items():
        assert phase["messages"] == MESSAGES, name
        assert phase["delivered"] == MESSAGES and phase["failed"] == 0, name
        # Records read from the target; on a mismatch the watermarks show whether offsets agree.
        assert phase["in_topic"] == MESSAGES, (name, topic_end_offsets(broker.bootstrap_servers, phase["sink_topic"]))
        assert phase["msgs_per_s"] > 0 and phase["seconds"] > 0, name
        assert phase["memory_mb"]["driver_rss"] > 0 and phase["memory_mb"]["tree_rss"] >= phase["memory_mb"]["driver_rss"]
        # Each phase copies MESSAGES messages in this process tree: it cannot take no CPU.
        assert phase["cpu"]["tree_cpu_s"] > 0, name
    engine = report["phases"]["c"]
    assert engine["strategy"] == "incremental_merge/keep_last"
    assert engine["duplicates_removed"] == 0  # order ids are unique: keep_last keeps every event
    assert {"extract", "shape", "load"} <= set(engine["stage_seconds"])
    assert engine["memory_mb"]["jvm_rss"] > 0  # the Spark JVM is found below the driver
    assert set(report["ratios"]) >= {"c/a", "c/b", "b/a"}
    assert all(isinstance(report["ratios"][k], float) for k in ("c/a", "c/b", "b/a"))
    assert report["targets"]["c_delivered_all"] is True
    assert report["spark_start"]["note"] == "session passed in"

    json.loads(json.dumps(report, default=str))  # --json prints this object
    out = io.StringIO()
    print_report(report, out)
    text = out.getvalue()
    assert "(a) raw" in text and "(b) hand" in text and "(c) dpone" in text and "ratios" in text
