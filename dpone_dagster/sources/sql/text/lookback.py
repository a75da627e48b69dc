"""`lookback`: the stored watermark moved back by a number or a duration, in the watermark's own
representation (no database involved)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from dpone_dagster.sources.sql.text.literals import ISO_TS, iso_timestamp

_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: str | int | float) -> timedelta:
    """Seconds (number or numeric text) or an ISO-8601 duration without years/months (PT15M, P1DT2H)."""
    if isinstance(value, bool):
        raise ValueError("a lookback duration cannot be a boolean")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    text = value.strip().upper()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    match = _DURATION.match(text)
    if not match or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(
            f"lookback {value!r} is not a number of seconds or an ISO-8601 duration such as PT15M, "
            "PT1H or P1D (years and months are ambiguous and not accepted)"
        )
    parts = {name: float(part) for name, part in match.groupdict().items() if part}
    return timedelta(**parts)


def parse_timestamp(text: str) -> datetime:
    """A stored ISO timestamp as a naive datetime (fraction truncated to microseconds)."""
    text = re.sub(r"(?:Z|[+-]00:?00)$", "", str(text)).replace(" ", "T")
    match = ISO_TS.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an ISO-8601 timestamp")
    head, _, fraction = text.partition(".")
    if fraction:
        head += "." + (fraction + "000000")[:6]
    return datetime.fromisoformat(head)


def apply_lookback(kind: str, value: Any, lookback: str | int | float | None) -> Any:
    """The lower bound `value - lookback` in the watermark's own representation."""
    if lookback is None or value is None:
        return value
    if kind == "integer":
        if isinstance(lookback, bool) or not re.fullmatch(r"\d+", str(lookback).strip()):
            raise ValueError(f"lookback {lookback!r} must be a whole number for an integer column")
        return int(value) - int(str(lookback).strip())
    if kind in ("decimal", "float"):
        try:
            amount = Decimal(str(lookback).strip())
        except InvalidOperation:
            raise ValueError(f"lookback {lookback!r} must be a number for a numeric column") from None
        return format(Decimal(str(value)) - amount, "f")
    if kind in ("timestamp", "timestamp_tz"):
        return iso_timestamp(parse_timestamp(str(value)) - parse_duration(lookback))
    if kind == "date":
        delta = parse_duration(lookback)
        start = datetime.fromisoformat(str(value)) - delta
        return start.date().isoformat()  # floor: a wider window, never a narrower one
    raise ValueError(f"lookback is not supported for a {kind} watermark column")
