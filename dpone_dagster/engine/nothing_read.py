"""A batch with nothing to publish, judged on the direct path as the Spark SQL path judges it:
none read (the extract records its notes and no rows), or every record read a bad record. The
gates judge zero rows (min_rows by its rule for an empty batch; the row checks are skipped), and
nothing is shaped, registered or produced. The commit then moves the state as after any run that
produced nothing."""

from __future__ import annotations

from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.load import JUDGED, Judged
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.engine.time_windows import LateRecordScreen, judge_late_records
from dpone_dagster.manifest.models import Manifest


def nothing_planned(manifest: Manifest, planned: PlannedRead, result: RunResult, notes: list[str], log: Log) -> Judged:
    """A batch planned empty (no offsets past the stored ones, no rows past the watermark)."""
    with stage(result, "extract", log):
        result.rows_extracted = 0
        if isinstance(planned.source, LateRecordScreen):  # its windows' counts are recorded, as zero
            judge_late_records(planned.source.policy, {}, result, log)
        result.notes.extend(notes)
    return nothing_read(manifest, planned, result, log)


def nothing_read(manifest: Manifest, planned: PlannedRead, result: RunResult, log: Log) -> Judged:
    """The gates of a batch whose extract read no record; JUDGED: nothing is produced."""
    result.execution_path = "direct"
    with stage(result, "quality_pre", log):
        pre_publish_gates(manifest, None, planned.incremental, result, 0, "extracted")
    return nothing_to_publish(manifest, planned, result, log)


def nothing_to_publish(manifest: Manifest, planned: PlannedRead, result: RunResult, log: Log) -> Judged:
    """The published rows' gates of a batch without a row to publish (none read, or every record
    read a bad record set aside); JUDGED: nothing is shaped, registered or produced (the caller
    sends the dead letters)."""
    result.execution_path = "direct"
    with stage(result, "quality_published", log):
        pre_publish_gates(manifest, None, planned.incremental, result, 0, "published")
    log("extract: no new records; nothing to produce")
    return JUDGED
