"""What every stage shares: the progress log, timed stages and the frames a run keeps."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame

from dpone_dagster.engine.results import RunResult
from dpone_dagster.spark.keep import release_batch

Log = Callable[[str], None]


@contextmanager
def stage(result: RunResult, name: str, log: Log) -> Iterator[None]:
    """Time a stage into result.timings and say when it starts and ends ("load: started")."""
    started = time.perf_counter()
    log(f"{name}: started")
    try:
        yield
    finally:
        result.timings[name] = round(time.perf_counter() - started, 3)
        log(f"{name}: {result.timings[name]}s")


class KeptFrames:
    """Frames persisted on the way (the batch, de-duplication winners, measured messages); the
    producer tasks read them, so they are released only when the run is done with them."""

    def __init__(self) -> None:
        self._frames: list[DataFrame] = []

    def add(self, frame: DataFrame) -> DataFrame:
        self._frames.append(frame)
        return frame

    def release(self, frame: DataFrame) -> None:
        self._frames = [f for f in self._frames if f is not frame]
        release_batch(frame)

    def release_all(self) -> None:
        while self._frames:
            release_batch(self._frames.pop())
