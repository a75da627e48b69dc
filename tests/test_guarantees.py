"""Every guarantee a manifest declares either holds or the manifest is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import consume_all, consume_raw, create_topic, produce_json, unique_topic, write_manifest

from dpone_dagster.cli import main
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.config import check_producer_settings, effective_producer_settings
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.replication.control_topic import read_committed_offsets
from dpone_dagster.state.local import LocalStateStore


def manifest_with(delivery: str, strategy: str = "{mode: incremental_append}", source: str = "topic: src") -> str:
    return f"""
name: guarantees
source: {{type: kafka, connection_id: kafka_cluster, {source}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: dst
  strategy: {strategy}
  options:
    delivery: {delivery}
"""


def validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = write_manifest(tmp_path / "m.yaml", text)
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


# --------------------------------------------------------------------------- delivery settings


@pytest.mark.parametrize(
    ("delivery", "path"),
    [
        ("{mode: at_least_once, acks: '1'}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, acks: 0}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, acks: 1}", "sink.options.delivery.acks"),
        ("{mode: idempotent, acks: 1}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, producer_config: {acks: 1}}", "sink.options.delivery.producer_config.acks"),
        (
            "{mode: at_least_once, acks: all, producer_config: {acks: 1}}",
            "sink.options.delivery.producer_config.acks",
        ),
        ("{mode: at_least_once, acks: 0, producer_config: {acks: all}}", "sink.options.delivery.acks"),
        (
            "{mode: at_least_once, producer_config: {request.required.acks: '0'}}",
            "sink.options.delivery.producer_config.request.required.acks",
        ),
        (
            "{mode: idempotent, producer_config: {enable.idempotence: false}}",
            "sink.options.delivery.producer_config.enable.idempotence",
        ),
        (
            "{mode: idempotent, producer_config: {max.in.flight.requests.per.connection: 10}}",
            "sink.options.delivery.producer_config.max.in.flight.requests.per.connection",
        ),
        ("{mode: idempotent, producer_config: {retries: 0}}", "sink.options.delivery.producer_config.retries"),
        (
            "{mode: exactly_once, producer_config: {enable.idempotence: 'false'}}",
            "sink.options.delivery.producer_config.enable.idempotence",
        ),
    ],
)
def test_validate_refuses_producer_settings_that_contradict_the_mode(tmp_path, capsys, delivery, path):
    code, output = validate(tmp_path, manifest_with(delivery), capsys)
    assert code == 2
    assert f"{path}:" in output


@pytest.mark.parametrize(
    "delivery",
    [
        "{mode: at_least_once, acks: -1}",
        "{mode: at_least_once, acks: all}",
        "{mode: idempotent, acks: -1}",
        "{mode: idempotent, producer_config: {max.in.flight.requests.per.connection: 5, retries: 3}}",
        "{mode: at_least_once, producer_config: {enable.idempotence: false, linger.ms: 5}}",
    ],
)
def test_validate_accepts_settings_that_keep_the_mode(tmp_path, capsys, delivery):
    code, output = validate(tmp_path, manifest_with(delivery), capsys)
    assert code == 0, output


def test_connection_overrides_that_contradict_the_mode_are_refused_before_a_run():
    manifest = parse_manifest(manifest_with("{mode: idempotent}"))
    with pytest.raises(ConfigError, match="sink connection 'kafka_cluster'.*max.in.flight"):
        check_producer_settings(manifest, {"bootstrap.servers": "x:1", "max.in.flight": "20"})
    # The engine's acks: all wins over a connection's acks under at_least_once: nothing to refuse.
    at_least_once = parse_manifest(manifest_with("{mode: at_least_once}"))
    check_producer_settings(at_least_once, {"bootstrap.servers": "x:1", "acks": "1"})


def test_effective_settings_show_every_override_and_no_credentials():
    manifest = parse_manifest(manifest_with("{mode: idempotent, producer_config: {linger.ms: 7, message.timeout.ms: 9000}}"))
    settings = effective_producer_settings(
        manifest, {"bootstrap.servers": "x:1", "sasl.password": "hunter2", "retries": "4", "compression.type": "lz4"}
    )
    assert settings["acks"] == "all" and settings["enable.idempotence"] is True
    assert settings["linger.ms"] == 7 and settings["message.timeout.ms"] == 9000
    assert settings["retries"] == "4" and settings["compression.type"] == "lz4"
    assert "sasl.password" not in settings and "bootstrap.servers" not in settings


# --------------------------------------------------------------------------- one replication plan


def replication_text(src: str, dst: str, control: str, tmp_path: Path) -> str:
    return f"""
name: k2k_one_plan
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    replication: {{control_topic: {{name: {control}, commit_group: grp_{src}}}}}
state: {{type: local, path: {tmp_path}}}
quality: {{mode: fail, checks: [{{type: min_rows, threshold: 1}}]}}
"""


def test_replication_copies_exactly_the_ranges_its_gates_checked(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst, control = unique_topic("osrc"), unique_topic("odst"), unique_topic("ctl")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"n": i} for i in range(5)], partition=0)
    late: list[int] = []

    def log(message: str) -> None:
        # Records arriving once the plan is fixed belong to the next run, whatever happens later.
        if message.startswith("plan: ") and not late:
            produce_json(bs, src, [{"n": 100 + i} for i in range(3)], partition=0)
            late.append(3)

    manifest = parse_manifest(replication_text(src, dst, control, tmp_path))
    first = run_pipeline(manifest, spark, RunRequest(log=log))
    assert late and first.gates[0]["observed"] == 5
    assert first.messages_produced == 5
    assert sorted(r["value"]["n"] for r in consume_all(bs, dst)) == list(range(5))
    options = manifest.sink.options.replication.control_topic
    assert read_committed_offsets({"bootstrap.servers": bs}, options, f"grp_{src}", [src]) == {(src, 0): 5}

    second = run_pipeline(manifest, spark)
    assert second.messages_produced == 3 and second.gates[0]["observed"] == 3
    assert sorted(r["value"]["n"] for r in consume_all(bs, dst)) == [*range(5), 100, 101, 102]


def test_replication_reconciles_against_the_committed_target(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst, control = unique_topic("rsrc"), unique_topic("rdst"), unique_topic("ctl")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"n": i} for i in range(4)], partition=0)
    text = replication_text(src, dst, control, tmp_path).replace(
        "{type: min_rows, threshold: 1}", "{type: source_target_count, exclusive_target: true}"
    )
    manifest = parse_manifest(text)
    # Another writer adds 2 records to the target while the replication runs: the committed target
    # holds 6 records in the run's range, not the 4 the planned ranges hold.
    with pytest.raises(RunFailed, match="reconciliation failed") as caught:
        run_pipeline(manifest, spark, RunRequest(log=intruder(bs, dst, "replicate: started")))
    [gate] = caught.value.result.gates
    assert not gate["passed"] and "holds 6 record(s)" in gate["description"]

    produce_json(bs, src, [{"n": 10 + i} for i in range(3)], partition=0)
    clean = run_pipeline(manifest, spark)
    [gate] = clean.gates
    assert gate["passed"] and gate["observed"] == 0.0 and "holds 3 record(s)" in gate["description"]


# --------------------------------------------------------------------------- ETL runs


def etl_text(src: str, dst: str, tmp_path: Path, quality: str, source_options: str = "", strategy: str = "") -> str:
    return f"""
name: guarded
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options: {{group_id: g_{src}{source_options}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy or "{mode: incremental_merge, unique_key: order_id}"}
state: {{type: local, path: {tmp_path}}}
quality:
  mode: fail
  checks: {quality}
"""


@pytest.fixture
def etl_topics(broker, kafka_env):
    src, dst = unique_topic("gsrc"), unique_topic("gdst")
    create_topic(broker.bootstrap_servers, src, 1)
    create_topic(broker.bootstrap_servers, dst, 1)
    return src, dst


def intruder(bs: str, topic: str, stage: str = "quality_pre: started"):
    """A log callback that has another producer write 2 records to `topic` while the run is at
    `stage` (after the run read the target's end offsets, before it produces)."""
    done: list[bool] = []

    def log(message: str) -> None:
        if message == stage and not done:
            produce_json(bs, topic, [{"intruder": True}, {"intruder": True}], partition=0)
            done.append(True)

    return log


@pytest.mark.parametrize("path", ["direct", "spark_sql"])
def test_reconciliation_counts_what_the_target_holds(broker, spark, etl_topics, tmp_path, monkeypatch, path):
    if path == "spark_sql":
        monkeypatch.setenv("DPONE_DIRECT_PATH", "off")
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    produce_json(bs, src, [{"order_id": i} for i in range(10)], partition=0)
    check = "[{type: source_target_count, exclusive_target: true}]"
    manifest = parse_manifest(etl_text(src, dst, tmp_path, check))
    # Every message is acknowledged, but the run's range of the target holds 2 records more.
    with pytest.raises(RunFailed, match="reconciliation failed") as caught:
        run_pipeline(manifest, spark, RunRequest(log=intruder(bs, dst)))
    [gate] = caught.value.result.gates
    assert gate["observed"] == 20.0 and "holds 12 record(s)" in gate["description"]
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{src}") == {}

    rerun = run_pipeline(manifest, spark)
    [gate] = rerun.gates
    assert gate["passed"] and "holds 10 record(s)" in gate["description"]
    assert "sink offsets advanced by 10 across 1 partition(s)" in gate["description"]
    assert rerun.committed_offsets == {0: 10}
    assert rerun.execution_path == path


def test_unique_judges_the_rows_keep_last_publishes(broker, spark, etl_topics, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    rows = [{"order_id": 1, "status": None}, {"order_id": 2, "status": "paid"}, {"order_id": 1, "status": "paid"}]
    produce_json(bs, src, rows, partition=0)
    checks = "[{type: unique, columns: [order_id]}, {type: not_null, columns: [status]}]"
    result = run_pipeline(parse_manifest(etl_text(src, dst, tmp_path, checks)), spark)
    assert [(g["name"], g["passed"]) for g in result.gates] == [("unique_order_id", True), ("not_null_status", True)]
    assert sorted((r["value"]["order_id"], r["value"]["status"]) for r in consume_all(bs, dst)) == [(1, "paid"), (2, "paid")]


def test_a_check_of_the_extracted_batch_says_so_and_sees_the_duplicates(broker, spark, etl_topics, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    produce_json(bs, src, [{"order_id": 1}, {"order_id": 1}], partition=0)
    checks = "[{type: unique, columns: [order_id], stage: extracted}]"
    with pytest.raises(RunFailed, match="unique_order_id_extracted") as caught:
        run_pipeline(parse_manifest(etl_text(src, dst, tmp_path, checks)), spark)
    [gate] = caught.value.result.gates
    assert gate["description"].startswith("before de-duplication: ") and gate["observed"] == 1
    assert consume_all(bs, dst) == []


def dead_letters(bs: str, topic: str) -> list[tuple[str, str]]:
    return sorted(
        (dict(r["headers"])["dpone.error.source.offset"].decode(), r["value"].decode()) for r in consume_raw(bs, topic)
    )


def test_dead_letters_leave_with_the_output_once_per_source_record(broker, spark, etl_topics, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    dlq = unique_topic("gdlq")
    create_topic(bs, dlq, 1)
    produce_json(bs, src, [{"order_id": 1}, b"{oops", {"order_id": 2}, b"[1,", {"order_id": 3}], partition=0)
    options = f", on_error: dead_letter, dead_letter: {{topic: {dlq}}}"
    gated = etl_text(src, dst, tmp_path, "[{type: min_rows, threshold: 100}]", options)
    with pytest.raises(RunFailed, match="min_rows"):
        run_pipeline(parse_manifest(gated), spark)
    assert consume_raw(bs, dlq) == [] and consume_raw(bs, dst) == []  # a gate stops the dead letters too

    # Letters and messages published, then the reconciliation fails: the state stays, a rerun repeats.
    reconciled = etl_text(src, dst, tmp_path, "[{type: source_target_count, exclusive_target: true}]", options)
    with pytest.raises(RunFailed, match="reconciliation failed"):
        run_pipeline(parse_manifest(reconciled), spark, RunRequest(log=intruder(bs, dst)))
    expected = [("1", "{oops"), ("3", "[1,")]
    assert dead_letters(bs, dlq) == expected

    result = run_pipeline(parse_manifest(reconciled), spark)
    assert result.rows_dead_lettered == 2 and result.messages_produced == 3
    assert dead_letters(bs, dlq) == expected  # each bad record once across the attempts
    assert any("already in" in note for note in result.notes)


# --------------------------------------------------------------------------- snapshot_reconciliation


@pytest.mark.parametrize("allow", ["", ", allow_snapshot_reconciliation: true"])
def test_snapshot_reconciliation_is_refused(tmp_path, capsys, allow):
    strategy = f"{{mode: snapshot_reconciliation, unique_key: order_id{allow}}}"
    code, output = validate(tmp_path, manifest_with("{mode: at_least_once}", strategy), capsys)
    assert code == 2
    assert "sink.strategy.mode: snapshot_reconciliation is not available for Kafka sinks" in output


# --------------------------------------------------------------------------- envelope: auto


def test_auto_envelope_is_decided_per_record(spark):
    from pyspark.sql.types import StructType

    from dpone_dagster import columns as C
    from dpone_dagster.sources.kafka_reader import RAW_SCHEMA
    from dpone_dagster.spark.decode import decode_json, is_envelope_value

    values = [
        {"order_id": 1, "status": "new"},
        {"order_id": 2, "status": "new"},
        {"op": "upsert", "data": {"order_id": 3, "status": "paid"}},
        {"op": "delete", "data": {"order_id": 1}},
        {"order_id": 4, "status": "new"},
    ]
    raw = spark.createDataFrame(
        [("t", 0, i, 0, None, json.dumps(v).encode(), None) for i, v in enumerate(values)], RAW_SCHEMA
    )
    schema = StructType.fromDDL("order_id bigint, status string")
    rows = decode_json(raw, schema, "auto").orderBy(C.SOURCE_OFFSET).collect()
    assert [(r["order_id"], r["status"], r[C.OP], r[C.CORRUPT]) for r in rows] == [
        (1, "new", C.UPSERT, None),
        (2, "new", C.UPSERT, None),
        (3, "paid", C.UPSERT, None),
        (1, None, C.DELETE, None),
        (4, "new", C.UPSERT, None),
    ]
    assert [is_envelope_value(v) for v in values] == [False, False, True, True, False]
    assert not is_envelope_value({"op": "x"}) and not is_envelope_value([1])


# --------------------------------------------------------------------------- check selection


def test_a_run_evaluates_only_the_selected_checks(broker, spark, etl_topics, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    produce_json(bs, src, [{"order_id": 1, "status": None}, {"order_id": 2, "status": "paid"}], partition=0)
    checks = "[{type: min_rows, threshold: 100}, {type: not_null, columns: [order_id]}, {type: not_null, columns: [status]}]"
    manifest = parse_manifest(etl_text(src, dst, tmp_path, checks))
    result = run_pipeline(manifest, spark, RunRequest(checks=frozenset({"not_null_order_id"})))
    assert [(g["name"], g["passed"]) for g in result.gates] == [("not_null_order_id", True)]
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [1, 2]
    with pytest.raises(ConfigError, match="not_null_amount"):
        run_pipeline(manifest, spark, RunRequest(checks=frozenset({"not_null_amount"})))


def test_checks_alone_judge_the_pending_batch_and_publish_nothing(broker, spark, etl_topics, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = etl_topics
    dlq = unique_topic("cdlq")
    create_topic(bs, dlq, 1)
    produce_json(bs, src, [{"order_id": 1}, b"{oops", {"order_id": 1}, {"order_id": 2}], partition=0)
    options = f", on_error: dead_letter, dead_letter: {{topic: {dlq}}}"
    checks = "[{type: unique, columns: [order_id]}, {type: unique, columns: [order_id], stage: extracted}]"
    manifest = parse_manifest(etl_text(src, dst, tmp_path, checks, options))
    alone = run_pipeline(manifest, spark, RunRequest(checks=frozenset({"unique_order_id"}), publish=False))
    assert [(g["name"], g["passed"]) for g in alone.gates] == [("unique_order_id", True)]
    assert alone.execution_path == "direct", alone.notes
    assert consume_raw(bs, dst) == [] and consume_raw(bs, dlq) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{src}") == {}

    full = run_pipeline(manifest, spark, RunRequest(checks=frozenset({"unique_order_id"})))
    assert full.messages_produced == 2 and full.committed_offsets == {0: 4}
