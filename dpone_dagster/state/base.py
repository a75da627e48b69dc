"""Shapes and contract shared by every state store.

The product rule every store enforces: Kafka offsets and SQL watermarks move forward only after the
sink acknowledged every message they cover — in the same commit that marks the run `success`, or,
for a running run that produces its slices one by one (the direct path), as each slice of a
partition is delivered (`advance_offsets`). A failed run is recorded but never moves them further.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from dpone_dagster.errors import RunFailed

RUN_STATUSES = ("running", "success", "failed")


class StateConflict(RunFailed):
    """The store refused a write that would break the run/offset rules; nothing was written."""


class StateStoreLost(RunFailed):
    """The connection to the state store was lost; the write in flight did not commit."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime, what: str) -> datetime:
    # A naive datetime is ambiguous across hosts; refuse it rather than guess a zone.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (use datetime.now(timezone.utc))")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class PartitionOffset:
    partition: int
    offset: int  # next offset to read


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    pipeline: str
    status: str  # running|success|failed
    started_at: datetime
    finished_at: datetime | None = None
    boundary: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"RunRecord.status must be one of {RUN_STATUSES}, got {self.status!r}")
        # Normalise to UTC so that every store writes and returns the same instant representation.
        object.__setattr__(self, "started_at", as_utc(self.started_at, "RunRecord.started_at"))
        if self.finished_at is not None:
            object.__setattr__(self, "finished_at", as_utc(self.finished_at, "RunRecord.finished_at"))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        finished = data.get("finished_at")
        return cls(
            run_id=data["run_id"],
            pipeline=data["pipeline"],
            status=data["status"],
            started_at=datetime.fromisoformat(data["started_at"]),
            finished_at=datetime.fromisoformat(finished) if finished else None,
            boundary=data.get("boundary") or {},
            counts=data.get("counts") or {},
            timings=data.get("timings") or {},
            error=data.get("error"),
        )


def dumps(value: Any) -> str:
    # No `default=`: a value that would not round-trip (datetime, object) must fail loudly, inside
    # the commit, so that nothing is written.
    return json.dumps(value, sort_keys=True, allow_nan=False)


def check_offsets(topic: str | None, group_id: str | None, offsets: dict[int, int] | None) -> None:
    if offsets is None:
        return
    if not topic or not group_id:
        raise ValueError("offsets need both topic and group_id")
    for partition, offset in offsets.items():
        if int(partition) < 0 or int(offset) < 0:
            raise ValueError(f"invalid offset {partition}:{offset} (partition and offset must be >= 0)")


def check_windows(topic: str | None, group_id: str | None, windows: dict[str, dict[str, Any]] | None) -> None:
    if not windows:
        return
    if not topic or not group_id:
        raise ValueError("window ranges need both topic and group_id")
    for key, entry in windows.items():
        as_utc(datetime.fromisoformat(key), f"window {key}")
        for partition, (start, end) in entry["partitions"].items():
            if int(partition) < 0 or not 0 <= int(start) <= int(end):
                raise ValueError(f"window {key}: invalid range {partition}:[{start}, {end})")


def finished(record: RunRecord, status: str) -> RunRecord:
    """The record as it is stored when the run ends (finished_at defaults to now)."""
    return replace(record, status=status, finished_at=record.finished_at or utcnow())


@runtime_checkable
class StateStore(Protocol):
    def load_offsets(self, topic: str, group_id: str) -> dict[int, int]:
        """Committed next-offset per partition; {} when nothing was committed (start from earliest)."""
        ...

    def start_run(self, record: RunRecord) -> None:
        """Record a `running` run; a run_id that already exists raises StateConflict."""
        ...

    def finish_run_success(
        self,
        record: RunRecord,
        topic: str | None,
        group_id: str | None,
        offsets: dict[int, int] | None,
        watermark: dict[str, Any] | None = None,
        windows: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Upsert offsets per partition, the watermark, the windows' offset ranges (see
        `load_windows`) and the success status in ONE commit.

        Raises StateConflict (writing nothing) when the run already finished.
        """
        ...

    def advance_offsets(self, record: RunRecord, topic: str, group_id: str, offsets: dict[int, int]) -> None:
        """Move the offsets of partitions whose slices a running run has delivered, forward only,
        in one commit; the run stays `running`. Raises StateConflict (writing nothing) unless the
        run is running."""
        ...

    def finish_run_failed(self, record: RunRecord) -> None:
        """Record status failed + error; never touches offsets or watermarks.

        A run already committed as success stays success (its offsets moved); the call is ignored.
        """
        ...

    def load_watermark(self, pipeline: str) -> dict[str, Any] | None: ...

    def load_windows(self, topic: str, group_id: str) -> dict[str, dict[str, Any]]:
        """Offset ranges of the time windows materialized so far: window start (ISO 8601) ->
        {"start", "end", "partitions": {partition: [start, end]}, "run_id"}. A window's ranges are
        written once, by its first successful run, and never change (reruns read them)."""
        ...

    def reset_offsets(self, topic: str, group_id: str, offsets: dict[int, int] | None) -> None:
        """None: forget stored offsets (next run starts from earliest); a dict: store exactly these."""
        ...

    def list_runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        """Newest first (by started_at)."""
        ...

    def try_lock(self, pipeline: str) -> bool:
        """Take the pipeline's exclusive run lock without waiting; False when another holder has it."""
        ...

    def unlock(self, pipeline: str) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Safe summary for logs and metadata (never credentials)."""
        ...

    def close(self) -> None: ...
