"""Smoke test of bench.replication: a tiny run of both phases on the shared broker and Spark
session; each target is verified record by record against the source, and a differing target
fails the benchmark instead of passing fast."""

from __future__ import annotations

import pytest

from bench.replication import parse_args, run_bench, same_records


def test_replication_bench_verifies_both_phases(broker, spark):
    args = parse_args(["--messages", "600", "--partitions", "3", "--txn-records", "150"])
    report = run_bench(broker.bootstrap_servers, args, None, lambda _m: None, spark=spark)
    assert set(report["phases"]) == {"t", "r"}
    for name, phase in report["phases"].items():
        assert phase["messages"] == 600 and phase["verified"] is True, name
    assert report["phases"]["t"]["transactions"] == 6  # 200 records per partition, 150 per transaction
    assert "replicate" in report["phases"]["r"]["stage_seconds"]
    assert report["goals"]["verified"] is True
    assert set(report["ratios"]) == {"stage r/t", "run r/t"}


def test_a_target_that_differs_from_the_source_fails():
    with pytest.raises(RuntimeError, match="differs"):
        same_records({0: (2, "a"), 1: (1, "b")}, {0: (2, "a"), 1: (1, "c")}, "(r)")
