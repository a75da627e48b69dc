"""Which offsets a run may store while its slices are still being produced (pure).

Slices of one partition can finish in any order; a partition's stored offset may move to the end of
a slice only once every slice before it was delivered too, so the stored offset never skips a
record that was not delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SliceProgress:
    """Delivered slices per partition, and how far each partition is delivered without a gap."""

    starts: dict[int, int]  # partition -> the run's first offset
    _done: dict[int, dict[int, int]] = field(default_factory=dict)  # partition -> {start: end}

    def __post_init__(self) -> None:
        self._reached = dict(self.starts)

    def delivered(self, partition: int, start: int, end: int) -> dict[int, int]:
        """Record a delivered slice; returns the partitions whose gap-free end moved, with it."""
        self._done.setdefault(partition, {})[start] = end
        reached = self._reached[partition]
        done = self._done[partition]
        while reached in done:
            reached = done.pop(reached)
        if reached == self._reached[partition]:
            return {}
        self._reached[partition] = reached
        return {partition: reached}

    @property
    def reached(self) -> dict[int, int]:
        return dict(self._reached)
