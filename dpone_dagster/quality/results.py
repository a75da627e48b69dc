"""The outcome of one quality check, and the stable names checks are known by.

A `CheckResult` is what a gate reports: the engine decides from `failed_gates` whether to stop, the
Dagster adapter turns each result into an asset check evaluation and the run artifact stores
`as_dict()`. Check names become Dagster asset check names, so they only ever hold [A-Za-z0-9_].
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal

from dpone_dagster.errors import ConfigError

Phase = Literal["pre_publish", "post_publish"]
Severity = Literal["fail", "warn"]
SEVERITIES: tuple[str, ...] = ("fail", "warn")

_NAME_OK = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class CheckResult:
    name: str
    check_type: str
    phase: Phase
    passed: bool
    severity: Severity
    observed: float | int | str | None
    threshold: str | float | int | None
    description: str
    # Up to 5 offending rows (payload columns only), values as Spark returned them.
    failing_sample: tuple[dict, ...] = ()
    # Not evaluated (e.g. an empty batch); a skipped result always has passed=True.
    skipped: bool = False

    @property
    def blocks(self) -> bool:
        """True when this result must stop the run (a failed, evaluated check of severity fail)."""
        return not self.passed and not self.skipped and self.severity == "fail"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "check_type": self.check_type,
            "phase": self.phase,
            "passed": self.passed,
            "severity": self.severity,
            "skipped": self.skipped,
            "observed": json_safe(self.observed),
            "threshold": json_safe(self.threshold),
            "description": self.description,
            "failing_sample": [json_safe(row) for row in self.failing_sample],
        }


def failed_gates(results: Sequence[CheckResult]) -> list[CheckResult]:
    """The results that must stop the run: passed False, severity fail and not skipped."""
    return [r for r in results if r.blocks]


def severity_for(mode: str) -> Severity:
    """quality.mode -> the severity of every check of the manifest."""
    if mode not in SEVERITIES:
        raise ConfigError(f"quality.mode: {mode!r} is not one of {', '.join(SEVERITIES)}")
    return mode  # type: ignore[return-value]


# --------------------------------------------------------------------------- names


def _slug(text: str) -> str:
    """Any text -> [A-Za-z0-9_] with runs of '_' collapsed and no leading/trailing '_'."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", text)).strip("_")


def _ge_columns(kwargs: Mapping[str, Any]) -> list[str]:
    if kwargs.get("column"):
        return [str(kwargs["column"])]
    if kwargs.get("column_A") and kwargs.get("column_B"):
        return [str(kwargs["column_A"]), str(kwargs["column_B"])]
    column_list = kwargs.get("column_list")
    if isinstance(column_list, list | tuple):
        return [str(c) for c in column_list]
    return []


def check_name(check: Any, index: int) -> str:
    """The stable name of `check` (the manifest's index-th check) — its Dagster asset check name.

    An explicit `name` wins and must already be [A-Za-z0-9_]+ (ConfigError otherwise). Defaults:
    min_rows, source_target_count, not_null_<cols>, unique_<cols>, accepted_values_<column>,
    freshness (freshness_<column> for an explicit column), ge_<expectation_type>[_<column(s)>], with
    `_extracted` appended for a check of `stage: extracted`;
    column names are reduced to [A-Za-z0-9_] (`__dpone__x` -> `dpone_x`). A default that reduces to
    nothing becomes `check_<index>`. Two checks can share a default name; `check_names` resolves that.
    """
    explicit = getattr(check, "name", None)
    if explicit is not None:
        if not _NAME_OK.fullmatch(explicit):
            raise ConfigError(
                f"quality.checks[{index}].name: {explicit!r} may only contain letters, digits and "
                "underscores (it becomes the Dagster asset check name)"
            )
        return explicit
    check_type = getattr(check, "type", "")
    if check_type in ("not_null", "unique"):
        parts = [check_type, *check.columns]
    elif check_type == "accepted_values":
        parts = [check_type, check.column]
    elif check_type == "freshness":
        parts = [check_type, *([check.column] if check.column else [])]
    elif check_type == "great_expectations":
        parts = ["ge", check.expectation_type, *_ge_columns(check.kwargs)]
    else:  # min_rows, source_target_count
        parts = [check_type]
    if getattr(check, "stage", "published") == "extracted":
        parts.append("extracted")  # judged before de-duplication: the name says so
    name = "_".join(s for s in (_slug(str(p)) for p in parts) if s)
    return name or f"check_{index}"


def check_names(checks: Sequence[Any]) -> list[str]:
    """Names of every check of a manifest, in order and unique: a default name that another check
    already uses gets `_<index>` appended (an explicit duplicate name is a ConfigError)."""
    names: list[str] = []
    seen: set[str] = set()
    for index, check in enumerate(checks):
        name = check_name(check, index)
        if name in seen:
            if getattr(check, "name", None) is not None:
                raise ConfigError(
                    f"quality.checks[{index}].name: {name!r} is used by another check; check names must be unique"
                )
            name = f"{name}_{index}"
        seen.add(name)
        names.append(name)
    return names


# --------------------------------------------------------------------------- JSON


def json_safe(value: Any) -> Any:
    """`value` with datetimes, decimals, bytes, sets and non-finite floats made JSON-serializable."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)  # exact (decimal(38,18) does not fit a float); NaN/Infinity stay text too
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if hasattr(value, "asDict"):  # pyspark Row
        return json_safe(value.asDict(recursive=True))
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    return str(value)
