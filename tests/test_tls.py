"""Every Kafka client a run creates speaks TLS for real, configured the way a user configures it:
connection_id kafka_cluster from the environment (`KAFKA_CLUSTER_SECURITY_PROTOCOL=SSL`,
`KAFKA_CLUSTER_SSL_CA_LOCATION=<CA bundle>`).

The module's broker is the embedded broker in TLS mode (a certificate for 127.0.0.1 made here with
openssl; the bundled Tansu ignores its `--cert`, so EmbeddedBroker terminates TLS in front of it)
and refuses plain-text clients, so data that arrived went through TLS; the assertions read
the target topics, the dead letters and the control topic back over TLS and check the stored
offsets. A second, unrelated CA must fail a run fast, with a message naming certificate
verification and `ssl_ca_location`, before anything is produced or stored.

Spark runs in local mode, so the tasks read the CA file at the same path as the driver. The
connection passes the path, not the certificate, and the project documents no way to ship the file
(docs/spark-cluster.md ships the Python environment only): on a cluster it must exist at that path
on every executor.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from dagster import DagsterInstance, Definitions, RunRequest, SensorResult, build_sensor_context
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset, source_asset_specs
from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.engine.lag import source_lag
from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import DponeError
from dpone_dagster.kafka.errors import classify_kafka, client_failure, record_client_error
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.replication.control_topic import read_committed_offsets
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource
from dpone_dagster.sensors import build_source_sensor
from dpone_dagster.sources.kafka import default_group_id
from dpone_dagster.state.local import LocalStateStore

# A run that cannot verify the broker must give up within this bound (seconds).
WRONG_CA_BOUND_S = 90.0


# --------------------------------------------------------------------------- certificates, broker


@dataclass(frozen=True)
class Pki:
    server_pem: Path  # the broker's certificate and private key, one file
    ca: Path  # the broker's (self-signed) certificate: the CA bundle that verifies it
    wrong_ca: Path  # an unrelated self-signed CA for the same name


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for CN and IP SAN 127.0.0.1; returns (certificate, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory, "broker")
    wrong, _ = self_signed(directory, "other")
    pem = directory / "broker.pem"
    pem.write_text(cert.read_text() + key.read_text())
    return Pki(server_pem=pem, ca=cert, wrong_ca=wrong)


@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tls_pem=pki.server_pem) as running:
        yield running


@pytest.fixture
def tls_env(tls_broker: EmbeddedBroker, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """connection_id kafka_cluster over TLS, from the environment as documented (README, Connections)."""
    return set_connection(monkeypatch, tls_broker, pki.ca)


def set_connection(
    monkeypatch: pytest.MonkeyPatch, broker: EmbeddedBroker, ca: Path, connection_id: str = "kafka_cluster"
) -> dict[str, str]:
    prefix = connection_id.upper()
    env = {
        f"{prefix}_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        f"{prefix}_SECURITY_PROTOCOL": "SSL",
        f"{prefix}_SSL_CA_LOCATION": str(ca),
    }
    for field in ("BOOTSTRAP_SERVERS", "SECURITY_PROTOCOL", "SSL_CA_LOCATION"):  # DPONE_CONN_* would win
        monkeypatch.delenv(f"DPONE_CONN_{prefix}_{field}", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


# --------------------------------------------------------------------------- the test's own TLS clients


def tls_config(broker: EmbeddedBroker, ca: Path) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SSL", "ssl.ca.location": str(ca)}


def create_topics(config: dict[str, Any], topics: dict[str, int]) -> None:
    admin = AdminClient(config)
    futures = admin.create_topics([NewTopic(topic, partitions, 1) for topic, partitions in topics.items()])
    for future in futures.values():
        future.result(timeout=30)


def produce(config: dict[str, Any], topic: str, partition: int, values: list[bytes], key: bytes | None = None) -> None:
    producer = Producer(config)
    for value in values:
        producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def as_json(rows: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(row).encode() for row in rows]


@dataclass(frozen=True)
class Record:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


def read_topic(config: dict[str, Any], topic: str, timeout_s: float = 30.0) -> list[Record]:
    """Every committed record of `topic`, each partition read to its end."""
    consumer = Consumer({
        **config,
        "group.id": f"tls-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
    })
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions, records = set(partitions), []
        deadline = time.monotonic() + timeout_s
        while open_partitions and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(message.partition())
                elif error is None:
                    headers = {k: (v or b"").decode() for k, v in message.headers() or []}
                    records.append(Record(message.partition(), message.key(), message.value(), headers))
        assert not open_partitions, f"{topic}: partitions {open_partitions} not read to their end"
        return records
    finally:
        consumer.close()


def topic_exists(config: dict[str, Any], topic: str) -> bool:
    return topic in AdminClient(config).list_topics(timeout=10).topics


def values(records: list[Record], field: str) -> list[Any]:
    return sorted(json.loads(r.value)[field] for r in records if r.value is not None)


def topic_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def stored_offsets(manifest: Manifest, state: Path) -> dict[int, int]:
    assert manifest.source.type == "kafka"
    return LocalStateStore(state).load_offsets(manifest.source.topic, default_group_id(manifest))


# --------------------------------------------------------------------------- manifests


def k2k_manifest(name: str, src: str, dst: str, state: Path, source_options: str = "{}") -> Manifest:
    """Kafka -> Kafka on connection kafka_cluster; the sink topic does not exist yet (the run's admin
    client creates it)."""
    return parse_manifest(f"""
