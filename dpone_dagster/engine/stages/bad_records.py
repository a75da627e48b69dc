"""Stage 3, bad records: records that could not be decoded follow source.options.on_error (fail
before anything is produced, skip, or dead-letter with the run's output); the rest go on."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.engine.bad_records import handle_bad_records
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.extract import Batch
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.sinks.dead_letters import DeadLetters


def screen_undecodable(
    manifest: Manifest, batch: Batch, label: str, letters: DeadLetters, result: RunResult
) -> Batch:
    corrupt = int(batch.counts["corrupt"])
    if not corrupt:
        return batch
    bad = batch.staged.where(F.col(C.CORRUPT).isNotNull()).select(
        F.col(C.SOURCE_PARTITION).alias("partition"),
        F.col(C.SOURCE_OFFSET).alias("offset"),
        F.col(C.CORRUPT).alias("reason"),  # every decoder says why and where ("unknown schema id 42 at 0@18")
    )
    handle_bad_records(manifest, bad, corrupt, letters, result, f"record(s) of {label} could not be decoded")
    return replace(batch, staged=batch.staged.where(F.col(C.CORRUPT).isNull()))
