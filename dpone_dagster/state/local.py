"""Embedded state store (no database): JSON files under one directory.

Layout under `path`:
  state.json             offsets (per group_id/topic/partition), time windows' offset ranges (per
                         group_id/topic/window), watermarks and the last committed success run of
                         each pipeline. Replaced atomically (temp file + fsync +
                         os.replace), so offsets, watermark and success status land in ONE commit.
  state.lock             flock taken around every read-modify-write of state.json and the run logs.
  runs/<pipeline>.jsonl  append-only run history; the last line of a run_id wins.
  locks/<pipeline>.lock  pipeline run locks (try_lock/unlock).

A crash after the state.json replace but before the log append loses nothing: state.json's
last success overrides the log when runs are read, and is re-appended before it is overwritten.
Offsets are keyed by (group_id, topic), like in PostgreSQL, which is why they share one state file
instead of living in a file per pipeline.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from dpone_dagster.errors import ConfigError
from dpone_dagster.state.base import (
    RunRecord,
    StateConflict,
    check_offsets,
    check_windows,
    dumps,
    finished,
    utcnow,
)

log = logging.getLogger(__name__)

STATE_VERSION = 1


def _empty_state() -> dict[str, Any]:
    return {"version": STATE_VERSION, "offsets": {}, "watermarks": {}, "windows": {}, "last_success": {}}


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable, not only the file contents.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def append_line(path: Path, line: str) -> None:
    with open(path, "a+b") as handle:
        # A crash mid-append leaves a partial last line; start on a fresh line so ours stays valid.
        if handle.seek(0, os.SEEK_END) > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        handle.write(line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def _file_name(pipeline: str, suffix: str) -> str:
    return quote(pipeline, safe="") + suffix


class LocalStateStore:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._root = Path(path).absolute()
        for directory in (self._root, self._root / "runs", self._root / "locks"):
            directory.mkdir(parents=True, exist_ok=True)
        self._state_path = self._root / "state.json"
        self._held: dict[str, TextIO] = {}

    # ------------------------------------------------------------------ plumbing

    def _read_state(self) -> dict[str, Any]:
        try:
            text = self._state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _empty_state()
        try:
            return {**_empty_state(), **json.loads(text)}
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{self._state_path}: state file is not valid JSON ({exc}); restore it from a backup, "
                "or delete it to start over (Kafka sources then re-read from the earliest offset)"
            ) from exc

    def _write_state(self, state: dict[str, Any]) -> None:
        text = dumps(state)  # serialise first: a value that cannot be written leaves the file as is
        atomic_write_text(self._state_path, text)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Serialise read-modify-write across threads, stores and processes sharing `path`."""
        with open(self._root / "state.lock", "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _runs_path(self, pipeline: str) -> Path:
        return self._root / "runs" / _file_name(pipeline, ".jsonl")

    def _append_run(self, record: RunRecord) -> None:
        append_line(self._runs_path(record.pipeline), dumps(record.to_json()))

    def _runs(self, pipeline: str, state: dict[str, Any]) -> dict[str, RunRecord]:
        """Current record of every run of `pipeline`, in log order."""
        runs: dict[str, RunRecord] = {}
        try:
            lines = self._runs_path(pipeline).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                record = RunRecord.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash mid-append
            runs[record.run_id] = record
        committed = state["last_success"].get(pipeline)
        if committed:
            record = RunRecord.from_json(committed)
            runs[record.run_id] = record  # the committed success is authoritative
        return runs

    # ------------------------------------------------------------------ offsets

    def load_offsets(self, topic: str, group_id: str) -> dict[int, int]:
        return self._offsets_in(self._read_state(), topic, group_id)

    @staticmethod
    def _offsets_in(state: dict[str, Any], topic: str, group_id: str) -> dict[int, int]:
        stored = state["offsets"].get(group_id, {}).get(topic, {})
        return {int(partition): int(entry["offset"]) for partition, entry in stored.items()}

    @staticmethod
    def _set_offsets(
        state: dict[str, Any], topic: str, group_id: str, offsets: dict[int, int], run_id: str | None
    ) -> None:
        topics = state["offsets"].setdefault(group_id, {})
        partitions = topics.setdefault(topic, {})
        now = utcnow().isoformat()
        for partition, offset in offsets.items():
            partitions[str(int(partition))] = {"offset": int(offset), "run_id": run_id, "updated_at": now}

    def reset_offsets(self, topic: str, group_id: str, offsets: dict[int, int] | None) -> None:
        check_offsets(topic, group_id, offsets)
        with self._exclusive():
            state = self._read_state()
            topics = state["offsets"].get(group_id, {})
            topics.pop(topic, None)
            if offsets:
                self._set_offsets(state, topic, group_id, offsets, run_id=None)
            elif not topics:
                state["offsets"].pop(group_id, None)
            self._write_state(state)

    # ------------------------------------------------------------------ watermarks

    def load_watermark(self, pipeline: str) -> dict[str, Any] | None:
        entry = self._read_state()["watermarks"].get(pipeline)
        return entry["value"] if entry else None

    # ------------------------------------------------------------------ time windows

    def load_windows(self, topic: str, group_id: str) -> dict[str, dict[str, Any]]:
        return dict(self._read_state()["windows"].get(group_id, {}).get(topic, {}))

    @staticmethod
    def _add_windows(state: dict[str, Any], topic: str, group_id: str, windows: dict[str, dict[str, Any]]) -> None:
        stored = state["windows"].setdefault(group_id, {}).setdefault(topic, {})
        for key, entry in windows.items():
            kept = stored.setdefault(key, {**entry, "partitions": {}})
            for partition, offsets in entry["partitions"].items():
                kept["partitions"].setdefault(partition, offsets)  # the first run's ranges stay

    # ------------------------------------------------------------------ runs

    def start_run(self, record: RunRecord) -> None:
        with self._exclusive():
            if record.run_id in self._runs(record.pipeline, self._read_state()):
                raise StateConflict(f"run {record.run_id} already exists in the state store")
            self._append_run(replace(record, status="running", finished_at=None, error=None))

    def finish_run_success(
        self,
        record: RunRecord,
        topic: str | None,
        group_id: str | None,
        offsets: dict[int, int] | None,
        watermark: dict[str, Any] | None = None,
        windows: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        check_offsets(topic, group_id, offsets)
        check_windows(topic, group_id, windows)
        success = finished(record, "success")
        with self._exclusive():
            state = self._read_state()
            runs = self._runs(record.pipeline, state)
            current = runs.get(record.run_id)
            if current is not None and current.status != "running":
                raise StateConflict(
                    f"run {record.run_id} already {current.status}; refusing to commit its offsets/watermark"
                )
            self._keep_previous_success(state, record.pipeline, runs)
            if offsets:
                self._set_offsets(state, topic, group_id, offsets, record.run_id)  # type: ignore[arg-type]
            if windows:
                self._add_windows(state, topic, group_id, windows)  # type: ignore[arg-type]
            if watermark is not None:
                state["watermarks"][record.pipeline] = {
                    "value": watermark,
                    "run_id": record.run_id,
                    "updated_at": utcnow().isoformat(),
                }
            state["last_success"][record.pipeline] = success.to_json()
            self._write_state(state)  # the commit point
            self._append_run(success)  # history only; state.json already says success

    def advance_offsets(self, record: RunRecord, topic: str, group_id: str, offsets: dict[int, int]) -> None:
        check_offsets(topic, group_id, offsets)
        with self._exclusive():
            state = self._read_state()
            current = self._runs(record.pipeline, state).get(record.run_id)
            if current is None or current.status != "running":
                raise StateConflict(f"run {record.run_id} is not running; refusing to advance its offsets")
            stored = self._offsets_in(state, topic, group_id)
            forward = {p: o for p, o in offsets.items() if o > stored.get(p, -1)}
            if forward:
                self._set_offsets(state, topic, group_id, forward, record.run_id)
                self._write_state(state)

    def _keep_previous_success(
        self, state: dict[str, Any], pipeline: str, runs: dict[str, RunRecord]
    ) -> None:
        """Re-append the committed success about to be replaced if a crash kept it out of the log."""
        committed = state["last_success"].get(pipeline)
        if not committed:
            return
        logged = self._runs(pipeline, _empty_state()).get(committed["run_id"])
        if logged is None or logged.status != "success":
            self._append_run(runs[committed["run_id"]])

    def finish_run_failed(self, record: RunRecord) -> None:
        with self._exclusive():
            current = self._runs(record.pipeline, self._read_state()).get(record.run_id)
            if current is not None and current.status == "success":
                log.warning("run %s already committed as success; not marking it failed", record.run_id)
                return
            self._append_run(finished(record, "failed"))

    def list_runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        runs = self._runs(pipeline, self._read_state()).values()
        ordered = sorted(runs, key=lambda r: (r.started_at, r.run_id), reverse=True)
        return ordered[:limit]

    # ------------------------------------------------------------------ locks

    def try_lock(self, pipeline: str) -> bool:
        if pipeline in self._held:
            return True
        handle = open(self._root / "locks" / _file_name(pipeline, ".lock"), "a+")
        try:
            # flock belongs to this open file description: another store, even in this process,
            # opens its own and is refused until we unlock or close.
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._held[pipeline] = handle
        return True

    def unlock(self, pipeline: str) -> None:
        handle = self._held.pop(pipeline, None)
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict[str, Any]:
        return {"type": "local", "path": str(self._root)}

    def close(self) -> None:
        for pipeline in list(self._held):
            self.unlock(pipeline)