name: {name}
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {source_options}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append, unique_key: order_id}}
  options: {{create_topic: {{enabled: true, partitions: 2}}}}
state: {{type: local, path: "{state}"}}
dagster: {{sensor: {{min_new_messages: 1}}}}
""")


def replication_manifest(name: str, src: str, dst: str, control: str, target: str = "kafka_cluster") -> Manifest:
    """Exactly-once replication from connection kafka_cluster to connection `target`."""
    return parse_manifest(f"""
name: {name}
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: {target}
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    replication:
      tracing_headers: true
      control_topic: {{name: {control}, commit_group: grp_{name}}}
state: {{type: kafka_control_topic}}
""")


def orders(ids: range) -> list[dict[str, Any]]:
    return [{"order_id": i, "amount": i * 1.5} for i in ids]


# --------------------------------------------------------------------------- tests


def test_a_client_that_cannot_verify_the_broker_is_explained_by_what_it_reported(
    tls_broker: EmbeddedBroker, pki: Pki
) -> None:
    """kafka.errors: a driver client whose call fails with a bare _TRANSPORT is explained by the
    TLS error it reported to its error_cb — certificate verification, and ssl_ca_location to fix."""
    admin = AdminClient({**tls_config(tls_broker, pki.wrong_ca), "error_cb": record_client_error})
    with pytest.raises(KafkaException) as failed:
        admin.list_topics(timeout=5)
    assert failed.value.args[0].name() == "_TRANSPORT"
    message = client_failure("cannot reach the Kafka cluster", admin, failed.value)
    assert message.startswith("cannot reach the Kafka cluster: TLS certificate verification failed")
    assert "certificate verify failed" in message and "fix: set ssl_ca_location" in message
    cause = classify_kafka("_TRANSPORT", True, "ssl://b:9093/1: error:0A000086:SSL routines::certificate verify failed")
    assert cause.kind == "fail_fast" and "ssl_ca_location" in cause.fix


def test_the_broker_refuses_plain_text_and_verifies_with_the_ca(tls_broker: EmbeddedBroker, pki: Pki) -> None:
    """What the other tests rest on: the broker's port speaks TLS only, a client trusting the CA
    gets metadata, a plain-text client gets nothing."""
    assert tls_broker.security_protocol == "SSL"
    assert AdminClient(tls_config(tls_broker, pki.ca)).list_topics(timeout=10).brokers
    plain = AdminClient({"bootstrap.servers": tls_broker.bootstrap_servers})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=3)


@pytest.mark.parametrize("path", ["direct", "spark_sql"])
def test_kafka_to_kafka_run_reads_creates_and_produces_over_tls(
    spark: Any, tls_env: dict[str, str], tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, path: str,
) -> None:
    """The read tasks, the admin client that creates the sink topic, the producers and the
    driver's boundary reads all connect with the connection's TLS settings, on both paths; the
    rerun resumes at the stored offsets."""
    monkeypatch.setenv("DPONE_DIRECT_PATH", "on" if path == "direct" else "off")
    client = tls_config(tls_broker, pki.ca)
    src, dst = topic_name("tls_src"), topic_name("tls_dst")
    create_topics(client, {src: 2})
    produce(client, src, 0, as_json(orders(range(0, 30))))
    produce(client, src, 1, as_json(orders(range(100, 120))))
    manifest = k2k_manifest(f"tls_{path}", src, dst, tmp_path / "state")

    first = run_pipeline(manifest, spark)
    assert first.execution_path == path
    assert (first.rows_extracted, first.messages_produced) == (50, 50)
    assert values(read_topic(client, dst), "order_id") == [*range(30), *range(100, 120)]
    assert stored_offsets(manifest, tmp_path / "state") == first.committed_offsets == {0: 30, 1: 20}

    produce(client, src, 1, as_json(orders(range(120, 125))))
    second = run_pipeline(manifest, spark)
    assert second.messages_produced == 5
    assert values(read_topic(client, dst), "order_id") == [*range(30), *range(100, 125)]
    assert stored_offsets(manifest, tmp_path / "state") == {0: 30, 1: 25}


def test_dead_letters_are_produced_over_tls(
    spark: Any, tls_env: dict[str, str], tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path
) -> None:
    """`on_error: dead_letter`: the admin client creates the dead-letter topic and the dead-letter
    producers deliver the bad record, with its source coordinates, over TLS."""
    client = tls_config(tls_broker, pki.ca)
    src, dst, dlq = topic_name("tls_src"), topic_name("tls_dst"), topic_name("tls_dlq")
    create_topics(client, {src: 2})
    produce(client, src, 0, as_json(orders(range(5))))
    produce(client, src, 1, [b"{not json", *as_json(orders(range(10, 12)))])
    source_options = (
        "{schema: [{name: order_id, type: long}, {name: amount, type: double}], "
        f"on_error: dead_letter, dead_letter: {{topic: {dlq}, create: true}}}}"
    )
    manifest = k2k_manifest("tls_dead_letters", src, dst, tmp_path / "state", source_options)

    result = run_pipeline(manifest, spark)
    assert (result.messages_produced, result.rows_dead_lettered) == (7, 1)
    assert values(read_topic(client, dst), "order_id") == [0, 1, 2, 3, 4, 10, 11]
    (dead,) = read_topic(client, dlq)
    assert dead.value == b"{not json"
    assert (dead.headers["dpone.error.source.topic"], dead.headers["dpone.error.source.partition"]) == (src, "1")
    assert dead.headers["dpone.error.source.offset"] == "0"
    assert stored_offsets(manifest, tmp_path / "state") == {0: 5, 1: 3}


def test_exactly_once_replication_commits_over_tls(
    spark: Any, tls_env: dict[str, str], tls_broker: EmbeddedBroker, pki: Pki
) -> None:
    """The transactional producers write the records and the control topic's offsets in one
    transaction over TLS; the control topic is created and read back over TLS, and a rerun
    resumes there."""
    client = tls_config(tls_broker, pki.ca)
    src, dst, control = topic_name("tls_esrc"), topic_name("tls_edst"), topic_name("tls_ctl")
    create_topics(client, {src: 2, dst: 2})
    produce(client, src, 0, as_json([{"n": i} for i in range(6)]), key=b"a")
    produce(client, src, 1, as_json([{"n": i} for i in range(6, 10)]), key=b"b")
    manifest = replication_manifest("tls_eos", src, dst, control)

    first = run_pipeline(manifest, spark)
    assert first.execution_path == "replication"
    assert first.messages_produced == 10 and first.committed_offsets == {0: 6, 1: 4}
    out = read_topic(client, dst)
    assert values(out, "n") == list(range(10))
    assert {r.headers["dpone.trace.source_topic"] for r in out} == {src}
    options = manifest.sink.options.replication.control_topic
    assert read_committed_offsets(client, options, "grp_tls_eos", [src]) == {(src, 0): 6, (src, 1): 4}

    produce(client, src, 1, as_json([{"n": 10}]), key=b"b")
    second = run_pipeline(manifest, spark)
    assert second.messages_produced == 1
    assert read_committed_offsets(client, options, "grp_tls_eos", [src]) == {(src, 0): 6, (src, 1): 5}
    assert values(read_topic(client, dst), "n") == list(range(11))


def test_sensor_and_lag_read_the_topic_and_stored_offsets_over_tls(
    spark: Any, tls_env: dict[str, str], tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path
) -> None:
    """The source sensor's tick (Kafka resource → connection) reads watermarks over TLS and asks
    for a run exactly when records wait beyond the stored offsets; the replication's lag reads the
    control topic over TLS."""
    client = tls_config(tls_broker, pki.ca)
    src, dst = topic_name("tls_lag"), topic_name("tls_lag_dst")
    create_topics(client, {src: 2})
    produce(client, src, 0, as_json(orders(range(4))))
    manifest = k2k_manifest("tls_sensed", src, dst, tmp_path / "state")

    def tick() -> SensorResult:
        sensor = build_source_sensor(manifest)
        assert sensor is not None
        definitions = Definitions(
            assets=[*source_asset_specs(manifest), build_manifest_asset(manifest)],
            sensors=[sensor],
            resources={
                "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
                "kafka": KafkaResource(),
                "schema_registry": SchemaRegistryResource(),
            },
        )
        context = build_sensor_context(
            instance=DagsterInstance.ephemeral(), definitions=definitions, resources={"kafka": KafkaResource()}
        )
        return sensor.evaluate_tick(context)

    waiting = tick()
    assert len(waiting.run_requests) == 1 and isinstance(waiting.run_requests[0], RunRequest)
    lag = waiting.asset_events[0].metadata
    assert lag["lag_messages"].value == 4 and lag["high_watermarks"].value == {"0": 4, "1": 0}

    run_pipeline(manifest, spark)
    caught_up = tick()
    assert not caught_up.run_requests and caught_up.asset_events[0].metadata["lag_messages"].value == 0
    produce(client, src, 1, as_json(orders(range(50, 53))))
    assert source_lag(manifest, KafkaResource().client_config(manifest.source)).new_messages == 3

    esrc, edst, control = topic_name("tls_elag"), topic_name("tls_elag_dst"), topic_name("tls_elag_ctl")
    create_topics(client, {esrc: 1, edst: 1})
    produce(client, esrc, 0, as_json([{"n": i} for i in range(3)]))
    replication = replication_manifest("tls_elag", esrc, edst, control)
    run_pipeline(replication, spark)
    produce(client, esrc, 0, as_json([{"n": 3}, {"n": 4}]))
    lag_now = source_lag(replication, KafkaResource().client_config(replication.source))
    assert (lag_now.stored, lag_now.high, lag_now.new_messages) == ({0: 3}, {0: 5}, 2)


@pytest.mark.parametrize("kind", ["k2k", "replication"])
def test_a_wrong_ca_fails_the_run_fast_naming_verification_and_the_setting(
    spark: Any, tls_broker: EmbeddedBroker, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The connection trusts another CA: the run fails within WRONG_CA_BOUND_S with an error that
    names TLS certificate verification and ssl_ca_location; nothing reached the sink, no offset
    was stored."""
    client = tls_config(tls_broker, pki.ca)
    src, dst, control = topic_name("tls_wsrc"), topic_name("tls_wdst"), topic_name("tls_wctl")
    create_topics(client, {src: 1, **({dst: 1} if kind == "replication" else {})})
    produce(client, src, 0, as_json(orders(range(3))))
    set_connection(monkeypatch, tls_broker, pki.wrong_ca)
    state = tmp_path / "state"
    manifest = (
        k2k_manifest("tls_wrong_ca", src, dst, state) if kind == "k2k" else replication_manifest("tls_wrong_ca", src, dst, control)
    )

    started = time.monotonic()
    with pytest.raises(DponeError) as failure:
        run_pipeline(manifest, spark)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert elapsed < WRONG_CA_BOUND_S, f"the run took {elapsed:.0f}s to fail: {message}"
    assert "certificate verif" in message.lower(), message
    assert "ssl_ca_location" in message, message
    if kind == "k2k":
        assert not topic_exists(client, dst)
        assert stored_offsets(manifest, state) == {}
        (run,) = LocalStateStore(state).list_runs("tls_wrong_ca")
        assert run.status == "failed"
    else:
        assert read_topic(client, dst) == []
        assert not topic_exists(client, control)


