"""A read-only description of what a run of a manifest would do (`dpone plan`).

When the broker is reachable the plan carries the concrete per-partition offsets a run would
read now; otherwise it says why they are missing. Nothing is produced and no state is written.
Every value of the plan passes through `redact.redact_mapping` (credential-named settings, URL and
DSN credentials and known secrets masked) before it is returned or rendered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpone_dagster.connections import resolve_kafka
from dpone_dagster.errors import DponeError
from dpone_dagster.kafka.config import effective_producer_settings
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.redact import redact_mapping, redact_text
from dpone_dagster.sources.kafka import KafkaBatchSource, default_group_id


def build_plan(manifest: Manifest, probe: bool = True) -> dict[str, Any]:
    plan: dict[str, Any] = {
        "name": manifest.name,
        "source": _source_section(manifest),
        "sink": _sink_section(manifest, probe),
        "schema_evolution": _schema_section(manifest),
        "state": _state_section(manifest),
        "quality": {
            "mode": manifest.quality.mode,
            "checks": [c.model_dump(exclude_none=True) for c in manifest.quality.checks],
            "when": "pre-publish gates on the staged batch; source_target_count after delivery",
        },
        "observability": manifest.observability.model_dump(),
    }
    if probe and isinstance(manifest.source, KafkaSource):
        plan["source"]["boundary"] = _probe_boundary(manifest)
    return redact_mapping(plan)


def _source_section(manifest: Manifest) -> dict[str, Any]:
    source = manifest.source
    if isinstance(source, KafkaSource):
        o = source.options
        return {
            "type": "kafka",
            "connection_id": source.connection_id,
            "connection_type": source.connection_type,
            "topic": source.topic,
            "read_mode": o.read_mode,
            "start_from": o.start_from,
            "offset_storage": o.offset_storage,
            "group_id": default_group_id(manifest),
            "message_format": o.message_format,
            "envelope": o.envelope,
            "records_per_task": o.records_per_task,
            "max_records": o.max_records,
            "boundary_method": _boundary_method(manifest),
        }
    return {
        "type": source.type,
        "connection_id": source.connection_id,
        "table": source.table.qualified,
        **source.options.model_dump(exclude_none=True),
    }


def _boundary_method(manifest: Manifest) -> str:
    source = manifest.source
    assert isinstance(source, KafkaSource)
    o = source.options
    if o.read_mode == "time_window":
        return "timestamp lookup per partition: [first offset with ts >= start, first offset with ts >= end)"
    start = {"stored": "stored offset (earliest when none)", "earliest": "log start", "latest": "high watermark"}[
        o.start_from
    ]
    if manifest.sink.strategy.mode in ("full_refresh", "replace") and o.start_from == "stored":
        start = "log start (full_refresh/replace ignore stored offsets)"
    end = "end a read_committed reader reaches (last stable offset: an open transaction's records wait), verified by a fetch and fixed before reading"
    if o.read_mode == "max_records":
        end += f", capped at {o.max_records} offsets shared across partitions"
    return f"[{start}, {end})"


def _sink_section(manifest: Manifest, probe: bool = False) -> dict[str, Any]:
    sink = manifest.sink
    o = sink.options
    settings = effective_producer_settings(manifest, _sink_client_config(manifest) if probe else {})
    return {
        "topic": sink.topic,
        "connection_id": sink.connection_id,
        "strategy": sink.strategy.model_dump(exclude_none=True),
        "key": o.key.model_dump(),
        "envelope": o.envelope,
        "message_format": o.message_format,
        "delivery": {"mode": o.delivery.mode, "producer": settings},
        "deletes": o.deletes.model_dump(),
        "headers": o.headers.model_dump(),
        "create_topic": _creation(o.create_topic.model_dump()),
        **({"replication": _replication_section(manifest)} if o.delivery.mode == "exactly_once" else {}),
    }


def _replication_section(manifest: Manifest) -> dict[str, Any]:
    from dpone_dagster.replication.control_topic import commit_group_of

    replication = manifest.sink.options.replication
    control = replication.control_topic
    group = commit_group_of(manifest)
    return {
        **replication.model_dump(exclude={"control_topic"}),
        "control_topic": _creation({**control.model_dump(), "commit_group": group}),
        "transactional_ids": f"dpone:{group}:<source topic>:<partition> (one per source partition: "
        "any other run committing this commit group's offsets is fenced)",
    }


def _creation(settings: dict[str, Any]) -> dict[str, Any]:
    """Topic creation settings, with what replication_factor -1 means spelled out."""
    if settings.get("replication_factor") == -1:
        settings = {**settings, "replication_factor": "-1 (the cluster's default.replication.factor)"}
    return settings


def _schema_section(manifest: Manifest) -> dict[str, Any]:
    o = manifest.sink.options
    return {
        "enabled": o.schema_evolution,
        "schema_registry": o.schema_registry.model_dump(exclude_none=True),
        "on_type_change": o.on_type_change,
        "target": "Schema Registry subject" if o.schema_registry.enabled else "no registry: target side is a no-op",
    }


def _state_section(manifest: Manifest) -> dict[str, Any]:
    state = manifest.state
    if state.type == "local":
        return {"type": "local", "path": state.path}
    return {
        "type": "postgres",
        "connection_id": state.connection_id,
        "runs_table": state.table.qualified,
        "offsets_table": state.offsets_table.qualified,
        "advances": "only after every delivery succeeded and fail-mode gates passed",
    }


def _probe_boundary(manifest: Manifest) -> dict[str, Any]:
    try:
        from dpone_dagster.engine.offsets import OffsetStorage
        from dpone_dagster.state.open import open_manifest_state_store

        source = KafkaBatchSource(manifest, resolve_kafka(manifest.source).client_config())
        state = manifest.state
        if source.options.offset_storage == "dpone" and state.type == "local" and not Path(state.path).exists():
            stored: dict[int, int] = {}  # nothing stored yet; opening the store would create its directory
        else:
            store = open_manifest_state_store(manifest)
            try:
                stored = OffsetStorage(manifest, store, source.client_config, source.group_id).load()
            finally:
                store.close()
        return {"reachable": True, **source.plan(stored).as_dict()}
    except DponeError as exc:
        return {"reachable": False, "reason": str(exc)}
    except Exception as exc:  # broker down, DNS, auth: the plan still renders
        return {"reachable": False, "reason": f"{type(exc).__name__}: {exc}"}


def _sink_client_config(manifest: Manifest) -> dict[str, Any]:
    """The sink connection's settings, so the plan shows what they override; none when they
    cannot be resolved (the plan still renders)."""
    try:
        return resolve_kafka(manifest.sink).client_config()
    except Exception:
        return {}


def render_markdown(plan: dict[str, Any]) -> str:
    lines = [f"# Plan: {plan['name']}", ""]
    for section in ("source", "sink", "schema_evolution", "state", "quality", "observability"):
        lines.append(f"## {section.replace('_', ' ').title()}")
        lines.append("")
        for key, value in plan[section].items():
            if key == "boundary":
                continue
            shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
            lines.append(f"- **{key}**: `{shown}`")
        if section == "source" and "boundary" in plan[section]:
            lines += ["", *_boundary_markdown(plan[section]["boundary"])]
        lines.append("")
    return redact_text("\n".join(lines))


def _boundary_markdown(boundary: dict[str, Any]) -> list[str]:
    if not boundary.get("reachable"):
        return [f"Boundary: not resolved ({boundary.get('reason')})"]
    rows = ["| partition | start | end | offsets |", "|---:|---:|---:|---:|"]
    for p in boundary["partitions"]:
        rows.append(f"| {p['partition']} | {p['start']} | {p['end']} | {p['end'] - p['start']} |")
    notes = [f"- {n}" for n in boundary.get("notes", [])]
    return [f"Boundary now ({boundary['method']}, {boundary['offsets_in_range']} offsets):", "", *rows, *notes]
