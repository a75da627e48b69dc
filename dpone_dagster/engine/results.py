"""Values a run produces: the summary the CLI prints and Dagster records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunResult:
    run_id: str
    pipeline: str
    status: str = "running"  # success | failed
    # How the batch ran: "direct" (engine/direct.py), "spark_sql" (engine/stages/), "replication".
    execution_path: str = ""
    boundary: dict[str, Any] = field(default_factory=dict)
    rows_extracted: int = 0
    messages_produced: int = 0
    tombstones: int = 0
    deletes_skipped: int = 0
    duplicates_removed: int = 0
    rows_dead_lettered: int = 0
    rows_skipped: int = 0
    bytes_produced: int = 0
    committed_offsets: dict[int, int] = field(default_factory=dict)
    sink_partitions: list[dict[str, int]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    executors: list[str] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    schema_evolution: dict[str, Any] | None = None
    lag_before: int | None = None
    lag_after: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def offset_ranges(self) -> list[dict[str, int]]:
        return list(self.boundary.get("partitions", []))

    def target_topics(self, sink_topic: str) -> list[str]:
        """The topics the run produced to: a replication names its targets in the boundary
        (sink.topic is empty under a topic mapping), any other run writes sink.topic."""
        targets = self.boundary.get("targets") if self.boundary.get("method") == "replication" else None
        return sorted(set(targets.values())) if targets else [sink_topic]

    def counts(self) -> dict[str, int]:
        return {
            "rows_extracted": self.rows_extracted,
            "messages_produced": self.messages_produced,
            "tombstones": self.tombstones,
            "deletes_skipped": self.deletes_skipped,
            "duplicates_removed": self.duplicates_removed,
            "rows_dead_lettered": self.rows_dead_lettered,
            "rows_skipped": self.rows_skipped,
            "bytes_produced": self.bytes_produced,
        }

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["offset_ranges"] = self.offset_ranges
        data["committed_offsets"] = {str(k): v for k, v in self.committed_offsets.items()}
        return data
