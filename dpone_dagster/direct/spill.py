"""The files the direct paths keep their messages in, on the host of the task that wrote them:
one directory per run under the Spark local directory, files written whole or not at all, and
the sweep of what killed runs left."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pyarrow as pa
import pyarrow.ipc as ipc

SPILL_PREFIX = "dpone-direct-"
STALE_SPILL_S = 6 * 3600  # another run's spill directory untouched this long is left over


def run_directory(run_id: str) -> str:
    """The run's directory of kept messages on this host (both direct paths)."""
    return os.path.join(spill_root(), f"{SPILL_PREFIX}{run_id}")


def spill_root() -> str:
    return os.environ.get("SPARK_LOCAL_DIRS", tempfile.gettempdir()).split(",")[0]


def sweep_stale_spills(run_id: str, now: float | None = None) -> int:
    """Remove the spill directories of other runs left untouched for STALE_SPILL_S (a driver killed
    mid-run leaves its files, and a killed worker its `.partial` file): on a long-lived executor
    (a Spark Connect server) they would pile up. A produce task that finds its file gone reads
    the slice again, so removing a live run's file costs a read, never a message (a SQL run's
    produce task fails instead, before its watermark moves). Returns how many directories went."""
    root = spill_root()
    now = time.time() if now is None else now
    mine = os.path.basename(run_directory(run_id))
    removed = 0
    try:
        names = [n for n in os.listdir(root) if n.startswith(SPILL_PREFIX) and n != mine]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(root, name)
        try:
            if now - os.stat(path).st_mtime < STALE_SPILL_S:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


class SpillWriter:
    """An Arrow IPC file written under a temporary name and renamed when complete, so a produce
    task never reads a half-written slice (a scan task killed mid-way leaves no file behind)."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema  # of an empty file
        self._partial = f"{path}.{os.getpid()}.partial"
        self._writer: ipc.RecordBatchFileWriter | None = None

    def __enter__(self) -> SpillWriter:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = ipc.new_file(self._partial, batch.schema)
        self._writer.write_batch(batch)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self._writer is None:
            if kind is None:  # an empty slice: an empty file says it was read
                ipc.new_file(self._partial, self.schema).close()
                os.replace(self._partial, self.path)
            return
        self._writer.close()
        if kind is None:
            os.replace(self._partial, self.path)
        else:
            remove_file(self._partial)


def remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
