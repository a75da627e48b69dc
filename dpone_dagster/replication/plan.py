"""Per source partition [start, end) of one replication run (pure).

start = the offset committed in the control topic, or `start_from` for a partition never
replicated; end = the verified high watermark, fixed before any task reads. A committed offset
always wins over `start_from`: ignoring it would copy records a second time.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.boundary import Watermarks
from dpone_dagster.replication.control_topic import encode_key


@dataclass(frozen=True)
class PartitionPlan:
    topic: str
    partition: int
    target_topic: str
    start: int
    end: int
    committed: int | None  # what the control topic held when the run was planned

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def as_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "target_topic": self.target_topic,
            "start": self.start,
            "end": self.end,
            "committed": self.committed,
        }


def plan_start(
    topic: str,
    partition: int,
    watermarks: Watermarks,
    committed: int | None,
    start_from: str,
    commit_group: str,
    provisional: bool = False,
) -> tuple[int, str | None]:
    """(start offset, note or None) for one source partition.

    `provisional`: the control topic could not be read to its end (an open transaction), so
    `committed` may be older than the truth; only checks a newer offset cannot invalidate apply,
    and the task decides from its own read after fencing.
    """
    if committed is not None:
        key = encode_key(commit_group, topic, partition).decode()
        if committed < watermarks.low and not provisional:
            raise RunFailed(
                f"{topic}[{partition}]: committed offset {committed} is below the log start offset "
                f"{watermarks.low}: retention deleted {watermarks.low - committed} record(s) before they were "
                f"replicated. To accept the gap, write a control record with offset {watermarks.low} for key "
                f"{key}, or replicate under a new control_topic.commit_group"
            )
        if committed > watermarks.high:
            raise RunFailed(
                f"{topic}[{partition}]: committed offset {committed} is beyond the high watermark "
                f"{watermarks.high} (was the source topic recreated?); write a tombstone for control key "
                f"{key} to start over"
            )
        return committed, None
    if start_from == "latest":
        return watermarks.high, f"{topic}[{partition}]: never replicated, starting from latest ({watermarks.high})"
    note = f"{topic}[{partition}]: never replicated, starting from earliest ({watermarks.low})"
    return watermarks.low, note


def plan_partitions(
    topic: str,
    target_topic: str,
    watermarks: dict[int, Watermarks],
    committed: dict[int, int],
    start_from: str,
    commit_group: str,
    provisional: bool = False,
) -> tuple[list[PartitionPlan], list[str]]:
    plans: list[PartitionPlan] = []
    notes: list[str] = []
    for partition in sorted(watermarks):
        wm = watermarks[partition]
        start, note = plan_start(topic, partition, wm, committed.get(partition), start_from, commit_group, provisional)
        if note:
            notes.append(note)
        plans.append(PartitionPlan(topic, partition, target_topic, start, wm.high, committed.get(partition)))
    return plans, notes
