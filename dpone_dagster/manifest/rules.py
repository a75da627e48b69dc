"""Cross-field rules of a manifest: combinations that are each valid alone but not together.

Each rule returns `Problem`s naming the field path and the fix, so that the loader can report
all of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from dpone_dagster.manifest.models import KafkaSource, Manifest

REGISTRY_FORMATS = ("json_schema", "avro", "protobuf")


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def check_rules(manifest: Manifest) -> list[Problem]:
    problems: list[Problem] = []
    problems += _strategy_rules(manifest)
    problems += _key_and_delete_rules(manifest)
    problems += _registry_rules(manifest)
    problems += _source_rules(manifest)
    problems += _state_rules(manifest)
    problems += _quality_rules(manifest)
    problems += _topic_rules(manifest)
    problems += _delivery_rules(manifest)
    return problems


def _delivery_rules(m: Manifest) -> list[Problem]:
    """The manifest's own producer settings must keep the declared delivery mode's promise (the
    connection's and the resource's overrides are checked again when a run resolves them)."""
    from dpone_dagster.kafka.config import delivery_contradictions, producer_config, setting_origin

    delivery = m.sink.options.delivery
    mode = f"(sink.options.delivery.mode: {delivery.mode})"
    out = [
        Problem(setting_origin(m, key), f"{why} {mode}")
        for key, why in delivery_contradictions(delivery.mode, producer_config({}, delivery))
    ]
    # The typed acks on its own: producer_config or the idempotent modes may override it, but
    # declaring it against the mode is still wrong.
    if delivery.acks is not None and "sink.options.delivery.acks" not in {p.path for p in out}:
        out += [
            Problem("sink.options.delivery.acks", f"{why} {mode}")
            for _, why in delivery_contradictions(delivery.mode, {"acks": delivery.acks})
        ]
    return out


def _strategy_rules(m: Manifest) -> list[Problem]:
    strategy = m.sink.strategy
    out: list[Problem] = []
    if strategy.mode == "partition_replace":
        out.append(
            Problem(
                "sink.strategy.mode",
                "partition_replace is not supported for Kafka sinks (topics are append-only logs); "
                "use incremental_merge with merge_policy: event_upsert",
            )
        )
    if strategy.mode == "snapshot_reconciliation":
        # Its promise is a delete for every key that left the snapshot; a topic has no key set to
        # compare with, so the engine would publish the snapshot and silently keep the gone keys.
        out.append(
            Problem(
                "sink.strategy.mode",
                "snapshot_reconciliation is not available for Kafka sinks: a topic has no target key set to "
                "reconcile with, so keys that left the snapshot would get no delete"
                + (" (allow_snapshot_reconciliation does not change that)" if strategy.allow_snapshot_reconciliation else "")
                + "; use incremental_merge with deletes.enabled and deletes.tombstone: true, fed by a source "
                "that reports deletes (e.g. cdc)",
            )
        )
    if strategy.mode == "incremental_merge" and not strategy.unique_key_columns:
        out.append(
            Problem(
                "sink.strategy.unique_key",
                "incremental_merge requires unique_key; add e.g. `unique_key: order_id` "
                "(a list for composite keys)",
            )
        )
    if strategy.mode == "kafka_offsets" and not isinstance(m.source, KafkaSource):
        out.append(
            Problem("sink.strategy.mode", "kafka_offsets needs a Kafka source; use incremental_append")
        )
    if strategy.mode == "cdc" and m.source.type != "mssql":
        out.append(Problem("sink.strategy.mode", "cdc is only available for source.type: mssql"))
    return out


def _key_and_delete_rules(m: Manifest) -> list[Problem]:
    options = m.sink.options
    out: list[Problem] = []
    if options.key.mode == "unique_key" and not m.sink.strategy.unique_key_columns:
        if options.deletes.tombstone:
            out.append(
                Problem(
                    "sink.options.deletes.tombstone",
                    "tombstones need a non-null key, but key.mode: unique_key has no "
                    "sink.strategy.unique_key; set unique_key or use key.mode: hash_row",
                )
            )
    if options.deletes.tombstone and options.key.mode == "null":
        out.append(
            Problem(
                "sink.options.deletes.tombstone",
                "tombstones need a non-null key, but key.mode is null; use key.mode: unique_key "
                "with sink.strategy.unique_key",
            )
        )
    if options.deletes.tombstone and options.key.mode == "hash_row":
        out.append(
            Problem(
                "sink.options.deletes.tombstone",
                "a tombstone must carry the key of the row it deletes, which key.mode: hash_row "
                "cannot reproduce; use key.mode: unique_key",
            )
        )
    if options.deletes.enabled and not options.deletes.tombstone and options.envelope == "flat":
        out.append(
            Problem(
                "sink.options.deletes",
                "a flat envelope has no field for the operation, so a delete would look like an upsert; "
                "set deletes.tombstone: true, or use envelope: dpone (op: delete)",
            )
        )
    if options.deletes.tombstone and not options.deletes.enabled:
        out.append(
            Problem("sink.options.deletes.enabled", "deletes.tombstone: true needs deletes.enabled: true")
        )
    return out


def _registry_rules(m: Manifest) -> list[Problem]:
    out: list[Problem] = []
    sink_options = m.sink.options
    if sink_options.message_format in REGISTRY_FORMATS and not sink_options.schema_registry.enabled:
        out.append(
            Problem(
                "sink.options.schema_registry.enabled",
                f"message_format: {sink_options.message_format} needs a Schema Registry; set "
                "schema_registry.enabled: true and schema_registry_url in the connection",
            )
        )
    if isinstance(m.source, KafkaSource):
        source_options = m.source.options
        if source_options.message_format in REGISTRY_FORMATS and not (
            source_options.schema_registry and source_options.schema_registry.enabled
        ):
            out.append(
                Problem(
                    "source.options.schema_registry.enabled",
                    f"message_format: {source_options.message_format} needs a Schema Registry; set "
                    "source.options.schema_registry: {enabled: true} and schema_registry_url in the "
                    "connection",
                )
            )
    if sink_options.message_format in REGISTRY_FORMATS and sink_options.envelope == "dpone":
        out.append(
            Problem(
                "sink.options.envelope",
                f"envelope: dpone is JSON-only; with message_format: {sink_options.message_format} the row is "
                "the registered record (envelope: flat) and deletes are tombstones",
            )
        )
    if m.sink.options.delivery.mode == "exactly_once" and not isinstance(m.source, KafkaSource):
        out.append(
            Problem(
                "sink.options.delivery.mode",
                "exactly_once is available for Kafka sources only (offsets are committed in the "
                "producer transaction); use idempotent",
            )
        )
    return out


def _source_rules(m: Manifest) -> list[Problem]:
    if not isinstance(m.source, KafkaSource):
        return []
    options = m.source.options
    out: list[Problem] = []
    if options.read_mode == "max_records" and options.max_records is None:
        out.append(
            Problem("source.options.max_records", "read_mode: max_records needs max_records: <count>")
        )
    if (
        options.start_timestamp
        and options.end_timestamp
        and _utc(options.start_timestamp) >= _utc(options.end_timestamp)
    ):
        out.append(
            Problem("source.options.end_timestamp", "end_timestamp must be later than start_timestamp")
        )
    if options.partitions and options.read_mode != "time_window":
        out.append(
            Problem("source.options.partitions", "partitions apply to read_mode: time_window only")
        )
    if options.partitions and options.partitions.granularity == "cron" and not options.partitions.cron:
        out.append(
            Problem("source.options.partitions.cron", "granularity: cron needs cron: '<expression>'")
        )
    if options.on_error == "dead_letter" and options.dead_letter is None:
        out.append(
            Problem("source.options.dead_letter", "on_error: dead_letter needs dead_letter: {topic: <dlq topic>}")
        )
    if options.offset_storage == "kafka" and not options.group_id:
        out.append(
            Problem(
                "source.options.group_id",
                "offset_storage: kafka commits the consumer group's offsets; set group_id",
            )
        )
    return out


def _state_rules(m: Manifest) -> list[Problem]:
    if m.state.type == "postgres" and not m.state.connection_id:
        return [
            Problem(
                "state.connection_id",
                "state.type: postgres needs connection_id (e.g. postgres_state with "
                "POSTGRES_STATE_HOST/... or POSTGRES_STATE_DSN in the environment)",
            )
        ]
    return []


def _utc(value: datetime) -> datetime:
    """A naive timestamp is UTC, as the Kafka source reads it (so naive and aware bounds compare)."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _quality_rules(m: Manifest) -> list[Problem]:
    """Check names become Dagster asset check names: valid and unique."""
    from dpone_dagster.errors import ConfigError
    from dpone_dagster.quality.results import check_names

    try:
        check_names(m.quality.checks)
    except ConfigError as exc:
        return [Problem("quality.checks", str(exc))]
    return []


