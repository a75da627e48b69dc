"""The order in which a run's state moves (engine/stages/commit.py), one test per failing step.

The target and the state store are fakes that record what was asked of them: these tests are
about the order of the steps alone, with no IO. The real broker and stores are exercised by the
guarantee and fault suites (tests/test_guarantees.py, tests/test_state_faults.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.commit import Output, StateMove, commit_run
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state.base import RunRecord, utcnow

CHECK = "{type: source_target_count, tolerance_pct: 0}"
EXCLUSIVE = "{type: source_target_count, tolerance_pct: 0, exclusive_target: true}"


def manifest(checks: str = "") -> Any:
    quality = f"quality: {{mode: fail, checks: [{checks}]}}" if checks else ""
    return parse_manifest(f"""
name: commit_order
source: {{type: kafka, connection_id: k, topic: src, options: {{group_id: g}}}}
sink: {{type: kafka, connection_id: k, topic: dst, strategy: {{mode: incremental_append}}}}
state: {{type: local, path: /tmp/unused}}
{quality}
""")


class FakeTarget:
    """A target topic whose end offsets move by `advance` records when the run wrote."""

    def __init__(self, calls: list[str], advance: int, held: int | None = None):
        self.calls, self.advance, self.count = calls, advance, advance if held is None else held

    def ends(self) -> dict[Any, int]:
        self.calls.append("target.ends")
        return {("dst", 0): 10 + self.advance}

    def held(self, before: Mapping[Any, int], after: Mapping[Any, int]) -> int:
        self.calls.append("target.held")
        return self.count


class FakeState:
    """Records step 3 (late records) and step 4 (the store); either can be made to fail."""

    def __init__(self, calls: list[str], late: bool = False, fail: str | None = None):
        self.calls, self.fail = calls, fail
        self.move = StateMove(self.store, self.send_late_records if late else None)
        self.stored: list[RunRecord] = []

    def send_late_records(self) -> None:
        self.calls.append("late_records")
        if self.fail == "late_records":
            raise RunFailed("dead-letter topic unreachable")

    def store(self, success: RunRecord) -> dict[int, int]:
        self.calls.append("store")
        if self.fail == "store":
            raise RuntimeError("state store: connection lost")
        self.stored.append(success)
        return {0: 100}


def run(m: Any, output: Output | None, state: FakeState) -> RunResult:
    result = RunResult(run_id="r1", pipeline="commit_order", rows_extracted=100)
    record = RunRecord(run_id="r1", pipeline="commit_order", status="running", started_at=utcnow())
    commit_run(m, output, state.move, record, result, lambda _m: None)
    return result


def test_every_step_in_order_then_success():
    calls: list[str] = []
    state = FakeState(calls, late=True)
    output = Output(100, 100, 100, FakeTarget(calls, 100), {("dst", 0): 10})
    result = run(manifest(EXCLUSIVE), output, state)
    assert calls == ["target.ends", "target.held", "late_records", "store"]
    assert result.status == "success" and result.committed_offsets == {0: 100}
    assert [g["passed"] for g in result.gates] == [True]
    assert state.stored[0].status == "success"
    assert list(result.timings)[-2:] == ["quality_post", "commit"]


def test_step_1_unacknowledged_messages_stop_the_state():
    calls: list[str] = []
    state = FakeState(calls, late=True)
    with pytest.raises(RunFailed, match="account for 99 message"):
        run(manifest(), Output(100, 100, 99), state)
    assert calls == [] and not state.stored


def test_step_1_is_the_checks_tolerance_when_one_reads_the_target():
    calls: list[str] = []
    state = FakeState(calls)
    result = run(manifest("{type: source_target_count, tolerance_pct: 5}"), Output(100, 100, 98, FakeTarget(calls, 98), {}), state)
    assert result.status == "success" and calls == ["target.ends", "store"]


def test_step_2_a_short_target_stops_the_state():
    calls: list[str] = []
    state = FakeState(calls, late=True)
    with pytest.raises(RunFailed, match="state was not advanced"):
        run(manifest(EXCLUSIVE), Output(100, 100, 100, FakeTarget(calls, 100, held=90), {("dst", 0): 10}), state)
    assert calls == ["target.ends", "target.held"] and not state.stored


def test_step_2_of_a_replication_fails_loudly_after_the_transactions():
    calls: list[str] = []
    state = FakeState(calls)
    output = Output(100, 100, 100, FakeTarget(calls, 80), {("dst", 0): 10}, transactional=True)
    with pytest.raises(RunFailed, match="committed together"):
        run(manifest(CHECK), output, state)
    assert not state.stored


def test_step_3_late_records_that_cannot_leave_stop_the_state():
    calls: list[str] = []
    state = FakeState(calls, late=True, fail="late_records")
    with pytest.raises(RunFailed, match="dead-letter"):
        run(manifest(), Output(100, 100, 100), state)
    assert calls == ["late_records"] and not state.stored


def test_step_4_a_failed_store_leaves_the_run_unsuccessful():
    calls: list[str] = []
    state = FakeState(calls, fail="store")
    result = RunResult(run_id="r1", pipeline="commit_order", rows_extracted=100)
    record = RunRecord(run_id="r1", pipeline="commit_order", status="running", started_at=utcnow())
    with pytest.raises(RuntimeError, match="connection lost"):
        commit_run(manifest(), Output(100, 100, 100), state.move, record, result, lambda _m: None)
    assert result.status != "success" and result.committed_offsets == {}


def test_nothing_produced_goes_straight_to_the_state():
    calls: list[str] = []
    state = FakeState(calls, late=True)
    result = run(manifest(CHECK), None, state)
    assert calls == ["late_records", "store"] and result.status == "success"
