"""Faults injected for real in the middle of a run, each proven from the data: what the target
topic holds and what the state store stores, never from log text.

- the driver process killed with SIGKILL while it produces, and a Spark Python worker killed
  while its task produces;
- the broker frozen (SIGSTOP) while the run delivers, and resumed after the run gave up;
- the Schema Registry gone between extraction and encoding;
- the artifacts directory on a full disk;
- a poison record (undecodable, or larger than the producer may send) under each on_error policy;
- records removed by retention below the stored offsets.

Each test reports what it measured through the fault_outcome fixture; scripts/reliability-report
runs this suite and turns those lines into docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
    target_high_watermarks,
    unique_topic,
    wait_for,
)

from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import DponeError, RunFailed, is_retryable
from dpone_dagster.kafka.boundary import Watermarks, plan_offset_ranges
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sources.kafka import default_group_id
from dpone_dagster.state.open import open_manifest_state_store

pytestmark = pytest.mark.faults


def manifest(name: str, src: str, dst: str, state: str = "{type: postgres, connection_id: postgres_state}", source_options: str = "", sink_options: str = "") -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    group_id: g_{src}
{source_options}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{producer_config: {{message.timeout.ms: 8000}}}}
{sink_options}
state: {state}
"""


def stored_offsets(m: Manifest) -> dict[int, int]:
    store = open_manifest_state_store(m)
    try:
        assert m.source.type == "kafka"
        return store.load_offsets(m.source.topic, default_group_id(m))
    finally:
        store.close()


def source_rows(bootstrap: str, topic: str, partitions: int, per_partition: int) -> list[int]:
    """`per_partition` JSON records {"i": n} in each partition; returns every n."""
    ids = []
    for p in range(partitions):
        rows = [{"i": p * 1_000_000 + i} for i in range(per_partition)]
        produce_json(bootstrap, topic, rows, partition=p, linger_ms=50)
        ids.extend(r["i"] for r in rows)
    return ids


def delivery_outcome(bootstrap: str, dst: str, ids: list[int]) -> tuple[int, int]:
    """(lost, duplicated) of the target against the source ids."""
    arrived = Counter(r["value"]["i"] for r in consume_all(bootstrap, dst, timeout_s=60))
    lost = sum(1 for i in ids if i not in arrived)
    duplicated = sum(count - 1 for count in arrived.values())
    assert set(arrived) <= set(ids)
    return lost, duplicated


# --------------------------------------------------------------------------- 1. processes killed


