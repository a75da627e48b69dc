"""The `dpone` command against real parts: the embedded broker, the shared Spark session, the
local and PostgreSQL state stores. Most commands call `main([...])` in-process; a few go through
the installed console script (`.venv/bin/dpone`) to prove the entry point itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic, write_manifest

from dpone_dagster.cli import main

REPO = Path(__file__).resolve().parents[1]
DPONE = str(Path(sys.executable).parent / "dpone")
EXAMPLE = REPO / "manifests" / "orders_to_dwh.yaml"
KAFKA_ENV_PREFIXES = ("KAFKA_CLUSTER_", "DPONE_CONN_KAFKA_CLUSTER_")


def manifest_yaml(
    name: str,
    src: str,
    dst: str,
    state: str,
    *,
    strategy: str = "{mode: incremental_merge, unique_key: order_id}",
    sink_options: str = "{create_topic: {enabled: true, partitions: 2}}",
) -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
  options: {sink_options}
state: {state}
quality:
  mode: warn
  checks:
    - {{type: min_rows, threshold: 1}}
"""


def local_state(tmp_path: Path) -> str:
    return f"{{type: local, path: {tmp_path / 'state'}}}"


def orders(ids: range, partition: int) -> list[dict[str, Any]]:
    return [{"order_id": i, "amount": i * 1.5, "p": partition} for i in ids]


@pytest.fixture
def no_kafka_env(monkeypatch) -> None:
    """No kafka_cluster connection variable at all, whatever the calling shell exported."""
    for key in list(os.environ):
        if key.startswith(KAFKA_ENV_PREFIXES):
            monkeypatch.delenv(key)


