"""Candidate engine changes swapped in for one run (`variant`), by name: the list is in
bench/experiments.py. Used by `python -m bench.experiments` and `bench.k2k --compare-variant`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch


@contextmanager
def _swap(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextmanager
def variant(name: str, spark: Any) -> Iterator[dict[str, Any]]:
    """Apply a '+'-joined variant; yields the run_engine keyword overrides it needs."""
    from dpone_dagster.engine.stages import shape as shape_stage

    kwargs: dict[str, Any] = {"source_options": {}, "delivery": {}}
    with ExitStack() as stack:
        for part in name.split("+"):
            if part in ("baseline", ""):
                continue
            if part == "spark_sql":  # the engine's Spark SQL path instead of the direct path
                stack.enter_context(patch.dict(os.environ, {"DPONE_DIRECT_PATH": "off"}))
            elif part == "window":  # read_mode time_window: one window that holds every record
                kwargs["source_options"].update(
                    read_mode="time_window", start_timestamp="2000-01-01T00:00:00Z", end_timestamp="2100-01-01T00:00:00Z"
                )
            elif part == "window_dedupe":
                stack.enter_context(_swap(shape_stage, "BROADCAST_DEDUPE_KEYS", 0))
            elif part.startswith("conf:"):
                key, _, value = part[5:].partition("=")
                saved_v = spark.conf.get(key, None)
                spark.conf.set(key, value)
                stack.callback(lambda k=key, v=saved_v: spark.conf.unset(k) if v is None else spark.conf.set(k, v))
            elif part.startswith("rpt="):
                kwargs["source_options"]["records_per_task"] = int(part[4:])
            elif part.startswith("bs="):
                kwargs["source_options"]["batch_size"] = int(part[3:])
            elif part.startswith("sp"):
                saved = spark.conf.get("spark.sql.shuffle.partitions")
                spark.conf.set("spark.sql.shuffle.partitions", part[2:])
                stack.callback(spark.conf.set, "spark.sql.shuffle.partitions", saved)
            elif part.startswith("linger="):
                kwargs["delivery"]["linger_ms"] = int(part[7:])
            elif part.startswith("bsize="):
                kwargs["delivery"].setdefault("producer_config", {})["batch.size"] = int(part[6:])
            elif part.startswith("bnm="):
                kwargs["delivery"]["batch_num_messages"] = int(part[4:])
            else:
                raise SystemExit(f"unknown variant part: {part}")
        yield kwargs
