"""The state store fails for real in the middle of a run: its PostgreSQL connection is terminated
from another session (pg_terminate_backend) just as the run writes the state — at the final commit
(the Spark SQL path stores offsets only there), or at the first slice the direct path stores while
it produces. The run reports the lost state store as the cause, the stored offsets stay where the
last write that committed left them, the failed run is still recorded, and the rerun completes
(re-delivering what was not stored: at-least-once)."""

from __future__ import annotations

from collections import Counter

import psycopg2
import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.sources.kafka import default_group_id
from dpone_dagster.state.open import open_manifest_state_store

pytestmark = pytest.mark.faults


def manifest(src: str, dst: str, records_per_task: int = 250_000) -> str:
    return f"""
name: state_fault
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {{records_per_task: {records_per_task}}}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}, strategy: {{mode: incremental_append}}}}
state: {{type: postgres, connection_id: postgres_state}}
"""


def terminate_state_connections(database: dict) -> int:
    with psycopg2.connect(**database) as admin, admin.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'dpone-state' AND datname = %s",
            (database["dbname"],),
        )
        return cur.fetchone()[0]


# Where the connection is cut: (path, the log line just before the state write, offsets after the
# failed run, messages the rerun produces).
# The second run reads 6 new records in slices of 2: more slices than task slots, so the direct
# path stores them one by one.
MOMENTS = {
    "final commit, Spark SQL path": ("off", "commit: started", {0: 3}, 6),
    "first slice stored, direct path": ("on", "load: started", {0: 3}, 6),
    "final commit, direct path": ("on", "commit: started", {0: 9}, 0),
}


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_the_state_store_connection_killed_at_commit(broker, spark, kafka_env, pg_env, pg_database, monkeypatch, fault_outcome, moment):
    direct, cut_at, offsets_after, redelivered = MOMENTS[moment]
    monkeypatch.setenv("DPONE_DIRECT_PATH", direct)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("stfault"), unique_topic("stfault_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    m = parse_manifest(manifest(src, dst, records_per_task=2))
    produce_json(bs, src, [{"i": i} for i in range(3)], partition=0)
    assert run_pipeline(m, spark).committed_offsets == {0: 3}

    produce_json(bs, src, [{"i": i} for i in range(3, 9)], partition=0)
    killed: list[int] = []

    def kill(message: str) -> None:
        if message == cut_at:
            killed.append(terminate_state_connections(pg_database))

    with pytest.raises(RunFailed, match="state store connection .* was lost") as failure:
        run_pipeline(m, spark, RunRequest(log=kill))
    assert killed and killed[0] >= 1
    assert str(failure.value).startswith("the state store connection")  # the cause, not the failure handler's error

    store = open_manifest_state_store(m)
    try:
        assert store.load_offsets(src, default_group_id(m)) == offsets_after  # only what committed
        assert [r.status for r in store.list_runs(m.name)][:2] == ["failed", "success"]
    finally:
        store.close()
    # What the failed run delivered: on the direct path at most the window of slices open at once
    # beyond the stored offsets (2 task slots × 2 records); on the Spark SQL path its whole batch.
    delivered = [r["value"]["i"] for r in consume_all(bs, dst)]
    assert sorted(delivered)[:3] == [0, 1, 2] and len(delivered) == len(set(delivered)) and set(delivered) <= set(range(9))
    unstored = [i for i in delivered if i >= offsets_after[0]]
    assert len(unstored) <= (2 * 2 if direct == "on" else 6)

    rerun = run_pipeline(m, spark)
    assert rerun.committed_offsets == {0: 9} and rerun.messages_produced == redelivered
    arrived = Counter(r["value"]["i"] for r in consume_all(bs, dst))
    assert arrived == Counter(range(9)) + Counter(unstored)  # nothing lost; again only what was not stored
    duplicated = sum(arrived.values()) - 9
    fault_outcome(
        f"3. State store connection terminated at the {moment} (pg_terminate_backend)",
        "The run fails naming the lost state store; the offsets stay where the last committed write left them; "
        "the failed run is recorded on reconnect; the rerun completes",
        lost=0,
        duplicated=duplicated,
        recovered=True,
        measured=(
            f"6 new records in 3 slices of 2; the failed run delivered {len(delivered) - 3} of them, stored up to {offsets_after}; "
            + (f"the rerun re-delivered the {redelivered} not stored, {duplicated} of them twice (at-least-once)" if redelivered else "every slice was stored before the commit: the rerun had nothing to send")
        ),
    )


def test_a_topic_recreated_with_fewer_partitions_fails_loudly(broker, spark, kafka_env, tmp_path, fault_outcome):
    """Stored offsets for a partition the topic no longer has: the run reads nothing and says why
    (before, the planner dropped the partition and carried on)."""
    from confluent_kafka.admin import AdminClient

    bs = broker.bootstrap_servers
    src, dst = unique_topic("shrunk"), unique_topic("shrunk_out")
    create_topic(bs, src, 3)
    create_topic(bs, dst, 1)
    for partition in range(3):
        produce_json(bs, src, [{"i": partition * 10 + i} for i in range(2)], partition=partition)
    m = parse_manifest(manifest(src, dst).replace("state: {type: postgres, connection_id: postgres_state}", f"state: {{type: local, path: {tmp_path}}}"))
    assert run_pipeline(m, spark).committed_offsets == {0: 2, 1: 2, 2: 2}

    admin = AdminClient({"bootstrap.servers": bs})
    admin.delete_topics([src])[src].result(timeout=30)
    create_topic(bs, src, 2)
    for partition in range(2):
        produce_json(bs, src, [{"i": 100 + partition * 10 + i} for i in range(4)], partition=partition)

    with pytest.raises(RunFailed, match=r"partition\(s\) \[2\] have stored offsets but no longer exist.*dpone state reset"):
        run_pipeline(m, spark)
    store = open_manifest_state_store(m)
    try:
        assert store.load_offsets(src, default_group_id(m)) == {0: 2, 1: 2, 2: 2}
    finally:
        store.close()
    assert len(consume_all(bs, dst)) == 6  # nothing more was produced
    fault_outcome(
        "6b. Source topic recreated with fewer partitions",
        "The run fails before reading, naming the vanished partitions and `dpone state reset`; stored offsets unchanged",
        lost=0,
        duplicated=0,
        recovered=True,
        measured="stored offsets for partitions 0-2, topic now has 2: run refused, 0 produced",
    )


def test_two_processes_started_together_run_once(broker, tmp_path, fault_outcome):
    """Two real `dpone run` processes of one pipeline, started at the same moment on one state
    store: exactly one runs, the other exits naming the lock holder; every record arrives once."""
    import os
    import subprocess
    import sys

    bs = broker.bootstrap_servers
    src, dst = unique_topic("twice"), unique_topic("twice_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 1)
    for partition in range(2):
        produce_json(bs, src, [{"i": partition * 10_000 + i} for i in range(3000)], partition=partition)
    path = tmp_path / "twice.yaml"
    path.write_text(manifest(src, dst).replace("state: {type: postgres, connection_id: postgres_state}", f"state: {{type: local, path: {tmp_path / 'state'}}}"))
    env = {**os.environ, "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": bs, "DPONE_SPARK_MASTER": "local[1]"}
    command = [sys.executable, "-m", "dpone_dagster.cli", "run", str(path)]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outcomes = sorted((p.wait(timeout=300), p.stdout.read()) for p in procs)
    assert [code for code, _ in outcomes] == [0, 1], outcomes
    assert "another run holds pipeline 'state_fault'" in outcomes[1][1]
    assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == sorted(p * 10_000 + i for p in range(2) for i in range(3000))
    fault_outcome(
        "4. Two runs of one pipeline started at the same moment (two processes)",
        "Exactly one runs; the other exits with code 1 naming the lock holder",
        lost=0,
        duplicated=0,
        recovered=True,
        measured="6,000 records, each delivered once; exit codes [0, 1]",
    )
