"""What a batch source offers the engine (engine/run.py). Implement this to add a source.

A run reads one bounded batch:

1. plan: fix what the run reads before anything is read (Kafka: offset ranges per partition from
   the stored offsets or the windows; SQL: a watermark window from the stored watermark), so that
   a retry reads the same batch. The arguments differ per source, so the engine calls `plan` in a
   `_plan_<source>` function of engine/stages/boundary.py, which also names the read for progress and error
   messages, says whether an empty batch means "no new data", and how the state advances once
   the sink succeeded (offsets, watermark). The result is a `Boundary`.
2. extract: read exactly that boundary on Spark (`BatchSource.extract`); the engine keeps the
   batch, counts it, routes bad records and shapes it for the sink.
3. widen (optional, `WideningSource`): when the extract reports records with keys its inferred
   schema missed (column C.UNKNOWN_KEYS), read the batch again with a wider schema.

`sources.kafka.KafkaBatchSource` and `sources.sql.SqlBatchSource` implement these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyspark.sql import DataFrame, SparkSession

if TYPE_CHECKING:
    from dpone_dagster.sources.kafka import ExtractResult

Log = Callable[[str], None]


class Boundary(Protocol):
    """What one run reads, fixed at plan time; recorded with the run (its state row, Dagster)."""

    @property
    def notes(self) -> tuple[str, ...]:
        """What the plan decided that a user should know (e.g. a retention gap); shown with the run."""
        ...

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description of the boundary, stored as the run's `boundary`."""
        ...


BoundaryT = TypeVar("BoundaryT", bound=Boundary, contravariant=True)


class BatchSource(Protocol[BoundaryT]):
    def extract(self, spark: SparkSession, boundary: BoundaryT, log: Log) -> ExtractResult:
        """Read the boundary on Spark, lazily: payload columns plus the metadata columns of
        dpone_dagster.columns (a decode failure goes to C.CORRUPT with its reason, never raises)."""
        ...


class WideningSource(BatchSource[BoundaryT], Protocol[BoundaryT]):
    def widen(
        self, spark: SparkSession, boundary: BoundaryT, extracted: ExtractResult, staged: DataFrame, log: Log
    ) -> ExtractResult:
        """Extract again with the keys `staged` reports in C.UNKNOWN_KEYS added to the schema."""
        ...
