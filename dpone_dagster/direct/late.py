"""Late records of a time-window read, counted in the tasks by the Spark SQL path's rule
(sources/kafka.late_window). Pure."""

from __future__ import annotations

import numpy as np

# One partition's offsets of a time window: window index, partition, start, end (exclusive), and
# the window's start in epoch milliseconds.
WindowRange = tuple[int, int, int, int, int]


def late_records(windows: tuple[WindowRange, ...], partition: int, offsets: np.ndarray, stamps: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """Which records of one partition are late, and how many per window index (pure): a record is
    late in the first window, in order, whose range holds its offset and whose start is after its
    timestamp, the rule of the Spark SQL path (sources/kafka.late_window)."""
    counted = np.zeros(len(offsets), bool)
    out: dict[int, int] = {}
    for index, window_partition, start, end, start_ms in windows:
        if window_partition != partition or end <= start:
            continue
        late = (offsets >= start) & (offsets < end) & (stamps < start_ms) & ~counted
        counted |= late
        if late.any():
            out[index] = out.get(index, 0) + int(late.sum())
    return counted, out


def late_counts(windows: tuple[WindowRange, ...], partition: int, offsets: np.ndarray, stamps: np.ndarray) -> dict[int, int]:
    """Late records of one partition per window index (late_records)."""
    return late_records(windows, partition, offsets, stamps)[1]