def test_driver_killed_with_sigkill_mid_produce(broker, spark, kafka_env, pg_env, tmp_path, fault_outcome):
    """A real `dpone run` process is killed once the target holds some but not all records. Its
    slices of 20,000 records were stored as they were delivered, so the kill loses none of that
    progress: the rerun (here, in another process) starts from the stored offsets, delivers every
    record and stores the end offsets, and a third run has nothing to do. Duplicates are bounded
    by the slices in flight at the kill (two task slots), not by what the killed run delivered."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("kill"), unique_topic("kill_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    ids = source_rows(bs, src, 2, 100_000)
    per_slice = 20_000
    text = manifest("fault_kill", src, dst, source_options=f"    records_per_task: {per_slice}")
    path = tmp_path / "kill.yaml"
    path.write_text(text)
    env = {**os.environ, "DPONE_SPARK_MASTER": "local[2]"}
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dpone_dagster.cli", "run", str(path)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or target_high_watermarks(bs, dst) >= 3 * per_slice, 180, "three slices delivered")
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        # The JVM and its Python workers follow their driver; make sure none outlives the test.
        time.sleep(2)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    delivered_by_killed_run = len(consume_raw(bs, dst, timeout_s=60))
    assert 0 < delivered_by_killed_run < len(ids), f"killed too late: {delivered_by_killed_run} of {len(ids)} delivered"
    m = parse_manifest(text)
    kept = stored_offsets(m)  # the slices delivered before the kill
    assert sum(kept.values()) >= per_slice and all(o % per_slice == 0 for o in kept.values()), kept

    rerun = run_pipeline(m, spark)
    assert rerun.committed_offsets == {0: 100_000, 1: 100_000}
    assert rerun.rows_extracted == len(ids) - sum(kept.values())  # the rerun read only what was not stored
    assert stored_offsets(m) == {0: 100_000, 1: 100_000}
    lost, duplicated = delivery_outcome(bs, dst, ids)
    assert lost == 0
    # At-least-once: what the killed run delivered beyond its stored offsets, i.e. the slices open
    # at the kill (running, or delivered behind a slower one): at most the two task slots' worth.
    assert duplicated == delivered_by_killed_run - sum(kept.values()) <= 2 * per_slice
    assert run_pipeline(m, spark).messages_produced == 0
    fault_outcome(
        "1a. Driver process killed (SIGKILL) mid-produce",
        "Slices delivered before the kill were stored as they completed; the rerun re-reads from there and delivers the rest; a third run delivers nothing",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=(
            f"200,000 records in slices of {per_slice:,}; killed after {delivered_by_killed_run:,} had arrived, "
            f"{sum(kept.values()):,} of them stored; duplicates after rerun {duplicated:,} (the slices in flight)"
        ),
    )


def test_spark_python_worker_killed_mid_task(broker, spark, kafka_env, pg_env, fault_outcome):
    """The Python worker producing a task's messages is killed (SIGKILL): the task fails, the run
    fails without committing, and the rerun delivers every record once more at most."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("wkill"), unique_topic("wkill_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    ids = source_rows(bs, src, 2, 100_000)
    m = parse_manifest(manifest("fault_worker", src, dst))
    killed: list[int] = []
    with pytest.raises(DponeError):
        run_pipeline(m, spark, RunRequest(log=once_delivering(bs, dst, lambda: kill_python_workers(killed))))
    assert killed, "no Python worker was found to kill"
    delivered_by_failed_run = len(consume_raw(bs, dst, timeout_s=60))
    assert delivered_by_failed_run < len(ids)
    assert stored_offsets(m) == {}

    rerun = run_pipeline(m, spark)
    assert rerun.committed_offsets == {0: 100_000, 1: 100_000}
    lost, duplicated = delivery_outcome(bs, dst, ids)
    assert lost == 0 and duplicated <= delivered_by_failed_run
    fault_outcome(
        "1b. Spark Python worker killed (SIGKILL) mid-task",
        "The task fails, so the run fails without committing (no partial slice is ever committed); the rerun delivers everything",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"200,000 records; {len(killed)} worker(s) killed after {delivered_by_failed_run:,} had arrived; duplicates after rerun {duplicated:,}",
    )


# --------------------------------------------------------------------------- 2. broker frozen


def test_broker_frozen_mid_delivery_then_resumed(spark, pg_env, monkeypatch, fault_outcome):
    """A dedicated broker is frozen with SIGSTOP once the target holds some records: deliveries time
    out (message.timeout.ms 8 s), the run fails with the cause and commits nothing. The broker is
    resumed (SIGCONT) after the run gave up, and the rerun completes. (The embedded broker keeps its
    data in memory, so a stop and restart would lose the source too; freezing keeps it.)"""
    broker = EmbeddedBroker().start()
    frozen_at: list[float] = []
    try:
        bs = broker.bootstrap_servers
        monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", bs)
        src, dst = "src", "dst"
        create_topic(bs, src, 2)
        create_topic(bs, dst, 2)
        ids = source_rows(bs, src, 2, 100_000)
        m = parse_manifest(manifest("fault_broker", src, dst))
        pid = broker._process.pid
        on_log = freeze_once_delivering(pid, bs, dst, frozen_at)
        with pytest.raises(RunFailed, match=r"not delivered: (delivery timed out|broker unavailable|all brokers are down)"):
            run_pipeline(m, spark, RunRequest(log=on_log))
        assert frozen_at
        os.kill(pid, signal.SIGCONT)
        assert stored_offsets(m) == {}
        delivered_by_failed_run = len(consume_raw(bs, dst, timeout_s=60))
        assert delivered_by_failed_run < len(ids)

        rerun = run_pipeline(m, spark)
        assert rerun.committed_offsets == {0: 100_000, 1: 100_000}
        lost, duplicated = delivery_outcome(bs, dst, ids)
        assert lost == 0 and duplicated <= delivered_by_failed_run
    finally:
        if broker._process is not None:
            os.kill(broker._process.pid, signal.SIGCONT)
        broker.stop()
    fault_outcome(
        "2. Broker frozen (SIGSTOP) mid-delivery, resumed after the run failed",
        "Deliveries time out; the run fails naming the cause and commits nothing; the rerun completes",
        lost=lost,
        duplicated=duplicated,
        recovered=True,
        measured=f"200,000 records; {delivered_by_failed_run:,} arrived before the run gave up; duplicates after rerun {duplicated:,}",
    )


