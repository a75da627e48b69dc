"""Time windows → per-partition offset ranges that cover every offset exactly once.

The mapping rule, per partition:
- a window that was materialized before reads the offsets recorded then (frozen): a backfill of it
  reads exactly what its first run read;
- a window never materialized starts where the window right before it ended when that one is
  recorded, and ends where the window right after it starts when that one is recorded;
- otherwise an edge is the timestamp lookup (kafka/timestamps.py), kept between the nearest
  recorded offsets on either side, so a looked-up range never overlaps a recorded one.
Consecutive windows planned together share their edge. Once every window is materialized, each
offset belongs to exactly one window, whatever the record timestamps say; a record whose timestamp
is before the start of the window that holds it is a late record (counted, see late_records).

Pure: recorded ranges and the lookup come in as values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dpone_dagster.kafka.boundary import PartitionRange

# Recorded ranges: window start (ISO 8601, UTC) -> {"start", "end", "partitions": {partition: [start, end]}}
Recorded = dict[str, dict]


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    # Set for the windows of a partitions definition: only those are recorded and bind neighbours
    # (a one-off window of arbitrary bounds is looked up and left unrecorded).
    partition_key: str | None = None

    @property
    def key(self) -> str:
        return iso(self.start)

    @property
    def start_ms(self) -> int:
        return int(self.start.timestamp() * 1000)

    @property
    def end_ms(self) -> int:
        return int(self.end.timestamp() * 1000)


@dataclass(frozen=True)
class PlannedWindow:
    window: Window
    ranges: tuple[PartitionRange, ...]
    frozen: tuple[int, ...]  # partitions whose range was recorded by an earlier run

    def as_dict(self) -> dict:
        return {
            "start": self.window.start.isoformat(),
            "end": self.window.end.isoformat(),
            **({"partition_key": self.window.partition_key} if self.window.partition_key else {}),
            "start_ms": self.window.start_ms,
            "partitions": [r.as_dict() for r in self.ranges],
            "frozen": bool(self.frozen) and len(self.frozen) == len(self.ranges),
        }


def recorded_range(recorded: Recorded, window: Window, partition: int) -> tuple[int, int] | None:
    entry = recorded.get(window.key)
    if entry is None or entry.get("end") != iso(window.end):
        return None  # another window shape (the partitions definition changed): not this window
    found = entry["partitions"].get(str(partition))
    return (int(found[0]), int(found[1])) if found is not None else None


def plan_windows(
    partitions: list[int],
    windows: list[Window],
    recorded: Recorded,
    lookup: Callable[[int], dict[int, int]],
) -> list[PlannedWindow]:
    """Ranges for contiguous `windows` (in order). `lookup(ms)` answers the timestamp lookup for all
    partitions and is called only for edges no recorded range fixes."""
    looked_up: dict[int, dict[int, int]] = {}

    def at(ms: int, partition: int) -> int:
        if ms not in looked_up:
            looked_up[ms] = lookup(ms)
        return looked_up[ms][partition]

    by_start = sorted(recorded.items(), key=lambda item: item[0])
    planned: dict[int, list[tuple[int, int, bool]]] = {}
    for p in partitions:
        spans = [(_instant(e["start"]), _instant(e["end"]), e["partitions"][str(p)]) for _, e in by_start if str(p) in e["partitions"]]
        rows: list[tuple[int, int, bool]] = []
        for i, window in enumerate(windows):
            frozen = recorded_range(recorded, window, p)
            if frozen is not None:
                rows.append((*frozen, True))
                continue
            floor = max((int(r[1]) for s, e, r in spans if e <= window.start), default=None)
            ceiling = min((int(r[0]) for s, e, r in spans if s >= window.end), default=None)
            before = _adjacent(spans, end=window.start)
            after = _adjacent(spans, start=window.end)
            if i > 0:
                start = rows[-1][1]  # planned together: share the edge
            elif before is not None:
                start = before
            else:
                start = _clamp(at(window.start_ms, p), floor, ceiling)
            if after is not None:
                end = after
            else:
                end = _clamp(at(window.end_ms, p), start, ceiling)
            rows.append((start, max(start, end), False))
        planned[p] = rows
    return [
        PlannedWindow(
            window,
            tuple(PartitionRange(p, planned[p][i][0], planned[p][i][1]) for p in partitions),
            tuple(p for p in partitions if planned[p][i][2]),
        )
        for i, window in enumerate(windows)
    ]


def record_of(windows: tuple[dict, ...], run_id: str) -> Recorded:
    """What a successful run records: each partition window it read (`PlannedWindow.as_dict`),
    with the ranges it read."""
    return {
        iso(datetime.fromisoformat(w["start"])): {
            "start": iso(datetime.fromisoformat(w["start"])),
            "end": iso(datetime.fromisoformat(w["end"])),
            "partitions": {str(r["partition"]): [r["start"], r["end"]] for r in w["partitions"]},
            "run_id": run_id,
        }
        for w in windows
        if w.get("partition_key")
    }


def last_recorded_ends(recorded: Recorded) -> dict[int, int]:
    """Per partition, the end offset of the newest recorded window holding it."""
    ends: dict[int, int] = {}
    for _, entry in sorted(recorded.items(), key=lambda item: _instant(item[1]["start"])):
        for p, (_, end) in entry["partitions"].items():
            ends[int(p)] = int(end)
    return ends


def _adjacent(spans: list[tuple[datetime, datetime, list]], start: datetime | None = None, end: datetime | None = None) -> int | None:
    """The recorded edge next to a window: the end of the one ending at `end`, or the start of the
    one starting at `start`."""
    for s, e, r in spans:
        if end is not None and e == end:
            return int(r[1])
        if start is not None and s == start:
            return int(r[0])
    return None


def _clamp(value: int, floor: int | None, ceiling: int | None) -> int:
    if floor is not None:
        value = max(value, floor)
    if ceiling is not None:
        value = min(value, ceiling)
    return value


def iso(moment: datetime) -> str:
    """The form window bounds are recorded in (UTC), whatever the partitions' time zone."""
    return moment.astimezone(UTC).isoformat()


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)