def _topic_rules(m: Manifest) -> list[Problem]:
    """One source topic for ETL; several topics or a regex only for exactly_once replication."""
    out: list[Problem] = []
    replication = m.sink.options.delivery.mode == "exactly_once"
    if isinstance(m.source, KafkaSource):
        given = [name for name, value in (("topic", m.source.topic), ("topics", m.source.topics), ("topic_pattern", m.source.topic_pattern)) if value]
        if not given:
            out.append(
                Problem(
                    "source.topic",
                    "required field is missing; add `topic: ...` (or topics / topic_pattern for exactly_once replication)",
                )
            )
        elif len(given) > 1:
            out.append(Problem("source.topic", f"set only one of topic, topics or topic_pattern (got {', '.join(given)})"))
        elif given[0] != "topic" and not replication:
            out.append(
                Problem(
                    f"source.{given[0]}",
                    "several topics or a pattern are for replication (sink.options.delivery.mode: exactly_once); "
                    "use one manifest per topic for ETL",
                )
            )
    mapping = m.sink.options.replication.topic_mapping
    if not m.sink.topic and not replication:
        out.append(Problem("sink.topic", "required field is missing; add `topic: ...`"))
    if mapping == "regex" and (m.sink.options.replication.pattern is None or m.sink.options.replication.replacement is None):
        out.append(Problem("sink.options.replication", "topic_mapping: regex needs pattern and replacement"))
    if m.state.type == "kafka_control_topic" and not replication:
        out.append(Problem("state.type", "kafka_control_topic holds offsets of exactly_once replication only"))
    if replication and m.sink.strategy.mode not in ("incremental_append", "kafka_offsets"):
        out.append(
            Problem(
                "sink.strategy.mode",
                "exactly_once replication copies records as they are (incremental_append); keyed merges and "
                "de-duplication need at_least_once or idempotent delivery",
            )
        )
    return out
