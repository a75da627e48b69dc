"""Stages 7 and 8: how a run's state moves once its output has left, written once for every
route and for replication. In this order; a step that fails stops the ones after it:

1. Deliveries confirmed: the delivery reports account for every message the run produced (each
   report's error already failed the load). With a `source_target_count` check its tolerance
   judges the counts instead, in step 2.
2. Post-publish checks: `source_target_count` against what the target topic(s) hold now — their
   end offsets before and after the run and, with `exclusive_target`, the records in between.
3. A time-window read's late records go to the dead-letter topic: with the run's output, after
   every check, before the state.
4. The state: the offsets (or the consumer group's), the SQL watermark or the windows' offset
   ranges, with the run row marked successful (see below for the one commit it is).
5. The result: success, the committed offsets (and the lag after the run, set in step 4).

Until step 4 nothing of the state moved: a failure leaves it where it was, and the next run
produces the batch again (at least once). Step 4 is one transaction of the state store, except
with `offset_storage: kafka`, where the consumer group's commit comes first and the run row after
it (engine/offsets.py): a store that fails between them leaves the offsets advanced and the run
recorded as failed, and the next run starts after the delivered batch. Two routes move part of the
state earlier, each for a reason:
- the direct path stores a partition's offsets while it produces, once its slices up to there are
  delivered without a gap (engine/direct_load.py); the run row still waits for step 4;
- exactly-once replication commits each range's records with its new offset in one Kafka
  transaction (replication/): steps 1 and 4's offsets happen there, so a failed step 2 fails the
  run loudly but cannot hold the offsets back, and step 4 writes only the run row.

The steps take the target and the state as the small interfaces below, so their order is tested
with fakes (tests/test_commit_order.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.state.base import RunRecord, StateStore, utcnow


class TargetTopics(Protocol):
    """The target as the post-publish checks read it (quality/target.py reads a Kafka topic)."""

    def ends(self) -> dict[Any, int]:
        """End offset of every partition (keys: whatever names a partition across the targets)."""

    def held(self, before: Mapping[Any, int], after: Mapping[Any, int]) -> int:
        """Records held between two readings of `ends`."""


@dataclass(frozen=True)
class Output:
    """What left for the sink, as steps 1 and 2 judge it."""

    extracted: int  # source records the checks count from
    produced: int  # messages the run meant to produce
    acknowledged: int  # messages the delivery reports (or the transactions) account for
    target: TargetTopics | None = None  # read by step 2 (None: no source_target_count check)
    target_before: Mapping[Any, int] | None = None  # the target's ends before the run wrote
    transactional: bool = False  # records committed with their offsets (replication)


@dataclass(frozen=True)
class StateMove:
    """How a planned read advances the state (engine/stages/boundary.py builds it)."""

    store: Callable[[RunRecord], dict[int, int]]  # step 4; returns the committed offsets
    send_late_records: Callable[[], None] | None = None  # step 3 (time-window reads)
    incremental: bool = True  # "state advanced" rather than "offsets unchanged" in the log


def commit_run(
    manifest: Manifest,
    output: Output | None,
    state: StateMove,
    record: RunRecord,
    result: RunResult,
    log: Log,
) -> None:
    """Steps 1 to 5 (the module's docstring); `output` None: nothing was produced."""
    if output is not None:
        with stage(result, "quality_post", log):
            confirm_deliveries(manifest, output)
            check_target(manifest, output, result)
    with stage(result, "commit", log):
        if state.send_late_records is not None:
            state.send_late_records()
        committed = state.store(run_record(record, result, "success"))
        result.status = "success"
        result.finished_at = utcnow().isoformat()
        result.committed_offsets = committed
        log(f"commit: {committed or 'state advanced' if state.incremental else 'offsets unchanged'}")


def confirm_deliveries(manifest: Manifest, output: Output) -> None:
    """Step 1: without a source_target_count tolerance every produced message is acknowledged."""
    if output.transactional or reconciles(manifest):
        return
    if output.acknowledged != output.produced:
        raise RunFailed(
            f"delivery reports account for {output.acknowledged} message(s) but {output.produced} were "
            "produced; no state was advanced"
        )


def check_target(manifest: Manifest, output: Output, result: RunResult) -> None:
    """Step 2: the source_target_count checks against the target; in fail mode a mismatch stops
    the state (replication: fails the run, its offsets are already committed)."""
    from dpone_dagster.quality.gates import failed_gates, run_post_publish
    from dpone_dagster.quality.target import offset_advance

    if not reconciles(manifest) or output.target is None:
        return
    checks = manifest.quality.checks
    before = output.target_before or {}
    after = output.target.ends()
    exclusive = any(c.type == "source_target_count" and c.exclusive_target for c in checks)
    held = output.target.held(before, after) if exclusive else None
    advance = offset_advance(before, after)
    gates = run_post_publish(
        checks, manifest.quality.mode, output.extracted, output.produced, output.acknowledged, advance, held
    )
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if not blocking:
        return
    failed = "; ".join(f"{g.name}: {g.description}" for g in blocking)
    if output.transactional:
        raise RunFailed(
            "reconciliation failed after the replication committed (records and source offsets are "
            f"committed together, so the next run starts after them; inspect the target): {failed}"
        )
    raise RunFailed(f"reconciliation failed after publishing, state was not advanced (a rerun re-produces the batch): {failed}")


def finish_checks_only(store: StateStore, record: RunRecord, result: RunResult, log: Log) -> None:
    """End a run that only judged its batch: the run row is written, no offsets or watermark."""
    result.status = "success"
    result.finished_at = utcnow().isoformat()
    result.notes.append("checks only: the batch was judged; nothing was produced and no offsets moved")
    store.finish_run_success(run_record(record, result, "success"), None, None, None)
    log("commit: checks only, offsets unchanged")


def run_record(record: RunRecord, result: RunResult, status: str) -> RunRecord:
    return RunRecord(
        run_id=record.run_id,
        pipeline=record.pipeline,
        status=status,
        started_at=record.started_at,
        finished_at=utcnow(),
        boundary=result.boundary,
        counts=result.counts(),
        timings=result.timings,
        error=result.error,
    )


def reconciles(manifest: Manifest) -> bool:
    """Whether a source_target_count check reads the target after the run (step 2)."""
    return any(c.type == "source_target_count" for c in manifest.quality.checks)
