"""What a run holds exclusively while it runs, so two runs never read and commit the same offsets.

A Kafka source's offsets belong to its topic and consumer group, not to the pipeline: two
manifests that read one topic with one `group_id` share them, so they share a lock (in the state
store) and a Dagster pool (the queue lets one of them run at a time). Every run also holds its
pipeline's own lock (its runs and watermarks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpone_dagster.manifest.models import KafkaSource, Manifest


@dataclass(frozen=True)
class RunLock:
    key: str  # the state store's lock name
    holder: str  # what another run holding it is doing, for the error message


def run_locks(manifest: Manifest) -> list[RunLock]:
    locks = [RunLock(manifest.name, f"pipeline '{manifest.name}'")]
    source = manifest.source
    if isinstance(source, KafkaSource) and source.topic:
        from dpone_dagster.sources.kafka import default_group_id

        group = default_group_id(manifest)
        locks.append(RunLock(f"kafka:{source.topic}:{group}", f"topic '{source.topic}' with consumer group '{group}'"))
    return locks


def dagster_pool(manifest: Manifest) -> str:
    """The Dagster pool of the manifest's asset: its shared offsets when it has any, else its name."""
    key = run_locks(manifest)[-1].key
    return "dpone_" + re.sub(r"[^A-Za-z0-9_.-]", "_", key)
