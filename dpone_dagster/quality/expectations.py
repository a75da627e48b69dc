"""Run one Great Expectations expectation against a Spark DataFrame (great-expectations 1.x).

Path used (verified against great-expectations 1.24 and PySpark 4.3, classic session): one process-wide
ephemeral data context (in-memory stores, analytics off, progress bars off) with a Spark data source
(`data_sources.add_spark(persist=False)`), a dataframe asset and a whole-dataframe batch definition.
Each call passes the DataFrame as a batch parameter and calls `batch.validate(expectation)`, so the
metrics are computed by Spark on the executors; nothing is collected to the driver except GE's
aggregates and its partial unexpected list (at most 5 values). `persist=False` because the engine
already persists the staged batch, and GE never unpersists what it persists.

The expectation is looked up by its snake_case type (`expect_column_values_to_be_between`) in GE's
expectation registry and built with the manifest's kwargs; an unknown type or invalid kwargs is a
ConfigError naming the type. `validate_expectation` does this without data (for manifest checks).
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame

from dpone_dagster.errors import ConfigError
from dpone_dagster.quality.results import CheckResult, Phase, Severity

SAMPLE_SIZE = 5
_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_SIZE}
# Logger names whose INFO/WARNING chatter is not ours to print in a run log.
_NOISY_LOGGERS = ("great_expectations", "py4j")

_lock = threading.RLock()  # also serializes validations: GE's context is not documented thread-safe
_batch_definition: Any = None


def _quiet() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _gx_batch_definition() -> Any:
    """The process-wide whole-dataframe batch definition (created on first use; thread-safe)."""
    global _batch_definition
    with _lock:
        if _batch_definition is None:
            _quiet()
            import great_expectations as gx
            from great_expectations.data_context.types.base import (
                DataContextConfig,
                InMemoryStoreBackendDefaults,
                ProgressBarsConfig,
            )

            config = DataContextConfig(
                store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
                analytics_enabled=False,
                progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
            )
            context = gx.get_context(mode="ephemeral", project_config=config)
            source = context.data_sources.add_spark(name="dpone", persist=False)
            asset = source.add_dataframe_asset(name="batch")
            _batch_definition = asset.add_batch_definition_whole_dataframe("whole_batch")
        return _batch_definition


def expectation_types() -> list[str]:
    """Every expectation type GE has registered (core ones included), sorted."""
    _quiet()
    from great_expectations.expectations.registry import (
        list_registered_expectation_implementations,
        register_core_expectations,
    )

    register_core_expectations()
    return sorted(n for n in list_registered_expectation_implementations() if n.startswith("expect_"))


def build_expectation(expectation_type: str, kwargs: Mapping[str, Any]) -> Any:
    """The GE Expectation object for `expectation_type` with `kwargs` (ConfigError when unknown/invalid)."""
    _quiet()
    import great_expectations.exceptions as gx_exceptions
    from great_expectations.expectations.registry import get_expectation_impl, register_core_expectations

    register_core_expectations()
    try:
        if not expectation_type.startswith("expect_"):
            raise gx_exceptions.ExpectationNotFoundError(expectation_type)
        cls = get_expectation_impl(expectation_type)
    except gx_exceptions.ExpectationNotFoundError:
        close = difflib.get_close_matches(expectation_type, expectation_types(), n=3, cutoff=0.75)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"great_expectations check: unknown expectation_type {expectation_type!r}; use a Great "
            f"Expectations 1.x expectation name such as expect_column_values_to_be_between.{hint}"
        ) from None
    try:
        return cls(**dict(kwargs))
    except Exception as exc:  # pydantic ValidationError, TypeError: the kwargs do not fit the expectation
        raise ConfigError(
            f"great_expectations check {expectation_type}: invalid kwargs {sorted(kwargs)}: {_compact(exc)}"
        ) from None


def validate_expectation(expectation_type: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ConfigError if the expectation cannot be built (no data needed; for `dpone validate`)."""
    build_expectation(expectation_type, kwargs)


