"""What one SQL run reads, fixed at plan time (retries read the same window)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dpone_dagster.sources.sql import text as T


@dataclass(frozen=True)
class SqlBoundary:
    """What one run reads, fixed before reading (retries read the same window)."""

    method: str  # full | incremental | cdc
    table: str
    column: str | None
    lower: Any
    lower_inclusive: bool
    upper: Any
    query: str
    total: int | None
    new_watermark: dict[str, Any] | None
    dialect: str = ""
    kind: str | None = None  # watermark kind (text.WatermarkKind) or "lsn"
    stored_watermark: dict[str, Any] | None = None
    empty: bool = False  # nothing to read (the query returns no rows)
    columns: tuple[T.ColumnInfo, ...] = ()  # payload columns as the catalog describes them
    extra_columns: tuple[T.ColumnInfo, ...] = ()  # read for ordering/partitioning, then dropped
    conditions: tuple[str, ...] = ()  # the WHERE conditions of `query` (partitioned/bcp reads reuse them)
    notes: tuple[str, ...] = ()
    upper_inclusive: bool = True  # False: `column < upper` (rowversion windows, see watermark)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["columns"] = [{"name": c.name, "type": c.data_type} for c in self.columns]
        data["extra_columns"] = [c.name for c in self.extra_columns]
        data["conditions"] = list(self.conditions)
        data["notes"] = list(self.notes)
        data["lower"] = _json_safe(self.lower)
        data["upper"] = _json_safe(self.upper)
        return data


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
