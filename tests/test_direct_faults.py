"""Faults while the direct path produces slice by slice (more slices than task slots), each proven
from the data the target topic and the state store hold:

- the broker frozen (SIGSTOP) mid-delivery: the run ends with an error within the delivery
  timeout plus a margin (it used to wait forever), and the rerun delivers every record;
- the state store connection terminated (pg_terminate_backend) at its first write, with a slow
  first slice: the records delivered and not stored stay within the window of open slices
  (task slots × records_per_task), however the slices finish;
- the same under keep_last, the kept record and the left-out one of a key in two partitions: the
  last message per key in the target is the one keep_last picks over both runs' records;
- Python workers killed while the records of keys that repeat in an append are produced first, in
  source order per key: nothing is stored, and each key's last message after the rerun is its
  last record in source order;
- the bound on a Spark Connect server, where the task slots are not known from a SparkContext.

Each test reports what it measured through the fault_outcome fixture (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest
from conftest import (
    consume_all,
    consume_raw,
    create_topic,
    freeze_once_delivering,
    kill_python_workers,
    once_delivering,
    produce_json,
    unique_topic,
)
from test_faults import delivery_outcome, source_rows, stored_offsets
from test_state_faults import terminate_state_connections

from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest

pytestmark = pytest.mark.faults

SLOTS = 2  # the suite's session runs local[2]: the window of open slices


def manifest(name: str, src: str, dst: str, records_per_task: int, strategy: str = "{mode: incremental_append}", delivery: str = "{}") -> str:
    return f"""
name: {name}
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {{records_per_task: {records_per_task}}}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
  options: {{delivery: {delivery}}}