# --------------------------------------------------------------------------- 5. retention gap


def test_retention_gap_policy_in_offsets_mode():
    """Stored offset 5, log start 20: fail stops with the fix; warn reads on from 20 and reports the
    15 records retention removed."""
    watermarks = {0: Watermarks(20, 50), 1: Watermarks(0, 10)}
    with pytest.raises(RunFailed, match=r"t\[0\]: stored offset 5 is below the log start offset 20 \(retention removed 15 .*on_retention_gap: warn"):
        plan_offset_ranges("t", watermarks, {0: 5, 1: 3}, "stored")
    warned = plan_offset_ranges("t", watermarks, {0: 5, 1: 3}, "stored", "warn")
    assert [(r.start, r.end) for r in warned.ranges] == [(20, 50), (3, 10)]
    assert warned.as_dict()["lost_to_retention"] == {0: 15}
    assert any(n.startswith("warning: t[0]: stored offset 5") for n in warned.notes)


def test_retention_gap_in_a_run(broker, spark, kafka_env, pg_env, monkeypatch, fault_outcome):
    """The whole run under both policies. The embedded broker never runs retention and cannot
    delete records (DeleteRecords crashes it), so this is the one fake here: the log start offset
    the source reads is raised to 4 (the records below it stay on the broker but count as gone)."""
    from dpone_dagster.kafka import inspect

    bs = broker.bootstrap_servers
    src, dst = unique_topic("gap"), unique_topic("gap_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"i": i} for i in range(2)], partition=0)
    text = manifest("fault_gap", src, dst)
    m = parse_manifest(text)
    assert run_pipeline(m, spark).committed_offsets == {0: 2}
    produce_json(bs, src, [{"i": i} for i in range(2, 10)], partition=0)

    real = inspect.verified_watermarks

    def retention_removed_up_to_4(consumer: Any, topic: str, partitions: Any) -> dict[int, Watermarks]:
        return {p: Watermarks(max(w.low, 4), w.high) for p, w in real(consumer, topic, partitions).items()}

    monkeypatch.setattr(inspect, "verified_watermarks", retention_removed_up_to_4)
    with pytest.raises(RunFailed, match=r"stored offset 2 is below the log start offset 4 \(retention removed 2"):
        run_pipeline(m, spark)
    assert stored_offsets(m) == {0: 2} and len(consume_raw(bs, dst)) == 2  # no silent jump

    warn = parse_manifest(text.replace(f"    group_id: g_{src}", f"    group_id: g_{src}\n    on_retention_gap: warn"))
    result = run_pipeline(warn, spark)
    assert result.committed_offsets == {0: 10} and result.boundary["lost_to_retention"] == {0: 2}
    assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == [0, 1, 4, 5, 6, 7, 8, 9]
    fault_outcome(
        "5. Retention removed records the stored offsets point to (offsets mode)",
        "on_retention_gap fail (default): the run stops before reading, with the fix; warn: reads on from the log start and records lost_to_retention per partition",
        lost=0,
        duplicated=0,
        recovered=True,
        measured="fail: offsets stay at 2, nothing produced; warn: 6 records delivered, lost_to_retention {0: 2} reported (records retention removed, not lost by the run)",
    )


# --------------------------------------------------------------------------- 6. topic changes shape


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced until the result arrives
    admin.delete_topics([topic])[topic].result(timeout=30)
    create_topic(bootstrap, topic, partitions)


def test_partitions_added_are_read_from_their_start(broker, spark, kafka_env, pg_env, fault_outcome):
    """Stored offsets cover partitions 0 and 1; the topic now has a partition 2 as well (recreated
    with three: the embedded broker refuses CreatePartitions). Partition 2 is read from offset 0."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("grown"), unique_topic("grown_out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 1)
    for p in range(2):
        produce_json(bs, src, [{"i": p * 100 + i} for i in range(2)], partition=p)
    m = parse_manifest(manifest("fault_grown", src, dst))
    assert run_pipeline(m, spark).committed_offsets == {0: 2, 1: 2}

    recreate_topic(bs, src, 3)
    for p in range(2):  # the same two records again, then a new one: offsets 0..2
        produce_json(bs, src, [{"i": p * 100 + i} for i in range(3)], partition=p)
    produce_json(bs, src, [{"i": 200 + i} for i in range(4)], partition=2)
    result = run_pipeline(m, spark)
    assert result.committed_offsets == {0: 3, 1: 3, 2: 4}
    assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == [0, 1, 2, 100, 101, 102, 200, 201, 202, 203]
    fault_outcome(
        "6a. Partitions added to the source topic",
        "New partitions are read from their first offset; the others from their stored offsets",
        lost=0,
        duplicated=0,
        recovered=True,
        measured="stored {0: 2, 1: 2}; partition 2 (4 records) read from 0; committed {0: 3, 1: 3, 2: 4}",
    )


def test_topic_recreated_behind_the_stored_offsets_fails_loudly(broker, spark, kafka_env, pg_env, tmp_path, fault_outcome):
    """The topic was deleted and recreated: its offsets now end before the stored ones. The run
    reads nothing and names the fix; the stored offsets stay; after `dpone state reset` it runs."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("reborn"), unique_topic("reborn_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"i": i} for i in range(5)], partition=0)
    m = parse_manifest(manifest("fault_reborn", src, dst))
    assert run_pipeline(m, spark).committed_offsets == {0: 5}

    recreate_topic(bs, src, 1)
    produce_json(bs, src, [{"i": 10 + i} for i in range(2)], partition=0)
    with pytest.raises(RunFailed, match=r"stored offset 5 is beyond the high watermark 2 .*dpone state reset"):
        run_pipeline(m, spark)
    assert stored_offsets(m) == {0: 5} and len(consume_raw(bs, dst)) == 5

    path = tmp_path / "reborn.yaml"
    path.write_text(manifest("fault_reborn", src, dst))
    reset = subprocess.run([sys.executable, "-m", "dpone_dagster.cli", "state", "reset", str(path), "--yes"], capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr
    assert run_pipeline(m, spark).committed_offsets == {0: 2}
    assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == [0, 1, 2, 3, 4, 10, 11]
    fault_outcome(
        "6c. Source topic deleted and recreated (offsets behind the stored ones)",
        "The run fails before reading, naming `dpone state reset`; stored offsets unchanged; after the reset the new topic is read from its start",
        lost=0,
        duplicated=0,
        recovered=True,
        measured="stored {0: 5}, new high watermark 2: run refused, 0 produced; after reset 2 records delivered",
    )


# --------------------------------------------------------------------------- 7. registry gone


class _Registry:
    """A minimal Schema Registry REST server (subjects, versions, ids), because no registry server
    can be installed here; it is stopped and started again on the same port to make it unreachable."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any]] = []  # id - 1 -> {"schema", "schemaType"}
        self.subjects: dict[str, list[int]] = {}
        self.requests = 0
        # Requests answered before the registry goes away (None: never): later ones are dropped
        # unanswered, then the server stops listening.
        self.answer_only: int | None = None
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> _Registry:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one_request(self) -> None:
                if registry.answer_only is not None and registry.requests >= registry.answer_only:
                    self.close_connection = True  # gone: the connection closes unanswered
                    threading.Thread(target=registry.stop, daemon=True).start()
                    return
                super().handle_one_request()

            def reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                registry.requests += 1
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["schemas", "ids"]:
                    return self.reply(200, registry.schemas[int(parts[2]) - 1])
                if parts[0] == "subjects" and len(parts) >= 3:
                    ids = registry.subjects.get(parts[1])
                    if not ids:
                        return self.reply(404, {"error_code": 40401, "message": "Subject not found"})
                    if len(parts) == 3:
                        return self.reply(200, list(range(1, len(ids) + 1)))
                    version = len(ids) if parts[3] == "latest" else int(parts[3])
                    return self.reply(200, registry.version(parts[1], version))
                return self.reply(404, {"error_code": 404, "message": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                registry.requests += 1
                parts = self.path.split("?")[0].strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                schema = {"schema": body["schema"], "schemaType": body.get("schemaType", "AVRO")}
                ids = registry.subjects.setdefault(parts[1], [])
                known = [i for i in ids if registry.schemas[i - 1]["schema"] == schema["schema"]]
                if parts[-1] == "versions":
                    if not known:
                        registry.schemas.append(schema)
                        ids.append(len(registry.schemas))
                        known = [ids[-1]]
                    return self.reply(200, {"id": known[0]})
                if not known:
                    return self.reply(404, {"error_code": 40403, "message": "Schema not found"})
                return self.reply(200, registry.version(parts[1], ids.index(known[0]) + 1))

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def version(self, subject: str, version: int) -> dict[str, Any]:
        schema_id = self.subjects[subject][version - 1]
        return {"subject": subject, "version": version, "id": schema_id, **self.schemas[schema_id - 1]}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def test_schema_registry_unreachable_mid_run(broker, spark, kafka_env, pg_env, monkeypatch, fault_outcome):
    """The registry answers the run's first call, then goes away (connections closed unanswered):
    the run fails before producing anything and commits nothing; with the registry back the rerun
    delivers every record, Avro-encoded under the registered schema id."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = _Registry().start()
    try:
        monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{registry.port}")
        bs = broker.bootstrap_servers
        src, dst = unique_topic("srmid"), unique_topic("srmid_out")
        create_topic(bs, src, 1)
        create_topic(bs, dst, 1)
        ids = source_rows(bs, src, 1, 500)
        sink = "    message_format: avro\n    schema_registry: {enabled: true}"
        m = parse_manifest(manifest("fault_registry", src, dst, sink_options=sink))
        registry.answer_only = 1  # the first call of the run is answered, then the registry is gone

        with pytest.raises(DponeError, match="Schema Registry unavailable") as failure:
            run_pipeline(m, spark)
        assert is_retryable(failure.value)  # under Dagster, the run retries by itself
        answered = registry.requests
        assert answered == 1
        assert consume_raw(bs, dst) == [] and stored_offsets(m) == {}

        wait_for(lambda: registry._server is None, 10, "the registry to stop")
        registry.answer_only = None
        registry.start()  # same port, same subjects
        assert run_pipeline(m, spark).committed_offsets == {0: 500}
        decode = AvroDeserializer(SchemaRegistryClient({"url": f"http://127.0.0.1:{registry.port}"}))
        values = [decode(r["value"], SerializationContext(dst, MessageField.VALUE)) for r in consume_raw(bs, dst)]
        assert sorted(v["i"] for v in values) == ids
    finally:
        registry.stop()
    fault_outcome(
        "7. Schema Registry unreachable mid-run (Avro sink)",
        "The run fails before producing and commits nothing; the rerun encodes and delivers everything",
        lost=0,
        duplicated=0,
        recovered=True,
        measured=f"500 records; the registry answered {answered} call of the run, then went away; 0 produced by the failed run",
    )


# --------------------------------------------------------------------------- 8. disk full


@pytest.fixture
def full_disk(tmp_path: Path) -> Any:
    """A directory on a 1 MB tmpfs filled to the last byte (mounting needs root: CI runs as root;
    elsewhere the test is skipped with the reason)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    mount = tmp_path / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        filler = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: the disk is full
        finally:
            os.close(filler)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("how", ["disk_full", "not_a_directory"])
def test_artifacts_cannot_be_written(broker, spark, kafka_env, pg_env, tmp_path, request, how, fault_outcome):
    """The artifacts directory is on a full disk (ENOSPC), or cannot be created (a file is in the
    way): artifacts are written after the commit, so the data and offsets are unaffected, and the
    run's notes say the artifacts are missing."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("full"), unique_topic("full_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    ids = source_rows(bs, src, 1, 100)
    if how == "disk_full":
        artifacts, error = request.getfixturevalue("full_disk") / "runs", "No space left on device"
    else:
        (tmp_path / "a_file").write_text("")
        artifacts, error = tmp_path / "a_file" / "runs", "Not a directory"
    text = manifest(f"fault_{how}", src, dst) + f"observability: {{artifacts: {{enabled: true, path: {artifacts}}}}}\n"
    m = parse_manifest(text)
    result = run_pipeline(m, spark)
    assert result.committed_offsets == {0: 100} and stored_offsets(m) == {0: 100}
    assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == ids
    assert any(n.startswith("artifacts: could not be written") and error in n for n in result.notes), result.notes
    fault_outcome(
        f"8. Artifacts directory unwritable ({how.replace('_', ' ')})",
        "Artifacts are written after the commit: data and offsets are unaffected; the run's notes (CLI output, Dagster metadata) say the artifacts are missing",
        lost=0,
        duplicated=0,
        recovered=True,
        measured=f"100 records delivered and committed; the artifact write failed ({error}) and was reported",
    )


# --------------------------------------------------------------------------- 9. poison records


POISON = {
    "undecodable": (b"\xff\xfe not json", "value is not JSON"),
    "oversize": (json.dumps({"i": -1, "blob": "x" * 5000}).encode(), "message of"),
}


@pytest.mark.parametrize("policy", ["fail", "skip", "dead_letter"])
@pytest.mark.parametrize("poison", sorted(POISON))
def test_poison_record_under_each_policy(broker, spark, kafka_env, pg_env, policy, poison, fault_outcome):
    """Records 0..4, the poison record at offset 5, records 6..9. fail: nothing produced, offsets
    unchanged; skip: the 9 good records delivered, offsets past the poison; dead_letter: the same,
    and the poison record's original bytes in the dead-letter topic with the reason."""
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("poison"), unique_topic("poison_out"), unique_topic("poison_dlq")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    payload, reason = POISON[poison]
    produce_json(bs, src, [{"i": i} for i in range(5)] + [payload] + [{"i": i} for i in range(6, 10)], partition=0)
    options = f"    on_error: {policy}\n    schema: [{{name: i, type: long}}, {{name: blob, type: string}}]"
    if policy == "dead_letter":
        options += f"\n    dead_letter: {{topic: {dlq}, create: true}}"
    text = manifest(f"fault_poison_{poison}_{policy}", src, dst, source_options=options)
    text = text.replace("message.timeout.ms: 8000", "message.timeout.ms: 8000, message.max.bytes: 2000")
    m = parse_manifest(text)
    good = [i for i in range(10) if i != 5]
    if policy == "fail":
        with pytest.raises(RunFailed, match=reason):
            run_pipeline(m, spark)
        assert consume_raw(bs, dst) == [] and stored_offsets(m) == {}
        outcome = "the run fails naming the record (0@5) before producing; offsets unchanged"
    else:
        result = run_pipeline(m, spark)
        assert result.committed_offsets == {0: 10} and stored_offsets(m) == {0: 10}
        assert sorted(r["value"]["i"] for r in consume_all(bs, dst)) == good
        counted = result.rows_skipped if policy == "skip" else result.rows_dead_lettered
        assert counted == 1 and result.messages_produced == 9
        if policy == "dead_letter":
            (letter,) = consume_raw(bs, dlq)
            headers = {k: v.decode() for k, v in letter["headers"]}
            assert headers["dpone.error.source.offset"] == "5" and reason in headers["dpone.error.reason"]
            if poison == "oversize":
                # Too large for the dead-letter topic as well: the value is left in the source.
                assert letter["value"] == b"" and headers["dpone.error.value_omitted"] == str(len(payload))
                outcome = "9 records delivered; the dead letter names the record (source offset 5, reason) and omits its value, too large to send (dpone.error.value_omitted); offsets past it"
            else:
                assert letter["value"] == payload and "dpone.error.value_omitted" not in headers
                outcome = "9 records delivered, the poison record's original bytes in the dead-letter topic with its reason; offsets past it"
        else:
            outcome = "9 records delivered, 1 counted as skipped; offsets past it"
    fault_outcome(
        f"9. Poison record ({poison}) with on_error: {policy}",
        outcome,
        lost=0,
        duplicated=0,
        recovered=True,
        measured=f"10 records, poison at offset 5: {'0' if policy == 'fail' else '9'} delivered",
    )
