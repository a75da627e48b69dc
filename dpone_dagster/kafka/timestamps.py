"""Where a timestamp falls in a partition's log: the rule, and the search that applies it.

The rule. A record's timestamp counts as it is, unless the record is an outlier: newer than each
of its neighbours (up to two records on either side) by more than SKEW_TOLERANCE_MS, or older
than each of them by more than that. An outlier counts with the median of its neighbours'
timestamps instead. The boundary of time T is the offset of the first record whose counted
timestamp is >= T (the high watermark when there is none). Neighbours are taken in equal numbers on
both sides, so the newest record of a partition (nothing follows it yet) and the oldest count as
they are.

Why: one record stamped far ahead (a producer with a wrong clock) or far behind (written late) is
outvoted by the records around it, so it never moves a boundary, and the records next to it keep
their own timestamps; it is delivered with the window whose offsets hold it. For records in order
(or out of order by less than the tolerance) this is Kafka's own index rule: the earliest offset
whose timestamp is >= T. A run of two or more outliers in a row is not outvoted.

Two ways find that offset and give the same answer:
- the broker's timestamp index (`hint`): its answer is the first record whose own timestamp is
  >= T, and no record before it can count as >= T; the search walks forward from it past
  outliers. A hint the records around it do not confirm (a broker without a timestamp index
  answers from its write times) is ignored;
- a binary search over counted timestamps, then the earliest qualifying record among the
  WALK_LIMIT records before its answer.
Both agree when the records are in order apart from isolated outliers, and disorder below the
tolerance stays within WALK_LIMIT records of the boundary. Either way windows stay contiguous:
the offsets a window was materialized with are recorded and bind its neighbours (windows.py).

Pure: every record is read through a `Probe`, so the rule is tested with an in-memory log.
"""

from __future__ import annotations

from typing import Protocol

from dpone_dagster.kafka.boundary import Watermarks

Record = tuple[int, int]  # (offset, timestamp_ms)

# Records walked from a candidate: forward from an index answer past outliers (a longer walk
# falls back to bisection), back from a bisection answer to the first qualifying record.
WALK_LIMIT = 64
# How far a record's timestamp may run ahead of (or behind) all its neighbours before it is
# outvoted: wider than producer batching and ordinary clock drift, far below a skewed clock.
SKEW_TOLERANCE_MS = 5 * 60_000
NEIGHBOURS = 2  # per side


class Probe(Protocol):
    def first_at_or_after(self, partition: int, offset: int) -> Record | None:
        """(offset, timestamp_ms) of the first record at offset >= `offset`; None past the end."""
        ...


def boundary_offset(probe: Probe, partition: int, wm: Watermarks, ts: int, hint: int | None = None) -> int:
    """The offset where time `ts` starts in the partition (the rule in the module docstring)."""
    if wm.high <= wm.low:
        return wm.high
    if hint is not None and _confirms(probe, partition, wm, hint, ts):
        found = _walk_forward(probe, partition, wm, hint, ts)
        if found is not None:
            return found
    return _walk_back(probe, partition, wm, _bisect(probe, partition, wm, ts), ts)


def effective_timestamp(probe: Probe, partition: int, wm: Watermarks, record: Record) -> int:
    """The timestamp `record` counts with (the rule in the module docstring)."""
    after: list[int] = []
    offset = record[0]
    while len(after) < NEIGHBOURS:
        nxt = probe.first_at_or_after(partition, offset + 1) if offset + 1 < wm.high else None
        if nxt is None:
            break
        after.append(nxt[1])
        offset = nxt[0]
    before: list[int] = []
    offset = record[0]
    while len(before) < NEIGHBOURS:
        prev = _last_before(probe, partition, wm, offset) if offset > wm.low else None
        if prev is None:
            break
        before.append(prev[1])
        offset = prev[0]
    # As many neighbours on each side (fewer near either end of the log): the median then never
    # comes from one side alone, so a record before the index answer can never count as >= T.
    k = min(len(before), len(after))
    if k == 0:
        return record[1]
    around = sorted(before[:k] + after[:k])
    if around[0] - SKEW_TOLERANCE_MS <= record[1] <= around[-1] + SKEW_TOLERANCE_MS:
        return record[1]
    return around[(len(around) - 1) // 2]


def _confirms(probe: Probe, partition: int, wm: Watermarks, hint: int, ts: int) -> bool:
    """True when `hint` looks like an index answer for `ts`: the record there is >= ts and the one
    before it is < ts (an index answer of 'none' is the high watermark)."""
    if not wm.low <= hint <= wm.high:
        return False
    at = probe.first_at_or_after(partition, hint) if hint < wm.high else None
    if hint < wm.high and (at is None or at[1] < ts):
        return False
    before = _last_before(probe, partition, wm, hint) if hint > wm.low else None
    return before is None or before[1] < ts


def _walk_forward(probe: Probe, partition: int, wm: Watermarks, start: int, ts: int) -> int | None:
    """The first record at or after `start` whose effective timestamp is >= ts (the high watermark
    at the end); None when that takes more than WALK_LIMIT records."""
    offset = start
    for _ in range(WALK_LIMIT):
        record = probe.first_at_or_after(partition, offset) if offset < wm.high else None
        if record is None:
            return wm.high
        if effective_timestamp(probe, partition, wm, record) >= ts:
            return record[0]
        offset = record[0] + 1
    return None


def _bisect(probe: Probe, partition: int, wm: Watermarks, ts: int) -> int:
    """A record offset where effective timestamps reach ts (the first one when they are ordered)."""
    lo, hi = wm.low, wm.high
    while lo < hi:
        mid = (lo + hi) // 2
        found = probe.first_at_or_after(partition, mid)
        if found is None or found[0] >= hi:
            hi = mid
        elif effective_timestamp(probe, partition, wm, found) >= ts:
            hi = mid
        else:
            lo = found[0] + 1
    found = probe.first_at_or_after(partition, lo) if lo < wm.high else None
    return wm.high if found is None else found[0]


def _walk_back(probe: Probe, partition: int, wm: Watermarks, offset: int, ts: int) -> int:
    """The earliest qualifying record among the WALK_LIMIT records before `offset` (a bisection
    can step over a record that qualifies when a late record sits on a probe point)."""
    earliest, at = offset, offset
    for _ in range(WALK_LIMIT):
        before = _last_before(probe, partition, wm, at) if at > wm.low else None
        if before is None:
            break
        if effective_timestamp(probe, partition, wm, before) >= ts:
            earliest = before[0]
        at = before[0]
    return earliest


def _last_before(probe: Probe, partition: int, wm: Watermarks, offset: int) -> Record | None:
    """The last record before `offset` (walks back over gaps, doubling the step)."""
    step = 1
    while offset - step >= wm.low:
        found = probe.first_at_or_after(partition, offset - step)
        if found is not None and found[0] < offset:
            # The step may have jumped over several records: take the last one before `offset`.
            while True:
                nxt = probe.first_at_or_after(partition, found[0] + 1)
                if nxt is None or nxt[0] >= offset:
                    return found
                found = nxt
        step *= 2
    found = probe.first_at_or_after(partition, wm.low)
    return found if found is not None and found[0] < offset else None