state: {{type: postgres, connection_id: postgres_state}}
"""


def run_in_thread(run: Any, timeout_s: float) -> tuple[BaseException | None, float]:
    """Run `run()` in a daemon thread; (what it raised, seconds it took). Fails the test when it
    has not ended within `timeout_s` (a hung run must not hang the suite)."""
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def target() -> None:
        try:
            run()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the run did not end within {timeout_s:.0f} s: it hangs"
    return outcome[0], time.monotonic() - started


def test_a_frozen_broker_ends_a_slice_by_slice_run_within_the_delivery_timeout(spark, pg_env, monkeypatch, fault_outcome):
    """200,000 records in 20 slices, 2 task slots; the broker is frozen once records arrive. The
    slices in flight time out after delivery.flush_timeout_s (5 s); the run stops starting slices,
    waits for those, and fails naming the cause well within the timeout plus a margin. Resumed,
    the broker holds everything the failed run delivered; the rerun delivers the rest."""
    flush_timeout_s, per_slice = 5, 10_000
    broker = EmbeddedBroker().start()
    frozen_at: list[float] = []
    try:
        bs = broker.bootstrap_servers
        monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", bs)
        src, dst = "src", "dst"
        create_topic(bs, src, 2)
        create_topic(bs, dst, 2)
        ids = source_rows(bs, src, 2, 100_000)
        delivery = f"{{flush_timeout_s: {flush_timeout_s}, producer_config: {{message.timeout.ms: {flush_timeout_s * 1000}}}}}"
        m = parse_manifest(manifest("frozen_direct", src, dst, per_slice, delivery=delivery))
        pid = broker._process.pid
        on_log = freeze_once_delivering(pid, bs, dst, frozen_at)
        error, _ = run_in_thread(lambda: run_pipeline(m, spark, RunRequest(log=on_log)), flush_timeout_s + 180)
        ended_after = time.monotonic() - frozen_at[0]
        assert isinstance(error, RunFailed), error
        assert "not delivered" in str(error) or "did not finish" in str(error), error
        assert ended_after <= flush_timeout_s + 60, f"the run ended {ended_after:.0f} s after the freeze"
        os.kill(pid, signal.SIGCONT)
        kept = stored_offsets(m)
        delivered_by_failed_run = len(consume_raw(bs, dst, timeout_s=60))
        assert delivered_by_failed_run < len(ids)

        rerun = run_pipeline(m, spark)
        assert rerun.committed_offsets == {0: 100_000, 1: 100_000}
        lost, duplicated = delivery_outcome(bs, dst, ids)
        assert lost == 0
        assert duplicated == delivered_by_failed_run - sum(kept.values()) <= SLOTS * per_slice
    finally:
        if broker._process is not None:
            os.kill(broker._process.pid, signal.SIGCONT)
        broker.stop()
    fault_outcome(
        "2b. Broker frozen (SIGSTOP) mid-delivery, more slices than task slots (direct path)",
        "The slices in flight time out; no new slice starts; the run fails naming the cause within the delivery timeout "
        "plus a margin; the rerun completes from the stored offsets",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=(
            f"200,000 records in slices of {per_slice:,}, flush_timeout_s {flush_timeout_s}; the run ended {ended_after:.1f} s "
            f"after the freeze; {delivered_by_failed_run:,} arrived, {sum(kept.values()):,} stored; duplicates after rerun {duplicated:,}"
        ),
    )


def test_a_slow_first_slice_keeps_the_unstored_deliveries_within_the_window(broker, spark, kafka_env, pg_env, pg_database, fault_outcome):
    """One partition, 61 slices of 100 records; the first slice holds 100 records of ~900 KB
    (gzip makes it seconds slower than the rest), so the later slices of its partition finish
    first and cannot be stored behind it. The state store connection is cut when the load starts,
    so the first write fails: what the run delivered beyond the stored offsets is at most the
    window of open slices (2 × 100), not every slice that finished behind the slow one."""
    per_slice = 100
    bs = broker.bootstrap_servers
    src, dst = unique_topic("slow"), unique_topic("slow_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    rng = random.Random(7)
    big = [{"i": i, "pad": rng.randbytes(450_000).hex()} for i in range(per_slice)]
    produce_json(bs, src, big, partition=0, linger_ms=5)
    produce_json(bs, src, [{"i": i} for i in range(per_slice, 61 * per_slice)], partition=0)
    ids = list(range(61 * per_slice))
    m = parse_manifest(manifest("slow_first", src, dst, per_slice, delivery="{compression_type: gzip}"))
    killed: list[int] = []

    def cut(message: str) -> None:
        if message == "load: started":
            killed.append(terminate_state_connections(pg_database))

    with pytest.raises(RunFailed, match="state store connection .* was lost"):
        run_pipeline(m, spark, RunRequest(log=cut))
    assert killed and killed[0] >= 1
    assert stored_offsets(m) == {}
    delivered = [json.loads(r["value"])["i"] for r in consume_raw(bs, dst)]
    assert 0 in delivered  # the slow slice did finish before the run stopped
    assert len(delivered) <= SLOTS * per_slice, f"{len(delivered)} records delivered and not stored"

    rerun = run_pipeline(m, spark)
    assert rerun.committed_offsets == {0: len(ids)}
    arrived = Counter(r["value"]["i"] for r in consume_all(bs, dst, timeout_s=60))
    assert arrived == Counter(ids) + Counter(delivered)
    fault_outcome(
        "3b. State store connection terminated at its first write, a slow first slice (direct path)",
        "Slices start only while fewer than task slots × 1 are open (running, or delivered behind a slower slice); "
        "the unstored deliveries stay within that window; the rerun completes",
        lost=0,
        duplicated=len(delivered),
        recovered=True,
        measured=(
            f"61 slices of {per_slice} in one partition, the first of ~90 MB; {len(delivered)} delivered and not stored "
            f"(bound {SLOTS * per_slice}); duplicates after rerun {len(delivered)}"
        ),
    )


def test_keep_last_never_leaves_a_stale_value_after_a_failed_store(broker, spark, kafka_env, pg_env, pg_database, fault_outcome):
    """Key k: "old" at the end of partition 0, "new" (5 s later) at the start of partition 1, under
    keep_last, in slices of 2 (8 slices, 2 task slots). The state store connection is cut at the
    first state write after partition 1 (holding "new") could be stored: a run that stored
    partition 1 alone would leave "old" for the rerun, which no longer sees "new", to publish
    last. The last message per key in the target is what keep_last picks over both runs."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("keep"), unique_topic("keep_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 1)
    base = int(time.time() * 1000) - 60_000
    p0 = [{"id": f"a{i}", "v": "a"} for i in range(6)] + [{"id": "k", "v": "old"}]
    p1 = [{"id": "k", "v": "new"}] + [{"id": f"b{i}", "v": "b"} for i in range(6)]
    produce_json(bs, src, p0, partition=0, timestamps=[base] * 7)
    produce_json(bs, src, p1, partition=1, timestamps=[base + 5_000] * 7)
    strategy = "{mode: incremental_merge, unique_key: id, duplicate_policy: keep_last}"
    m = parse_manifest(manifest("keep_stale", src, dst, 2, strategy=strategy))
    cuts: list[str] = []

    def cut(message: str) -> None:
        stored_p1 = message.startswith(f"load: {src}[1] delivered up to") and message.endswith("stored")
        if not cuts and (stored_p1 or message == "commit: started"):
            terminate_state_connections(pg_database)
            cuts.append(message)

    with pytest.raises(RunFailed, match="state store connection .* was lost"):
        run_pipeline(m, spark, RunRequest(log=cut))
    assert cuts
    rerun = run_pipeline(m, spark)
    assert rerun.committed_offsets == {0: 7, 1: 7}

    last: dict[str, str] = {}
    for record in sorted(consume_all(bs, dst), key=lambda r: r["offset"]):
        last[record["value"]["id"]] = record["value"]["v"]
    assert last["k"] == "new", "a left-out record was published after the one keep_last kept"
    assert last == {**{f"a{i}": "a" for i in range(6)}, **{f"b{i}": "b" for i in range(6)}, "k": "new"}
    duplicated = len(consume_raw(bs, dst)) - 13
    fault_outcome(
        "3c. State store connection terminated between two partitions' stores, keep_last across partitions (direct path)",
        "A batch in which keep_last / keep_first left records out is stored once, with the whole batch: the rerun "
        "sees the kept record again and picks it; the last message per key is keep_last's pick over both runs",
        lost=0,
        duplicated=duplicated,
        recovered=True,
        measured=f"14 records, key k in both partitions; cut at '{cuts[0]}'; last value of k after rerun '{last['k']}'; duplicates {duplicated}",
    )