def run_json(capsys, *argv: str) -> tuple[int, dict[str, Any], str]:
    """Call main in-process; returns (exit code, the JSON document printed, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"no output (exit {code}); stderr: {err}"
    # `plan` and `state show` print indented JSON; `run` prints one line.
    return code, json.loads(out[out.index("{") :]), err


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(KAFKA_ENV_PREFIXES)}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- validate


def test_validate_valid_manifests_exit_0(tmp_path, capsys):
    other = write_manifest(tmp_path / "other.yaml", manifest_yaml("other_pipe", "a", "b", local_state(tmp_path)))
    assert main(["validate", str(EXAMPLE), str(other)]) == 0
    out, err = capsys.readouterr()
    assert f"ok: {EXAMPLE} (orders_to_dwh: kafka -> kafka dwh.orders)" in out
    assert f"ok: {other} (other_pipe: kafka -> kafka b)" in out
    assert err == ""


def test_validate_invalid_manifest_names_file_field_and_fix(tmp_path, capsys):
    text = manifest_yaml("bad_pipe", "a", "b", local_state(tmp_path)).replace(
        "  topic: a\n", "  topic: a\n  optionz: {}\n"
    )
    bad = write_manifest(tmp_path / "bad.yaml", text)
    assert main(["validate", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert str(bad) in err
    assert "source.optionz" in err  # the field path
    assert "did you mean 'options'" in err  # the fix


def test_validate_mix_exits_2_and_reports_each_file(tmp_path, capsys):
    good = write_manifest(tmp_path / "good.yaml", manifest_yaml("good_pipe", "a", "b", local_state(tmp_path)))
    bad = write_manifest(
        tmp_path / "bad.yaml",
        manifest_yaml("bad_pipe", "a", "b", local_state(tmp_path), strategy="{mode: incremental_mergee}"),
    )
    assert main(["validate", str(bad), str(good)]) == 2  # a later valid file does not reset the status
    out, err = capsys.readouterr()
    assert f"ok: {good}" in out and str(bad) not in out
    assert str(bad) in err and "sink.strategy.mode" in err and "incremental_mergee" in err
    assert str(good) not in err


def test_validate_through_console_script(tmp_path):
    good = write_manifest(tmp_path / "good.yaml", manifest_yaml("good_pipe", "a", "b", local_state(tmp_path)))
    missing = tmp_path / "missing.yaml"
    proc = subprocess.run([DPONE, "validate", str(good)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"ok: {good}" in proc.stdout
    proc = subprocess.run([DPONE, "validate", str(good), str(missing)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "cannot read the file" in proc.stderr
    proc = subprocess.run([DPONE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "validate" in proc.stdout  # no command: help, config exit code


# --------------------------------------------------------------------------- plan


def test_plan_json_has_concrete_offsets_and_is_read_only(broker, kafka_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("plan_src"), unique_topic("plan_dst")
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, dst, 2)
    produce_json(bootstrap, src, orders(range(7), 0), partition=0)
    produce_json(bootstrap, src, orders(range(100, 104), 1), partition=1)
    path = write_manifest(tmp_path / "plan.yaml", manifest_yaml("plan_pipe", src, dst, local_state(tmp_path)))

    code, plan, err = run_json(capsys, "plan", str(path), "--format", "json")
    assert code == 0, err
    boundary = plan["source"]["boundary"]
    assert boundary["reachable"] is True
    assert boundary["topic"] == src
    assert boundary["partitions"] == [
        {"partition": 0, "start": 0, "end": 7},
        {"partition": 1, "start": 0, "end": 4},
    ]
    assert boundary["offsets_in_range"] == 11
    assert any("nothing stored" in n for n in boundary["notes"])
    assert plan["source"]["topic"] == src and plan["source"]["group_id"] == "dpone.plan_pipe"
    sink = plan["sink"]
    assert sink["topic"] == dst
    assert sink["strategy"]["mode"] == "incremental_merge" and sink["strategy"]["unique_key"] == "order_id"
    assert sink["key"]["mode"] == "unique_key"
    assert sink["envelope"] == "flat"
    assert sink["delivery"]["mode"] == "at_least_once" and sink["delivery"]["producer"]["acks"] == "all"
    assert plan["state"] == {"type": "local", "path": str(tmp_path / "state")}
    assert plan["quality"]["mode"] == "warn"
    assert plan["quality"]["checks"] == [{"type": "min_rows", "threshold": 1}]
    assert not (tmp_path / "state").exists()  # the probe did not create the state store

    # Stored offsets move the start of the plan.
    assert main(["state", "reset", str(path), "--offset", "0=3", "--yes"]) == 0
    code, plan, err = run_json(capsys, "plan", str(path), "--format", "json")
    assert code == 0, err
    assert plan["source"]["boundary"]["partitions"][0] == {"partition": 0, "start": 3, "end": 7}
    assert plan["source"]["boundary"]["offsets_in_range"] == 8

    # Markdown through the console script: the same offsets as a table.
    proc = subprocess.run(
        [DPONE, "plan", str(path), "--format", "md"],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(KAFKA_CLUSTER_BOOTSTRAP_SERVERS=bootstrap),
    )
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert md.startswith("# Plan: plan_pipe")
    for heading in ("## Source", "## Sink", "## Schema Evolution", "## State", "## Quality", "## Observability"):
        assert heading in md
    assert "Boundary now (offsets, 8 offsets)" in md
    assert "| 0 | 3 | 7 | 4 |" in md and "| 1 | 0 | 4 | 4 |" in md

    # Read-only: nothing reached the sink, and the state still holds only the reset offset.
    assert consume_all(bootstrap, dst) == []
    code, state, _ = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert state["offsets"] == {"0": 3} and state["last_runs"] == []


def test_plan_offline_omits_probe_and_needs_no_credentials(no_kafka_env, tmp_path, capsys):
    path = write_manifest(tmp_path / "p.yaml", manifest_yaml("offline_pipe", "nowhere", "b", local_state(tmp_path)))
    code, plan, err = run_json(capsys, "plan", str(path), "--format", "json", "--offline")
    assert code == 0, err
    assert "boundary" not in plan["source"]
    assert plan["source"]["boundary_method"].startswith("[stored offset (earliest when none)")
    assert main(["plan", str(path), "--offline"]) == 0  # md is the default format
    md = capsys.readouterr().out
    assert "# Plan: offline_pipe" in md and "Boundary" not in md
    assert not (tmp_path / "state").exists()  # offline does not touch the state store


def test_plan_with_unreachable_broker_renders_and_hides_secrets(no_kafka_env, monkeypatch, tmp_path, capsys):
    secret = "s3cr3t-" + unique_topic("pw")
    monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("KAFKA_CLUSTER_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_CLUSTER_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("KAFKA_CLUSTER_SASL_USERNAME", "etl")
    monkeypatch.setenv("KAFKA_CLUSTER_SASL_PASSWORD", secret)
    path = write_manifest(tmp_path / "p.yaml", manifest_yaml("down_pipe", "orders", "b", local_state(tmp_path)))

    code, plan, err = run_json(capsys, "plan", str(path), "--format", "json")
    assert code == 0, err
    boundary = plan["source"]["boundary"]
    assert boundary["reachable"] is False
    assert "cannot reach the Kafka cluster" in boundary["reason"]
    assert secret not in json.dumps(plan) + err
    assert not (tmp_path / "state").exists()

    # The markdown plan resolves the connection and probes the broker too.
    assert main(["plan", str(path), "--format", "md"]) == 0
    out, err = capsys.readouterr()
    assert "Boundary: not resolved (cannot reach the Kafka cluster" in out
    assert secret not in out + err


# --------------------------------------------------------------------------- run


def test_run_json_success_then_state_show(broker, spark, kafka_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("run_src"), unique_topic("run_dst")
    create_topic(bootstrap, src, 2)
    produce_json(bootstrap, src, orders(range(10), 0), partition=0, key=lambda r: r["order_id"])
    produce_json(bootstrap, src, orders(range(100, 110), 1), partition=1, key=lambda r: r["order_id"])
    path = write_manifest(tmp_path / "run.yaml", manifest_yaml("run_pipe", src, dst, local_state(tmp_path)))

    code, result, err = run_json(capsys, "run", str(path), "--format", "json")
    assert code == 0, err
    assert result["status"] == "success" and result["pipeline"] == "run_pipe"
    assert len(result["run_id"]) == 32
    assert result["rows_extracted"] == 20 and result["messages_produced"] == 20
    assert result["offset_ranges"] == [
        {"partition": 0, "start": 0, "end": 10},
        {"partition": 1, "start": 0, "end": 10},
    ]
    assert result["committed_offsets"] == {"0": 10, "1": 10}
    assert result["error"] is None

    out = consume_all(bootstrap, dst)  # created by the run (create_topic.enabled)
    assert sorted(int(r["key"]) for r in out) == [*range(10), *range(100, 110)]
    assert {int(r["key"]): r["value"]["amount"] for r in out}[105] == 157.5

    code, state, err = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert code == 0, err
    assert state["pipeline"] == "run_pipe" and state["topic"] == src
    assert state["group_id"] == "dpone.run_pipe" and state["offset_storage"] == "dpone"
    assert state["offsets"] == {"0": 10, "1": 10}
    assert state["last_runs"][0]["run_id"] == result["run_id"]
    assert state["last_runs"][0]["status"] == "success"
    assert state["last_runs"][0]["counts"]["messages_produced"] == 20

    # Text format of both commands.
    assert main(["state", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "partition 0: next offset 10" in text and "partition 1: next offset 10" in text
    produce_json(bootstrap, src, orders(range(10, 13), 0), partition=0, key=lambda r: r["order_id"])
    assert main(["run", str(path)]) == 0
    text = capsys.readouterr().out
    assert "success: run" in text and "3 rows extracted, 3 messages produced" in text
    assert "extract: started" in text  # progress lines in text mode


def test_run_failure_exits_1_and_does_not_advance(broker, spark, kafka_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("dup_src"), unique_topic("dup_dst")
    create_topic(bootstrap, src, 1)
    create_topic(bootstrap, dst, 1)
    produce_json(bootstrap, src, [{"order_id": 1, "v": 1}, {"order_id": 2, "v": 2}, {"order_id": 1, "v": 3}])
    path = write_manifest(
        tmp_path / "dup.yaml",
        manifest_yaml(
            "dup_pipe",
            src,
            dst,
            local_state(tmp_path),
            strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: fail}",
        ),
    )
    code, result, err = run_json(capsys, "run", str(path), "--format", "json")
    assert code == 1
    assert result["status"] == "failed" and result["pipeline"] == "dup_pipe"
    assert "duplicate_policy: fail" in result["error"]
    assert err.startswith("run failed:") and "duplicate_policy: fail" in err
    assert consume_all(bootstrap, dst) == []
    code, state, _ = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert state["offsets"] == {}
    assert state["last_runs"][0]["status"] == "failed"


def test_run_config_errors_exit_2(broker, spark, kafka_env, monkeypatch, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("cfg_src"), unique_topic("cfg_dst")
    create_topic(bootstrap, src, 1)
    produce_json(bootstrap, src, orders(range(3), 0))

    # The sink topic is missing and the manifest does not allow creating it: found in preflight.
    path = write_manifest(
        tmp_path / "nosink.yaml",
        manifest_yaml("nosink_pipe", src, dst, local_state(tmp_path), sink_options="{create_topic: {enabled: false}}"),
    )
    capsys.readouterr()
    assert main(["run", str(path), "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert f"sink topic '{dst}' does not exist" in err and "create_topic.enabled: true" in err

    # A missing credential: the connection's variables are unset.
    monkeypatch.delenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS")
    path = write_manifest(tmp_path / "nocred.yaml", manifest_yaml("nocred_pipe", src, dst, local_state(tmp_path)))
    assert main(["run", str(path), "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and "KAFKA_CLUSTER_BOOTSTRAP_SERVERS" in err and "kafka_cluster" in err

    # An invalid manifest is a configuration error too.
    bad = write_manifest(tmp_path / "bad.yaml", "name: x\n")
    assert main(["run", str(bad)]) == 2
    assert "source: required field is missing" in capsys.readouterr().err
    assert main(["run", str(path), "--start", "2024-01-01T00:00:00"]) == 2
    assert "--start and --end go together" in capsys.readouterr().err
    assert main(["run", str(path), "--start", "yesterday", "--end", "today"]) == 2
    assert "use ISO 8601" in capsys.readouterr().err

    monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", bootstrap)
    assert consume_all(bootstrap, src) and dst not in _topics(bootstrap)


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


@pytest.mark.slow
def test_batch_run_alias_through_console_script(broker, tmp_path):
    """`dpone batch run` in a fresh process: its own Spark session, the installed entry point."""
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("alias_src"), unique_topic("alias_dst")
    create_topic(bootstrap, src, 1)
    produce_json(bootstrap, src, orders(range(5), 0))
    path = write_manifest(tmp_path / "alias.yaml", manifest_yaml("alias_pipe", src, dst, local_state(tmp_path)))
    env = cli_env(KAFKA_CLUSTER_BOOTSTRAP_SERVERS=bootstrap, DPONE_SPARK_MASTER="local[1]")
    proc = subprocess.run(
        [DPONE, "batch", "run", str(path), "--format", "json"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # stdout is the JSON alone: Spark's own log went to stderr
    assert result["status"] == "success"
    assert result["rows_extracted"] == 5 and result["messages_produced"] == 5
    assert result["committed_offsets"] == {"0": 5}
    assert sorted(int(r["key"]) for r in consume_all(bootstrap, dst)) == list(range(5))


def test_batch_run_alias_in_process(broker, spark, kafka_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("alias2_src"), unique_topic("alias2_dst")
    create_topic(bootstrap, src, 1)
    produce_json(bootstrap, src, orders(range(4), 0))
    path = write_manifest(tmp_path / "alias.yaml", manifest_yaml("alias2_pipe", src, dst, local_state(tmp_path)))
    code, result, err = run_json(capsys, "batch", "run", str(path), "--format", "json")
    assert code == 0, err
    assert result["status"] == "success" and result["messages_produced"] == 4
    assert len(consume_all(bootstrap, dst)) == 4


# --------------------------------------------------------------------------- state


def test_state_reset_clears_and_sets_offsets_and_runs_follow(broker, spark, kafka_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("reset_src"), unique_topic("reset_dst")
    create_topic(bootstrap, src, 2)
    produce_json(bootstrap, src, orders(range(10), 0), partition=0)
    produce_json(bootstrap, src, orders(range(100, 110), 1), partition=1)
    path = write_manifest(tmp_path / "reset.yaml", manifest_yaml("reset_pipe", src, dst, local_state(tmp_path)))

    def show() -> dict[str, int]:
        code, state, err = run_json(capsys, "state", "show", str(path), "--format", "json")
        assert code == 0, err
        return state["offsets"]

    def run() -> dict[str, Any]:
        code, result, err = run_json(capsys, "run", str(path), "--format", "json")
        assert code == 0, err
        return result

    assert run()["rows_extracted"] == 20
    assert show() == {"0": 10, "1": 10}
    assert run()["rows_extracted"] == 0

    # Without --yes: refused, nothing changes.
    assert main(["state", "reset", str(path)]) == 2
    assert "confirm with --yes" in capsys.readouterr().err
    assert show() == {"0": 10, "1": 10}
    assert main(["state", "reset", str(path), "--offset", "0:5", "--yes"]) == 2
    assert "expected PARTITION=OFFSET" in capsys.readouterr().err
    assert main(["state", "reset", str(path), "--offset", "0=-1", "--yes"]) == 2
    assert "(both >= 0)" in capsys.readouterr().err
    assert show() == {"0": 10, "1": 10}

    # --yes: cleared; the next run starts from earliest again.
    assert main(["state", "reset", str(path), "--yes"]) == 0
    assert "cleared" in capsys.readouterr().out
    assert show() == {}
    assert main(["state", "show", str(path)]) == 0
    assert "no stored offsets" in capsys.readouterr().out
    again = run()
    assert again["rows_extracted"] == 20
    assert again["offset_ranges"] == [
        {"partition": 0, "start": 0, "end": 10},
        {"partition": 1, "start": 0, "end": 10},
    ]

    # Exact offsets: the next run re-reads from there.
    assert main(["state", "reset", str(path), "--offset", "0=5", "--offset", "1=8", "--yes"]) == 0
    assert "set to {0: 5, 1: 8}" in capsys.readouterr().out
    assert show() == {"0": 5, "1": 8}
    rewound = run()
    assert rewound["rows_extracted"] == 7 and rewound["messages_produced"] == 7
    assert rewound["offset_ranges"] == [
        {"partition": 0, "start": 5, "end": 10},
        {"partition": 1, "start": 8, "end": 10},
    ]
    assert show() == {"0": 10, "1": 10}
    produced = consume_all(bootstrap, dst)
    assert len(produced) == 20 + 20 + 7
    rereads = [int(r["key"]) for r in produced]
    assert sorted(k for k in set(rereads) if rereads.count(k) == 3) == [5, 6, 7, 8, 9, 108, 109]


def test_state_with_postgres_store(broker, spark, kafka_env, pg_env, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    src, dst = unique_topic("pg_src"), unique_topic("pg_dst")
    create_topic(bootstrap, src, 1)
    produce_json(bootstrap, src, orders(range(6), 0))
    state = "{type: postgres, connection_id: postgres_state}"
    path = write_manifest(tmp_path / "pg.yaml", manifest_yaml("pg_pipe", src, dst, state))

    code, plan, err = run_json(capsys, "plan", str(path), "--format", "json")
    assert code == 0, err
    assert plan["state"]["type"] == "postgres" and plan["state"]["offsets_table"] == "etl_state.etl_kafka_offsets"
    assert plan["source"]["boundary"]["partitions"] == [{"partition": 0, "start": 0, "end": 6}]

    code, result, err = run_json(capsys, "run", str(path), "--format", "json")
    assert code == 0, err
    assert result["rows_extracted"] == 6 and result["committed_offsets"] == {"0": 6}
    assert not (tmp_path / "state").exists()

    code, shown, err = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert code == 0, err
    assert shown["offsets"] == {"0": 6}
    assert shown["last_runs"][0]["run_id"] == result["run_id"] and shown["last_runs"][0]["status"] == "success"

    assert main(["state", "reset", str(path), "--offset", "0=2", "--yes"]) == 0
    capsys.readouterr()
    code, shown, _ = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert shown["offsets"] == {"0": 2}
    code, result, err = run_json(capsys, "run", str(path), "--format", "json")
    assert code == 0, err
    assert result["rows_extracted"] == 4
    assert main(["state", "reset", str(path), "--yes"]) == 0
    code, shown, _ = run_json(capsys, "state", "show", str(path), "--format", "json")
    assert shown["offsets"] == {}
    assert len(consume_all(bootstrap, dst)) == 10


# --------------------------------------------------------------------------- doctor


def test_doctor_quick_with_broker(kafka_env, broker, capsys):
    assert main(["doctor", "--profile", "quick"]) == 0
    out, err = capsys.readouterr()
    kafka_row = next(line for line in out.splitlines() if "| kafka (kafka_cluster) |" in line)
    assert kafka_row.startswith("| OK |")
    assert broker.bootstrap_servers in kafka_row
    assert "spark session" not in out  # quick skips starting Spark
    assert "| OK | python |" in out and "| OK | module pyspark |" in out
    assert err == ""


def test_doctor_quick_fails_when_broker_is_down(no_kafka_env, monkeypatch, capsys):
    monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert main(["doctor", "--profile", "quick"]) == 1
    out, err = capsys.readouterr()
    kafka_row = next(line for line in out.splitlines() if "| kafka (kafka_cluster) |" in line)
    assert kafka_row.startswith("| FAIL (required) |")
    assert "KAFKA_CLUSTER_BOOTSTRAP_SERVERS" in kafka_row  # the fix
    assert "required check(s) failed: kafka (kafka_cluster)" in err


def test_doctor_quick_without_kafka_configured_skips(no_kafka_env, capsys):
    assert main(["doctor", "--profile", "quick"]) == 0
    out = capsys.readouterr().out
    kafka_row = next(line for line in out.splitlines() if "| kafka (kafka_cluster) |" in line)
    assert kafka_row.startswith("| SKIP |") and "export KAFKA_CLUSTER_BOOTSTRAP_SERVERS" in kafka_row


def test_doctor_reports_jdbc_drivers_as_spark_sees_them(spark, monkeypatch):
    """The driver classes are looked up in Spark's JVM: a jar that is not on Spark's class path is
    reported with the package to install, whatever sits in /usr/share/java."""
    from dpone_dagster import doctor

    # The suite's session has the PostgreSQL and MariaDB jars on spark.jars, not jTDS.
    check = doctor._jdbc_drivers_in_spark()
    assert check.status == "warn"
    assert "libjtds-java" in check.detail and "libpostgresql-jdbc-java" not in check.detail
    assert "apt-get install" in check.fix

    monkeypatch.setattr(doctor, "JDBC_DRIVERS", {"postgres": doctor.JDBC_DRIVERS["postgres"], "mysql": doctor.JDBC_DRIVERS["mysql"]})
    check = doctor._jdbc_drivers_in_spark()
    assert (check.status, check.detail) == ("ok", "postgres org.postgresql.Driver, mysql org.mariadb.jdbc.Driver")


def test_doctor_reports_the_postgresql_the_tests_and_dagster_use(no_kafka_env, monkeypatch):
    from dpone_dagster import doctor

    for name in [k for k in os.environ if k.startswith(("POSTGRES_STATE_", "DAGSTER_PG_"))]:
        monkeypatch.delenv(name)
    reachable = doctor._postgres("postgres_state")
    assert reachable.status == "ok" and reachable.name.startswith("postgres (127.0.0.1:5432") and "PostgreSQL" in reachable.detail

    monkeypatch.setenv("DPONE_TEST_PG_PORT", "1")
    down = doctor._postgres("postgres_state")
    assert (down.status, down.name) == ("warn", "postgres (127.0.0.1:1, tests)")
    assert "scripts/setup-test-env" in down.fix

    monkeypatch.setenv("DAGSTER_PG_HOST", "127.0.0.1")
    monkeypatch.setenv("DAGSTER_PG_PORT", "1")
    dagster_pg = doctor._postgres("postgres_state")
    assert (dagster_pg.status, dagster_pg.name) == ("warn", "postgres (DAGSTER_PG_*, dagster.yaml)")
    assert "DAGSTER_PG_HOST" in dagster_pg.fix