def run_expectation(
    df: DataFrame,
    expectation_type: str,
    kwargs: Mapping[str, Any],
    *,
    name: str,
    severity: Severity,
    phase: Phase = "pre_publish",
) -> CheckResult:
    """Validate `df` against one expectation and map GE's result onto a CheckResult.

    observed: unexpected_count for column-map expectations, else GE's observed_value (numbers kept,
    anything else as text). failing_sample: up to 5 values of partial_unexpected_list as
    {column: value} rows. An expectation GE fails to evaluate (exception_info) fails the check.
    """
    expectation = build_expectation(expectation_type, kwargs)
    for column in _columns(kwargs):
        if column not in df.columns:
            raise ConfigError(
                f"quality check {name}: column {column!r} of {expectation_type} is not in the batch "
                f"(columns: {', '.join(df.columns)})"
            )
    with _lock:
        batch = _gx_batch_definition().get_batch(batch_parameters={"dataframe": df})
        result = batch.validate(expectation, result_format=_RESULT_FORMAT)
    return to_check_result(result.to_json_dict(), kwargs, name=name, severity=severity, phase=phase)


def to_check_result(
    result: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    *,
    name: str,
    severity: Severity,
    phase: Phase = "pre_publish",
) -> CheckResult:
    """Map a GE ExpectationValidationResult (as its JSON dict) onto a CheckResult."""
    config = result.get("expectation_config") or {}
    expectation_type = str(config.get("type") or config.get("expectation_type") or "expectation")
    details = result.get("result") or {}
    exception = result.get("exception_info") or {}
    threshold = _threshold(kwargs)
    if exception.get("raised_exception"):
        message = _first_line(exception.get("exception_message") or "unknown error")
        return CheckResult(
            name=name,
            check_type="great_expectations",
            phase=phase,
            passed=False,
            severity=severity,
            observed=None,
            threshold=threshold,
            description=f"{expectation_type}: Great Expectations could not evaluate it: {message}",
        )
    passed = bool(result.get("success"))
    if "unexpected_count" in details:
        observed: float | int | str | None = int(details["unexpected_count"] or 0)
        total = details.get("element_count")
        what = f"{observed} unexpected value(s)" + (f" of {total} row(s)" if total is not None else "")
        if details.get("missing_count"):
            what += f" ({details['missing_count']} null(s) not evaluated)"
    else:
        observed = _scalar(details.get("observed_value"))
        what = f"observed value {observed!r}"
    column = _columns(kwargs)[0] if len(_columns(kwargs)) == 1 else "value"
    sample = tuple({column: value} for value in (details.get("partial_unexpected_list") or [])[:SAMPLE_SIZE])
    verdict = "passed" if passed else "failed"
    return CheckResult(
        name=name,
        check_type="great_expectations",
        phase=phase,
        passed=passed,
        severity=severity,
        observed=observed,
        threshold=threshold,
        description=f"{expectation_type}({threshold or ''}) {verdict}: {what}",
        failing_sample=() if passed else sample,
    )


def _columns(kwargs: Mapping[str, Any]) -> list[str]:
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if isinstance(kwargs.get(k), str)]
    if isinstance(kwargs.get("column_list"), list | tuple):
        columns += [c for c in kwargs["column_list"] if isinstance(c, str)]
    return columns


def _threshold(kwargs: Mapping[str, Any]) -> str | None:
    shown = {k: v for k, v in kwargs.items() if k not in ("column", "column_A", "column_B", "column_list")}
    return ", ".join(f"{k}={v!r}" for k, v in sorted(shown.items())) or None


def _scalar(value: Any) -> float | int | str | None:
    if value is None or isinstance(value, int | float | str):
        return value
    return str(value)


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _compact(exc: object, limit: int = 400) -> str:
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
