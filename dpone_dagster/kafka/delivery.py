"""Delivery statistics: what each producing task reports and how the driver adds them up (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

STATS_COLUMNS = (
    "partition int, delivered long, failed long, tombstones long, bytes long, "
    "min_offset long, max_offset long, first_error string, executor string"
)
UNASSIGNED = -1  # stats row for failures that never reached a partition


@dataclass(frozen=True)
class PartitionDelivery:
    partition: int
    delivered: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class DeliveryStats:
    delivered: int
    failed: int
    tombstones: int
    bytes: int
    partitions: tuple[PartitionDelivery, ...]
    errors: tuple[str, ...]
    executors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "delivered": self.delivered,
            "failed": self.failed,
            "tombstones": self.tombstones,
            "bytes": self.bytes,
            "partitions": [p.__dict__ for p in self.partitions],
            "errors": list(self.errors),
            "executors": list(self.executors),
        }


def aggregate(rows: Iterable[dict[str, Any]], max_errors: int = 5) -> DeliveryStats:
    delivered = failed = tombstones = nbytes = 0
    per_partition: dict[int, list[int]] = {}
    errors: list[str] = []
    executors: set[str] = set()
    for row in rows:
        delivered += row["delivered"]
        failed += row["failed"]
        tombstones += row["tombstones"]
        nbytes += row["bytes"]
        if row.get("executor"):
            executors.add(row["executor"])
        if row["first_error"] and row["first_error"] not in errors and len(errors) < max_errors:
            errors.append(row["first_error"])
        p = row["partition"]
        if p != UNASSIGNED and row["delivered"]:
            acc = per_partition.setdefault(p, [0, row["min_offset"], row["max_offset"]])
            acc[0] += row["delivered"]
            acc[1] = min(acc[1], row["min_offset"])
            acc[2] = max(acc[2], row["max_offset"])
    partitions = tuple(PartitionDelivery(p, *per_partition[p]) for p in sorted(per_partition))
    return DeliveryStats(delivered, failed, tombstones, nbytes, partitions, tuple(errors), tuple(sorted(executors)))
