"""Stage 4, gates: the quality checks that judge a batch before anything is produced. A failing
gate in fail mode refuses the data (never retried): nothing is produced and no state moves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.state.base import utcnow

if TYPE_CHECKING:
    from dpone_dagster.quality.gates import Measured


def pre_publish_gates(
    manifest: Manifest,
    frame: DataFrame | None,
    incremental: bool,
    result: RunResult,
    rows: int,
    stage: str | None = None,
    measured: Measured | None = None,
) -> None:
    """Gates of one stage (`extracted`: the decoded batch; `published`: the rows to publish; None:
    every check) on `frame` of `rows` rows, or on what the direct path's tasks `measured`, before
    anything is produced; fail mode stops the run here."""
    from dpone_dagster.quality.gates import failed_gates, run_pre_publish

    quality = manifest.quality
    gates = run_pre_publish(
        frame,
        quality.checks,
        quality.mode,
        rows,
        incremental_empty=incremental and result.rows_extracted == 0,
        now=utcnow(),
        stage=stage,
        measured=measured,
    )
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if blocking:
        raise DataRefused(
            "quality gate(s) failed before publishing, nothing was produced and no state advanced: "
            + "; ".join(f"{g.name}: {g.description}" for g in blocking)
        )