def test_workers_killed_while_repeated_keys_are_produced_in_order(broker, spark, kafka_env, pg_env, pg_database, fault_outcome):
    """An append whose keys all repeat, across two partitions whose timestamps interleave: their
    records are produced first, in source order per key. The Spark Python workers are killed
    (SIGKILL) once that produce delivers: the run fails and stores nothing; the rerun delivers
    every record, the duplicates are at most what the failed run delivered, and each key's last
    message in the target is its last record in source order."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ordered"), unique_topic("ordered_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    rng = random.Random(11)
    base = int(time.time() * 1000) - 600_000
    events = [{"i": i, "k": f"k{rng.randrange(500)}", "pad": "x" * 200} for i in range(40_000)]
    stamps = [base + rng.randrange(300_000) for _ in events]
    for p in range(2):
        mine = [i for i in range(len(events)) if i % 2 == p]
        produce_json(bs, src, [events[i] for i in mine], partition=p, timestamps=[stamps[i] for i in mine])
    # Source order: (timestamp, partition, offset); partition p holds i % 2 == p at offset i // 2.
    last = {}
    for i in sorted(range(len(events)), key=lambda i: (stamps[i], i % 2, i // 2)):
        last[events[i]["k"]] = i
    m = parse_manifest(manifest("ordered_kill", src, dst, 5_000, strategy="{mode: incremental_append, unique_key: k}"))
    killed: list[int] = []
    with pytest.raises(RunFailed):
        run_pipeline(m, spark, RunRequest(log=once_delivering(bs, dst, lambda: kill_python_workers(killed))))
    assert killed
    assert stored_offsets(m) == {}
    delivered = len(consume_raw(bs, dst))
    rerun = run_pipeline(m, spark)
    assert rerun.execution_path == "direct" and rerun.committed_offsets == {0: 20_000, 1: 20_000}
    arrived = sorted(consume_all(bs, dst, timeout_s=60), key=lambda r: (r["partition"], r["offset"]))
    ids = Counter(r["value"]["i"] for r in arrived)
    assert set(ids) == set(range(len(events)))
    duplicated = len(arrived) - len(events)
    assert duplicated <= delivered
    seen_last = {r["value"]["k"]: r["value"]["i"] for r in arrived}
    assert seen_last == last, "a key's last message is not its last record in source order"
    fault_outcome(
        "3d. Spark Python workers killed while the records of repeated keys of an append are produced in order (direct path)",
        "The run fails and stores nothing; the rerun delivers every record, and each key's last message is its last record in source order",
        lost=0,
        duplicated=duplicated,
        recovered=True,
        measured=f"40,000 records of 500 keys in 2 partitions; {len(killed)} worker(s) killed after {delivered:,} had arrived; duplicates after rerun {duplicated:,}",
    )


CONNECT_RUN = """
import json, sys
import psycopg2
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.spark.session import get_spark
from dpone_dagster.spark import slots as spark_slots