def test_a_wrong_ca_fails_the_lag_reads_instead_of_reporting_nothing_stored(
    spark: Any, tls_env: dict[str, str], tls_broker: EmbeddedBroker, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a sensor tick reads: with the source's connection trusting another CA the lag read
    fails naming certificate verification; with only the replication target's connection wrong,
    the control topic read fails too, rather than reading as "no offsets stored" (which would
    report every record as waiting)."""
    client = tls_config(tls_broker, pki.ca)
    src, dst, control = topic_name("tls_wlag"), topic_name("tls_wlag_dst"), topic_name("tls_wlag_ctl")
    create_topics(client, {src: 1, dst: 1})
    produce(client, src, 0, as_json([{"n": i} for i in range(3)]))
    set_connection(monkeypatch, tls_broker, pki.ca, "tls_target")
    replication = replication_manifest("tls_wlag", src, dst, control, target="tls_target")
    assert run_pipeline(replication, spark).committed_offsets == {0: 3}

    set_connection(monkeypatch, tls_broker, pki.wrong_ca, "tls_target")
    with pytest.raises(DponeError, match="(?i)certificate verif.*ssl_ca_location"):
        source_lag(replication, KafkaResource().client_config(replication.source))

    set_connection(monkeypatch, tls_broker, pki.wrong_ca)
    sensed = k2k_manifest("tls_wlag_sensed", src, topic_name("tls_wlag_k2k"), Path("/nonexistent/state"))
    started = time.monotonic()
    with pytest.raises(DponeError, match="(?i)certificate verif.*ssl_ca_location"):
        source_lag(sensed, KafkaResource().client_config(sensed.source))
    assert time.monotonic() - started < WRONG_CA_BOUND_S
