"""Run artifacts: run.json / plan.md / metrics.json content, redaction, listing and showing runs."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from dpone_dagster.connections import MASK, SECRETS
from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import ConfigError
from dpone_dagster.observability.artifacts import (
    build_metrics,
    list_runs,
    show_run,
    write_metrics,
    write_run_artifact,
)
from dpone_dagster.quality.results import CheckResult

PLAN = "# Plan: orders\n\n## Source\n\n- **topic**: `orders`\n"


def run_result(run_id: str = "run1", **changes) -> dict:
    result = RunResult(
        run_id=run_id,
        pipeline="orders",
        status="success",
        boundary={
            "topic": "orders",
            "method": "offsets",
            "partitions": [{"partition": 0, "start": 10, "end": 25}, {"partition": 1, "start": 0, "end": 5}],
            "offsets_in_range": 20,
            "notes": [],
        },
        rows_extracted=20,
        messages_produced=18,
        tombstones=1,
        duplicates_removed=2,
        bytes_produced=4096,
        committed_offsets={0: 25, 1: 5},
        sink_partitions=[{"partition": 0, "delivered": 18, "min_offset": 0, "max_offset": 17}],
        timings={"plan": 0.2, "extract": 1.5, "shape": 0.3, "load": 2.0, "commit": 0.1},
        notes=["a note"],
    ).as_dict()
    result.update(started_at="2025-06-01T12:00:00+00:00", finished_at="2025-06-01T12:00:05+00:00")
    result.update(changes)
    return result


def gate(passed: bool = True) -> CheckResult:
    return CheckResult(
        name="not_null_order_id",
        check_type="not_null",
        phase="pre_publish",
        passed=passed,
        severity="fail",
        observed=0 if passed else 1,
        threshold=0,
        description="null values",
        failing_sample=() if passed else ({"order_id": None, "amount": Decimal("1.50")},),
    )


def test_run_json_and_plan_md(tmp_path: Path):
    run_dir = write_run_artifact(
        str(tmp_path),
        run_result(schema_evolution=[{"action": "add_column", "column": "note"}]),
        PLAN,
        [gate(False)],
    )
    assert run_dir == tmp_path / "run1"
    assert sorted(p.name for p in run_dir.iterdir()) == ["plan.md", "run.json"]  # no temp files left
    assert (run_dir / "plan.md").read_text() == PLAN
    data = json.loads((run_dir / "run.json").read_text())
    assert (data["pipeline"], data["run_id"], data["status"]) == ("orders", "run1", "success")
    assert (data["started_at"], data["finished_at"]) == (
        "2025-06-01T12:00:00+00:00",
        "2025-06-01T12:00:05+00:00",
    )
    assert data["timings"] == {"plan": 0.2, "extract": 1.5, "shape": 0.3, "load": 2.0, "commit": 0.1}
    assert data["boundary"]["partitions"] == [
        {"partition": 0, "start": 10, "end": 25, "offsets": 15},
        {"partition": 1, "start": 0, "end": 5, "offsets": 5},
    ]
    assert data["counts"] == {
        "rows_extracted": 20,
        "messages_produced": 18,
        "tombstones": 1,
        "deletes_skipped": 0,
        "duplicates_removed": 2,
        "rows_dead_lettered": 0,
        "rows_skipped": 0,
    }
    assert data["bytes"] == {"produced": 4096}
    assert data["committed_offsets"] == {"0": 25, "1": 5}
    assert (
        data["gates"] == [gate(False).as_dict()] and data["gates"][0]["failing_sample"][0]["amount"] == "1.50"
    )
    assert data["schema_evolution"] == [{"action": "add_column", "column": "note"}]
    assert data["errors"] == [] and data["notes"] == ["a note"]
    assert "extra" not in data  # offset_ranges (derived) is not carried twice


def test_failed_run_errors_extra_keys_and_overwrite(tmp_path: Path):
    result = run_result(status="failed", error="boom", errors=["late detail"], lag={"0": 3})
    write_run_artifact(tmp_path, result, PLAN, [{"name": "x", "passed": True}])
    data = json.loads((tmp_path / "run1" / "run.json").read_text())
    assert data["status"] == "failed" and data["errors"] == ["boom", "late detail"]
    assert data["extra"] == {"lag": {"0": 3}}
    assert "schema_evolution" not in data
    write_run_artifact(tmp_path, run_result(), "# new plan\n", [])
    assert json.loads((tmp_path / "run1" / "run.json").read_text())["status"] == "success"
    assert (tmp_path / "run1" / "plan.md").read_text() == "# new plan\n"


def test_secrets_never_reach_artifacts(tmp_path: Path):
    secret = f"pw-{uuid.uuid4().hex}/+@"
    SECRETS.add(secret)
    result = run_result(
        status="failed",
        error=f"SASL authentication failed for password {secret}",
        notes=[f"dsn postgresql://etl:{secret}@db/state"],
    )
    failing = CheckResult(
        name="g",
        check_type="accepted_values",
        phase="pre_publish",
        passed=False,
        severity="fail",
        observed=1,
        threshold=0,
        description="d",
        failing_sample=({"token": secret},),
    )
    run_dir = write_run_artifact(tmp_path, result, f"{PLAN}- **password**: `{secret}`\n", [failing])
    write_metrics(tmp_path, "run1", build_metrics(result))
    for path in run_dir.iterdir():
        text = path.read_text()
        assert secret not in text, path.name
        assert "pw-" not in text, path.name  # percent-encoded forms are masked too
    assert MASK in (run_dir / "run.json").read_text() and MASK in (run_dir / "plan.md").read_text()
    assert json.loads((run_dir / "run.json").read_text())["errors"] == [
        f"SASL authentication failed for password {MASK}"
    ]


def test_secrets_that_json_escapes_are_redacted(tmp_path: Path):
    secret = f'q"{uuid.uuid4().hex}\\x'
    SECRETS.add(secret)
    run_dir = write_run_artifact(tmp_path, run_result(error=f"bad {secret}"), PLAN, [])
    text = (run_dir / "run.json").read_text()
    assert secret not in text and json.dumps(secret)[1:-1] not in text
    assert json.loads(text)["errors"] == [f"bad {MASK}"]


def test_metrics_file(tmp_path: Path):
    metrics = build_metrics(run_result(), lag_before={0: 15, 1: 5}, lag_after=0)
    path = write_metrics(tmp_path, "run1", metrics)
    assert path == tmp_path / "run1" / "metrics.json"
    data = json.loads(path.read_text())
    assert data == {
        "rows": 20,
        "messages": 18,
        "bytes": 4096,
        "tombstones": 1,
        "duplicates_removed": 2,
        "deletes_skipped": 0,
        "stage_seconds": {"plan": 0.2, "extract": 1.5, "shape": 0.3, "load": 2.0, "commit": 0.1},
        "total_seconds": 4.1,
        "throughput_msgs_per_s": 9.0,  # 18 messages over the 2 s load stage
        "throughput_bytes_per_s": 2048.0,
        "lag_before": {"0": 15, "1": 5},
        "lag_after": 0,
    }
    # No load stage (nothing to produce): throughput over the whole run; unmeasured lag is omitted.
    quiet = build_metrics(run_result(messages_produced=0, timings={"plan": 0.5}))
    assert quiet["throughput_msgs_per_s"] == 0.0 and "lag_before" not in quiet
    with pytest.raises(ValueError, match="metrics.rows is 'many'"):
        write_metrics(tmp_path, "run1", {"rows": "many"})
    with pytest.raises(ValueError, match=r"metrics.stage_seconds.load is True"):
        write_metrics(tmp_path, "run1", {"stage_seconds": {"load": True}})


def test_list_and_show_runs(tmp_path: Path):
    assert list_runs(tmp_path / "missing") == []
    write_run_artifact(tmp_path, run_result("old", started_at="2025-06-01T09:00:00+00:00"), PLAN, [])
    # 10:30Z: newer than "old", though its text sorts before it (times are compared, not strings).
    write_run_artifact(
        tmp_path,
        run_result("new", started_at="2025-06-01T08:30:00-02:00", status="failed", rows_extracted=3),
        PLAN,
        [],
    )
    write_run_artifact(tmp_path, run_result("newest", started_at="2025-06-02T00:00:00+00:00"), PLAN, [])
    (tmp_path / "incomplete").mkdir()  # no run.json: not a run
    runs = list_runs(tmp_path)
    assert [r["run_id"] for r in runs] == ["newest", "new", "old"]
    assert runs[1] == {
        "run_id": "new",
        "status": "failed",
        "pipeline": "orders",
        "started_at": "2025-06-01T08:30:00-02:00",
        "finished_at": "2025-06-01T12:00:05+00:00",
        "rows": 3,
        "messages": 18,
    }

    write_metrics(tmp_path, "old", {"rows": 20})
    shown = show_run(tmp_path, "old")
    assert shown["run_id"] == "old" and shown["metrics"] == {"rows": 20}
    assert "metrics" not in show_run(tmp_path, "newest")

    with pytest.raises(
        ConfigError, match=r"no run artifact 'nope' .*available run ids \(newest first\): newest, new, old"
    ):
        show_run(tmp_path, "nope")
    with pytest.raises(ConfigError, match="no runs are recorded there"):
        show_run(tmp_path / "empty", "nope")
    with pytest.raises(ConfigError, match="cannot name an artifact directory"):
        show_run(tmp_path, "../etc")


def test_unreadable_run_is_listed(tmp_path: Path):
    write_run_artifact(tmp_path, run_result("good"), PLAN, [])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    runs = {r["run_id"]: r["status"] for r in list_runs(tmp_path)}
    assert runs == {"good": "success", "broken": "unreadable"}
    with pytest.raises(ConfigError, match="cannot be read"):
        show_run(tmp_path, "broken")