database = json.loads(sys.argv[2])

def cut(message):
    if sys.argv[3] == "cut" and message == "load: started":
        with psycopg2.connect(**database) as admin, admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'dpone-state' AND datname = %s", (database["dbname"],))

spark = get_spark()
slots = spark_slots.produce_slots(spark) if hasattr(spark_slots, "produce_slots") else None
try:
    run_pipeline(parse_manifest(open(sys.argv[1]).read()), spark, RunRequest(log=cut))
    print(json.dumps({"slots": slots, "error": None}))
except Exception as exc:
    print(json.dumps({"slots": slots, "error": str(exc)}))
"""


@pytest.mark.spark_connect
def test_the_window_holds_on_a_spark_connect_server(broker, kafka_env, pg_env, pg_database, tmp_path, fault_outcome):
    """On Spark Connect no SparkContext tells the task slots; the window is the server's (local[2]
    here). 20 slices of 50 records; the state store connection is cut when the load starts: the
    unstored deliveries stay within the window (they used to be the whole batch)."""
    from test_spark_connect import dpone

    from dpone_dagster.embedded_broker import free_port

    per_slice = 50
    bs = broker.bootstrap_servers
    src, dst = unique_topic("cwin"), unique_topic("cwin_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    ids = list(range(20 * per_slice))
    produce_json(bs, src, [{"i": i} for i in ids], partition=0)
    path = tmp_path / "connect_window.yaml"
    path.write_text(manifest("connect_window", src, dst, per_slice))
    home = tmp_path / "server"
    home.mkdir()
    env = {**os.environ, "DPONE_SPARK_MASTER": "local[2]"}
    env.pop("DPONE_SPARK_REMOTE", None)
    started = dpone("spark-server", "start", "--port", str(free_port()), env=env, cwd=home)
    assert started.returncode == 0, started.stdout + started.stderr
    url = next(line.split("=", 1)[1] for line in started.stdout.splitlines() if line.startswith("export DPONE_SPARK_REMOTE="))
    m = parse_manifest(path.read_text())

    def client(mode: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", CONNECT_RUN, str(path), json.dumps(pg_database), mode],
            env={**os.environ, "DPONE_SPARK_REMOTE": url}, capture_output=True, text=True, timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    try:
        outcome = client("cut")
        assert outcome["error"] and "state store connection" in outcome["error"], outcome
        assert stored_offsets(m) == {}
        delivered = [json.loads(r["value"])["i"] for r in consume_raw(bs, dst)]
        assert len(delivered) <= 2 * per_slice, f"{len(delivered)} records delivered and not stored"
        assert outcome["slots"] == 2
        assert client("rerun")["error"] is None
    finally:
        dpone("spark-server", "stop", env=env, cwd=home)
    assert stored_offsets(m) == {0: len(ids)}
    assert Counter(r["value"]["i"] for r in consume_all(bs, dst)) == Counter(ids) + Counter(delivered)
    fault_outcome(
        "3d. State store connection terminated at its first write, on a Spark Connect server (direct path)",
        "The window of open slices is the server's task slots (spark.master local[N], spark.default.parallelism, else 4): "
        "the unstored deliveries stay within it",
        lost=0,
        duplicated=len(delivered),
        recovered=True,
        measured=f"20 slices of {per_slice}; window {outcome['slots']}; {len(delivered)} delivered and not stored (bound {2 * per_slice})",
    )
