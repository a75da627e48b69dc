"""Which offsets a run may store while its slices are still being produced, and which slice may
start next (pure).

Slices of one partition can finish in any order; a partition's stored offset may move to the end of
a slice only once every slice before it was delivered too, so the stored offset never skips a
record that was not delivered.

The duplicate bound: a run that dies re-sends what it had delivered beyond its stored offsets. A
slice is *open* from its start until the stored offset of its partition covers it (running, or
delivered behind a slower slice of its partition). `SliceSchedule` starts a slice only while fewer
than `window` slices are open, so whatever happens, at most `window` slices are delivered and not
stored: the duplicates of a failure are at most `window` × the slice size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Slice = tuple[str, int, int, int]  # topic, partition, start, end (exclusive)


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


class SliceSchedule:
    """The order slices start in, at most `window` open at once (see the module docstring).

    Slices start in order of their distance from their partition's first offset, partitions
    interleaved, so every partition's stored offset moves early; within a partition they start in
    offset order, so an open slice behind a slower one always waits on a running slice (the
    window never fills with slices that nothing running can release)."""

    def __init__(self, slices: list[Slice], starts: dict[int, int], window: int) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.progress = SliceProgress(dict(starts))
        self._waiting = sorted(slices, key=lambda s: (s[2] - starts[s[1]], s[1], s[2]))
        self._open: set[Slice] = set()
        self.stopped = False

    def next(self) -> Slice | None:
        """The slice to start now, or None (the window is full, nothing is left, or stopped)."""
        if self.stopped or not self._waiting or len(self._open) >= self.window:
            return None
        piece = self._waiting.pop(0)
        self._open.add(piece)
        return piece

    def delivered(self, piece: Slice) -> dict[int, int]:
        """A slice delivered every message: the partitions whose storable offset moved, with it."""
        moved = self.progress.delivered(piece[1], piece[2], piece[3])
        reached = self.progress.reached
        self._open = {s for s in self._open if s[3] > reached[s[1]]}
        return moved

    def stop(self) -> None:
        """After a failed slice: start nothing more (the slices running still finish)."""
        self.stopped = True

    @property
    def done(self) -> bool:
        return not self._waiting

    @property
    def open(self) -> int:
        return len(self._open)
