"""Pure planning of a bounded Kafka read: which offsets each partition contributes, and how the
ranges are cut into Spark tasks. No IO here: the watermarks and stored offsets come in as values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dpone_dagster.errors import RunFailed


@dataclass(frozen=True)
class Watermarks:
    low: int
    high: int


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one partition; `end` is exclusive and fixed before reading."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def as_dict(self) -> dict[str, int]:
        return {"partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class Boundary:
    topic: str
    method: str  # offsets | max_records | time_window | full
    ranges: tuple[PartitionRange, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # time_window only: per window {start, end, partitions: [{partition, start, end}]}, contiguous.
    windows: tuple[dict, ...] = field(default_factory=tuple)
    # Offsets waiting before max_records capped the ranges (None: nothing was capped).
    backlog: int | None = None
    # on_retention_gap warn: per partition, the records retention removed before they were read.
    lost_to_retention: tuple[tuple[int, int], ...] = ()

    @property
    def lag_before(self) -> int:
        return self.total if self.backlog is None else self.backlog

    @property
    def total(self) -> int:
        """Upper bound of records: offsets may have gaps (compaction, transaction markers)."""
        return sum(r.size for r in self.ranges)

    @property
    def end_offsets(self) -> dict[int, int]:
        return {r.partition: r.end for r in self.ranges}

    def as_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "method": self.method,
            "partitions": [r.as_dict() for r in self.ranges],
            "offsets_in_range": self.total,
            "notes": list(self.notes),
            **({"windows": list(self.windows)} if self.windows else {}),
            **({"lost_to_retention": dict(self.lost_to_retention)} if self.lost_to_retention else {}),
        }


@dataclass(frozen=True)
class ReadTask:
    """One Spark task's share: a slice of one partition."""

    task_id: int
    topic: str
    partition: int
    start: int
    end: int


StartFrom = Literal["stored", "earliest", "latest"]


def plan_offset_ranges(
    topic: str,
    watermarks: dict[int, Watermarks],
    stored: dict[int, int],
    start_from: StartFrom,
    on_retention_gap: Literal["fail", "warn"] = "fail",
) -> Boundary:
    """[start, high) per partition. `stored` holds the next offset to read per partition.

    A stored offset below the log start (retention removed records never read) fails the run,
    or with on_retention_gap warn starts at the log start and says how many records were lost."""
    vanished = sorted(set(stored) - set(watermarks)) if start_from == "stored" else []
    if vanished:
        # Stored progress for partitions the topic no longer has: the topic was recreated with
        # fewer partitions (or replaced). Reading on would silently leave those records behind.
        raise RunFailed(
            f"{topic}: partition(s) {vanished} have stored offsets but no longer exist (the topic has "
            f"{len(watermarks)} partition(s); was it deleted and recreated?); nothing was read. Check the "
            "topic, then reset the state with `dpone state reset <manifest> --yes` to start it afresh"
        )
    ranges: list[PartitionRange] = []
    notes: list[str] = []
    lost: list[tuple[int, int]] = []
    for partition in sorted(watermarks):
        wm = watermarks[partition]
        if start_from == "latest":
            start = wm.high
        elif start_from == "stored" and partition in stored:
            start = stored[partition]
            if start < wm.low:
                gap = (
                    f"{topic}[{partition}]: stored offset {start} is below the log start offset {wm.low} "
                    f"(retention removed {wm.low - start} records that were never read)"
                )
                if on_retention_gap == "fail":
                    raise RunFailed(
                        f"{gap}; nothing was read. Set source.options.on_retention_gap: warn to read on from "
                        "the log start, or rewind with `dpone state reset <manifest> --to earliest --yes`"
                    )
                notes.append(f"warning: {gap}; reading on from the log start")
                lost.append((partition, wm.low - start))
                start = wm.low
            if start > wm.high:
                raise RunFailed(
                    f"{topic}[{partition}]: stored offset {start} is beyond the high watermark {wm.high} "
                    f"(was the topic recreated?); reset the state with `dpone state reset <manifest> --yes`"
                )
        else:
            start = wm.low
            if start_from == "stored":
                notes.append(f"partition {partition}: nothing stored, starting from earliest ({wm.low})")
        ranges.append(PartitionRange(partition, start, wm.high))
    return Boundary(topic, "offsets", tuple(ranges), tuple(notes), lost_to_retention=tuple(lost))


def cap_total_records(boundary: Boundary, max_records: int) -> Boundary:
    """Shrink the ranges so that at most `max_records` offsets are read in all, shared fairly.

    Water-filling: every partition gets an equal share; what a small partition cannot use goes
    to the others. Deterministic for the same input.
    """
    remaining = max_records
    sizes = {r.partition: 0 for r in boundary.ranges}
    open_ranges = [r for r in boundary.ranges if r.size > 0]
    while remaining > 0 and open_ranges:
        share = max(1, remaining // len(open_ranges))
        next_open = []
        for r in open_ranges:
            if remaining == 0:
                break
            take = min(share, r.size - sizes[r.partition], remaining)
            sizes[r.partition] += take
            remaining -= take
            if sizes[r.partition] < r.size:
                next_open.append(r)
        open_ranges = next_open
    ranges = tuple(PartitionRange(r.partition, r.start, r.start + sizes[r.partition]) for r in boundary.ranges)
    return Boundary(
        boundary.topic, "max_records", ranges, boundary.notes, backlog=boundary.total, lost_to_retention=boundary.lost_to_retention
    )


def split_into_tasks(boundary: Boundary, records_per_task: int) -> list[ReadTask]:
    """Cut each non-empty range into slices of at most `records_per_task` offsets."""
    tasks: list[ReadTask] = []
    for r in boundary.ranges:
        start = r.start
        while start < r.end:
            end = min(start + records_per_task, r.end)
            tasks.append(ReadTask(len(tasks), boundary.topic, r.partition, start, end))
            start = end
    return tasks


def pack_tasks(tasks: list[ReadTask], slots: int | None) -> list[list[int]]:
    """Indices of `tasks` grouped into at most `slots` Spark tasks of even size (largest slice to
    the lightest group); each group keeps the slices' order. `None`, or no more slices than
    slots: one Spark task per slice."""
    if slots is None or len(tasks) <= slots:
        return [[i] for i in range(len(tasks))]
    groups: list[list[int]] = [[] for _ in range(slots)]
    loads = [0] * slots
    for i in sorted(range(len(tasks)), key=lambda i: (-(tasks[i].end - tasks[i].start), i)):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += tasks[i].end - tasks[i].start
    return [sorted(group) for group in groups]
