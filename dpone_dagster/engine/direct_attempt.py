"""What both direct paths (engine/direct.py for Kafka sources, engine/direct_sql.py for SQL
sources) share about an attempt: the switch that turns them off, the exceptions that hand a batch
to the Spark SQL path or scan it again, and taking back what the attempt recorded before they do."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dpone_dagster.direct.spark_rows import SparkRows
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.timing import Log

JUDGING_STAGES = ("extract", "quality_pre", "shape", "quality_published")


def switched_off() -> str | None:
    """The reason when DPONE_DIRECT_PATH turns the direct paths off, else None."""
    if os.environ.get("DPONE_DIRECT_PATH", "on").lower() in ("off", "0", "false", "no"):
        return "DPONE_DIRECT_PATH is off"
    return None


class ToSparkSql(Exception):
    """The batch needs the Spark SQL path (the message says why); nothing was produced."""


class ScanAgain(Exception):
    """The source's plan for the batch changed (the message says how): the batch is scanned again
    with it, on the direct path; nothing was produced."""


class DecodedBySpark(ScanAgain):
    """Records only Spark's decoder reads, as it decoded them (`rows`): the batch is scanned again
    with them spliced in (direct/spark_rows.py)."""

    def __init__(self, rows: SparkRows):
        super().__init__(f"{rows.table.num_rows} record(s) only Spark's decoder reads: decoded by Spark")
        self.rows = rows


@dataclass(frozen=True)
class Attempt:
    """Where the run's gates and notes stood when the attempt began."""

    gates: int
    notes: int

    @staticmethod
    def begin(result: RunResult) -> Attempt:
        return Attempt(len(result.gates), len(result.notes))

    def take_back(self, result: RunResult, reason: ToSparkSql, log: Log) -> None:
        """Undo what the attempt recorded and note why the batch goes to the Spark SQL path."""
        self.undo(result)
        result.notes.append(f"direct path: the batch went to the Spark SQL path: {reason}")
        log(f"direct path: handing the batch to the Spark SQL path ({reason})")

    def undo(self, result: RunResult, timing: str = "direct_attempt") -> None:
        """Undo what the attempt recorded: its gates, notes and counts; its stage times are added
        to one `timing` (a scan handed over, or one scanned again)."""
        del result.gates[self.gates :]
        del result.notes[self.notes :]
        attempt = sum(result.timings.pop(name, 0.0) for name in JUDGING_STAGES)
        result.timings[timing] = round(result.timings.get(timing, 0.0) + attempt, 3)
        result.rows_extracted = result.deletes_skipped = result.rows_dead_lettered = result.rows_skipped = 0
