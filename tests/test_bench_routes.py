"""Smoke test of `python -m bench.routes`: every route on a few thousand events, on the shared
broker and Spark session. Each Kafka route's engine run takes the direct path (the PostgreSQL
route the Spark SQL path) and delivers every event,
and the hand-written loop it is measured against does the same work: past the registry's frame
(whose id differs per subject), its values are the engine's, byte for byte (the Avro source's
loop: the same events)."""

from __future__ import annotations

import json
from typing import Any

from conftest import consume_raw

from bench.routes import ROUTES, run_routes

MESSAGES = 3000
FRAME = {"avro": 5, "json_schema": 5, "protobuf": 6}  # magic byte, schema id (protobuf: message index 0)


def test_every_route_runs_direct_and_matches_its_hand_loop(broker, spark):
    bs = broker.bootstrap_servers
    report = run_routes(bs, MESSAGES, 3, list(ROUTES), lambda _m: None, spark=spark)
    assert set(report["routes"]) == set(ROUTES)
    for route, figures in report["routes"].items():
        hand, engine = figures["hand"], figures["engine"]
        assert hand["messages"] == MESSAGES and hand["failed"] == 0, route
        assert engine["path"] == "direct", route
        assert engine["messages"] == engine["in_topic"] == MESSAGES, route
        assert engine["memory_mb"]["samples"] >= 0 and "driver_rss" in engine["memory_mb"], route
        assert figures["throughput_ratio"] > 0, route
        if route in FRAME:
            skip = FRAME[route]
            assert _values(bs, figures["topics"]["hand"], skip) == _values(bs, figures["topics"]["engine"], skip), route
        if route.endswith("_source_to_json"):  # the same events decoded (the loop's json.dumps spaces them)
            hand_events = {k: json.loads(v) for k, v in _values(bs, figures["topics"]["hand"], 0).items()}
            assert hand_events == {k: json.loads(v) for k, v in _values(bs, figures["topics"]["engine"], 0).items()}


def _values(bootstrap: str, topic: str, skip: int) -> dict[Any, bytes]:
    return {r["key"]: r["value"][skip:] for r in consume_raw(bootstrap, topic)}


def test_the_bad_records_bench_runs_both_paths_to_the_same_counts(broker, spark):
    """`python -m bench.bad_records` on a few thousand records: the bench itself fails a run whose
    delivered and dead-lettered counts differ from what it wrote."""
    from bench.bad_records import bench

    report = bench(broker.bootstrap_servers, spark, 3_000, 2, 0.125, ["mistyped"], lambda _m: None, warm_up=False)
    for kind, row in report["kinds"].items():
        assert (row["direct"]["path"], row["spark_sql"]["path"]) == ("direct", "spark_sql"), kind
        assert row["bad_records"] > 250 and row["direct"]["dead_lettered"] == row["bad_records"], kind
