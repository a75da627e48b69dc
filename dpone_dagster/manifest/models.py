"""Pydantic models of a dpone manifest.

Every field that appears in the dpone seed documentation is modelled here; unknown keys are
rejected so that a typo never silently falls back to a default. Cross-field rules live in
`rules.py` so that this module only describes shapes.

Over 500 lines on purpose: the whole manifest schema in one file reads top to bottom like the
manifest reference in the README (source, sink, state, quality, observability, dagster), and
splitting it would scatter one document's fields across files.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

ConnectionType = Literal["env", "params", "airflow", "vault"]
MessageFormat = Literal["json", "json_schema", "avro", "protobuf"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# --------------------------------------------------------------------------- connections


class ConnectionRef(StrictModel):
    """Fields shared by every block that talks to an external system."""

    connection_id: str = Field(min_length=1)
    connection_type: ConnectionType = "env"
    # Inline credentials for connection_type: params (secrets are redacted in every output).
    params: dict[str, Any] | None = None


# --------------------------------------------------------------------------- shared pieces


class TableRef(StrictModel):
    schema_: str = Field(default="dbo", alias="schema")
    name: str = Field(min_length=1)

    @property
    def qualified(self) -> str:
        return f"{self.schema_}.{self.name}"


class SchemaRegistryOptions(StrictModel):
    enabled: bool = False
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    auto_register_schemas: bool = True
    # Registry compatibility mode that evolution planning checks against (the project's own rules).
    compatibility: Literal["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FULL", "NONE"] = "BACKWARD"
    record_name: str | None = None
    record_namespace: str | None = None
    # Protobuf only: import path of a generated message class, e.g. "myproto.orders_pb2:Order".
    protobuf_message: str | None = None


class ColumnSpec(StrictModel):
    name: str = Field(min_length=1)
    type: str = Field(min_length=1, description="Spark SQL type, e.g. 'long', 'string', 'decimal(18,2)'")
    nullable: bool = True


# --------------------------------------------------------------------------- kafka source


DEFAULT_ALLOWED_LATENESS_SECONDS = 300


class TimeWindowPartitions(StrictModel):
    """Dagster time-window partitions for read_mode: time_window."""

    granularity: Literal["hourly", "daily", "cron"] = "hourly"
    cron: str | None = None
    start: str = "2024-01-01T00:00:00"
    timezone: str = "UTC"
    # A window runs only once it is closed and this much time has passed after its end. The
    # default waits out a producer's default delivery timeout (120 s) with room for clock skew.
    allowed_lateness_seconds: int = Field(default=DEFAULT_ALLOWED_LATENESS_SECONDS, ge=0)
    # A record whose timestamp is before the start of the window whose offsets hold it (it was
    # written after its own window was materialized, or out of order): delivered with that window
    # and counted as late_records (next_window), sent to source.options.dead_letter.topic with the
    # run's output (dead_letter), or the run fails before publishing (fail).
    late_records: Literal["next_window", "dead_letter", "fail"] = "next_window"
    # What to do when a window starts before the log start offset (retention removed records);
    # unset: source.options.on_retention_gap.
    on_retention_gap: Literal["fail", "warn"] | None = None


class DeadLetterOptions(StrictModel):
    """Where on_error: dead_letter sends bad records (on the sink's cluster)."""

    topic: str = Field(min_length=1)
    create: bool = False
    partitions: int = Field(default=1, gt=0)


class KafkaSourceOptions(StrictModel):
    group_id: str | None = None
    read_mode: Literal["offsets", "time_window", "max_records"] = "offsets"
    offset_storage: Literal["dpone", "kafka"] = "dpone"
    start_from: Literal["stored", "earliest", "latest"] = "stored"
    message_format: MessageFormat = "json"
    envelope: Literal["auto", "flat", "dpone"] = "auto"
    # Records fetched per consumer call inside a Spark task (consume(num_messages=batch_size)).
    batch_size: int = Field(default=50_000, gt=0)
    poll_timeout_ms: int = Field(default=1_000, gt=0)
    # Consecutive empty polls tolerated before a task gives up *and fails* (it never stops early
    # with success: the planned end offset must be reached).
    max_empty_polls: int = Field(default=3, gt=0)
    max_records: int | None = Field(default=None, gt=0)
    # time_window bounds for CLI runs; inside Dagster the partition window supplies them.
    start_timestamp: datetime | None = None
    end_timestamp: datetime | None = None
    partitions: TimeWindowPartitions | None = None
    # Upper bound on offsets in one read slice; larger ranges are split into several slices. A
    # slice is a Spark task, except in local mode, where each task slot reads its share of them.
    records_per_task: int = Field(default=250_000, gt=0)
    # Sample size for schema inference when `schema` is not given.
    schema_sample_size: int = Field(default=1_000, gt=0)
    schema_: list[ColumnSpec] | None = Field(default=None, alias="schema")
    schema_registry: SchemaRegistryOptions | None = None
    # Raw librdkafka consumer settings passed through unchanged.
    consumer_config: dict[str, Any] = Field(default_factory=dict)
    # Bad input (undecodable value, wrong magic byte, unknown schema id, value not matching the
    # schema, missing unique key, message too large): fail the run, send it to a dead-letter topic,
    # or skip it; every bad record is counted either way.
    on_error: Literal["fail", "dead_letter", "skip"] = "fail"
    dead_letter: DeadLetterOptions | None = None
    # Stored offsets (or a time window) below the log start offset: retention removed records
    # that were never read. fail: the run stops before reading, with the fix; warn: it reads from
    # the log start and reports how many records were lost, per partition, in its notes.
    on_retention_gap: Literal["fail", "warn"] = "fail"

    @model_validator(mode="after")
    def _late_records_need_a_topic(self) -> KafkaSourceOptions:
        if self.partitions is not None and self.partitions.late_records == "dead_letter" and self.dead_letter is None:
            raise ValueError(
                "partitions.late_records: dead_letter needs source.options.dead_letter: {topic: <dead-letter topic>} "
                "(or use late_records: next_window or fail)"
            )
        return self

    @property
    def retention_gap_policy(self) -> Literal["fail", "warn"]:
        """The time-window setting when given, else the source's."""
        window = self.partitions.on_retention_gap if self.partitions else None
        return window or self.on_retention_gap


class KafkaSource(ConnectionRef):
    type: Literal["kafka"]
    # One topic (every mode), or several topics / a regex (replication: delivery.mode exactly_once).
    topic: str = Field(default="", min_length=0)
    topics: list[str] | None = None
    topic_pattern: str | None = None
    options: KafkaSourceOptions = Field(default_factory=KafkaSourceOptions)


# --------------------------------------------------------------------------- SQL sources


class SqlSourceOptions(StrictModel):
    incremental_column: str | None = None
    batch_size: int = Field(default=50_000, gt=0)
    export_mode: Literal["jdbc", "bcp", "pyodbc"] = "jdbc"
    columns: list[str] | None = None
    predicate: str | None = None
    # Re-read this far behind the stored watermark (ties / late commits); rows are de-duplicated
    # by unique key before publishing.
    lookback: str | int | None = None
    partition_column: str | None = None
    num_partitions: int = Field(default=1, gt=0)
    lower_bound: str | int | None = None
    upper_bound: str | int | None = None
    jdbc_driver: str | None = None
    jdbc_jar: str | None = None
    capture_instance: str | None = None


class SqlSource(ConnectionRef):
    type: Literal["mssql", "postgres", "mysql"]
    table: TableRef
    options: SqlSourceOptions = Field(default_factory=SqlSourceOptions)


Source = Annotated[KafkaSource | SqlSource, Field(discriminator="type")]


# --------------------------------------------------------------------------- kafka sink


class Strategy(StrictModel):
    mode: Literal[
        "full_refresh",
        "incremental_append",
        "incremental_merge",
        "replace",
        "partition_replace",
        "snapshot_reconciliation",
        "kafka_offsets",
        "cdc",
    ] = "incremental_append"
    unique_key: str | list[str] | None = None
    merge_policy: Literal["event_upsert"] = "event_upsert"
    duplicate_policy: Literal["fail", "keep_last", "keep_first", "allow"] = "keep_last"
    # Accepted for manifests written for other sinks; snapshot_reconciliation is refused for Kafka
    # sinks either way (no target key set to emit deletes from).
    allow_snapshot_reconciliation: bool = False

    @property
    def unique_key_columns(self) -> tuple[str, ...]:
        if self.unique_key is None:
            return ()
        if isinstance(self.unique_key, str):
            return tuple(part.strip() for part in self.unique_key.split(",") if part.strip())
        return tuple(self.unique_key)


class KeyOptions(StrictModel):
    mode: Literal["unique_key", "hash_row", "null"] = "unique_key"
    format: Literal["string", "json", "avro", "json_schema"] = "string"


class DeliveryOptions(StrictModel):
    mode: Literal["at_least_once", "idempotent", "exactly_once"] = "at_least_once"
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] | None = None
    linger_ms: int | None = Field(default=None, ge=0)
    batch_num_messages: int | None = Field(default=None, gt=0)
    acks: Literal["0", "1", "all", "-1"] | None = None
    flush_timeout_s: float = Field(default=120.0, gt=0)
    # Raw librdkafka producer settings passed through unchanged.
    producer_config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("acks", mode="before")
    @classmethod
    def _acks_as_text(cls, value: Any) -> Any:
        """YAML reads `acks: 1` as an integer; librdkafka takes the same values as text."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value


class DeleteOptions(StrictModel):
    enabled: bool = False
    tombstone: bool = False
    # A delete row with deletes disabled fails the run (default) or is skipped and counted.
    when_disabled: Literal["fail", "skip"] = "fail"


class HeaderOptions(StrictModel):
    static: dict[str, str] = Field(default_factory=dict)
    lineage: bool = False
    replicate_source: bool = False


def _replicas(value: int) -> int:
    if value == 0 or value < -1:
        raise ValueError("is not a replica count: use -1 for the cluster's default.replication.factor, or 1 or more")
    return value


Replicas = Annotated[int, AfterValidator(_replicas)]


class ControlTopicOptions(StrictModel):
    """Compacted topic on the TARGET cluster holding replicated source offsets (exactly_once)."""

    name: str = "__dpone_replication_offsets"
    # Isolates pipelines sharing one control topic; defaults to the manifest name. Part of the
    # replication tasks' transactional ids (dpone:<commit_group>:<topic>:<partition>): no ':'.
    commit_group: str | None = Field(default=None, min_length=1)

    @field_validator("commit_group")
    @classmethod
    def _no_colon(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            raise ValueError(f"{value!r} holds ':', which separates the parts of the replication tasks' transactional ids; use another character")
        return value
    create: bool = True
    partitions: int = Field(default=1, gt=0)
    # -1: the cluster's default.replication.factor. One replica would lose the committed offsets
    # with its broker and refuse every transaction under min.insync.replicas 2.
    replication_factor: Replicas = -1


class ReplicationOptions(StrictModel):
    """Kafka -> Kafka replication features (the Lenses K2K concepts)."""

    topic_mapping: Literal["same", "prefix", "suffix", "regex"] = "same"
    prefix: str = ""
    suffix: str = ""
    pattern: str | None = None  # topic_mapping regex: re.sub(pattern, replacement, topic)
    replacement: str | None = None
    partition_mapping: Literal["keep", "partitioner"] = "keep"
    replicate_headers: bool = True
    keep_timestamps: bool = True
    tracing_headers: bool = False
    # Re-register value schemas in the target registry and rewrite schema ids (both sides need a registry).
    schema_mapping: bool = False
    control_topic: ControlTopicOptions = Field(default_factory=ControlTopicOptions)
    transaction_timeout_ms: int = Field(default=60_000, gt=0)
    # Transaction size: a task commits after this many source records or this many seconds,
    # whichever comes first (each commit also writes the control-topic offset). Bigger transactions
    # cost less per record (one commit and one control record each), but a failure redoes more,
    # and read_committed consumers of the target see none of a transaction until it commits.
    # Measured (2M records of 230 bytes, 2 cores, embedded broker): 10,000 to 100,000 per
    # transaction copy at the same rate, so the default stays small (~12 MB of such records).
    # The seconds also keep transactions of large records well inside transaction_timeout_ms.
    records_per_transaction: int = Field(default=50_000, gt=0)
    seconds_per_transaction: float = Field(default=10.0, gt=0)


class TopicCreation(StrictModel):
    enabled: bool = False
    partitions: int = Field(default=1, gt=0)
    replication_factor: Replicas = -1  # -1: the cluster's default.replication.factor
    configs: dict[str, str] = Field(default_factory=dict)


class KafkaSinkOptions(StrictModel):
    message_format: MessageFormat = "json"
    envelope: Literal["flat", "dpone"] = "flat"
    key: KeyOptions = Field(default_factory=KeyOptions)
    delivery: DeliveryOptions = Field(default_factory=DeliveryOptions)
    deletes: DeleteOptions = Field(default_factory=DeleteOptions)
    schema_registry: SchemaRegistryOptions = Field(default_factory=SchemaRegistryOptions)
    headers: HeaderOptions = Field(default_factory=HeaderOptions)
    create_topic: TopicCreation = Field(default_factory=TopicCreation)
    on_type_change: Literal["fail", "new_column"] = "fail"
    schema_evolution: bool = True
    replication: ReplicationOptions = Field(default_factory=ReplicationOptions)


class KafkaSink(ConnectionRef):
    type: Literal["kafka"]
    # Required except for replication, where sink.options.replication.topic_mapping names targets.
    topic: str = Field(default="", min_length=0)
    strategy: Strategy = Field(default_factory=Strategy)
    options: KafkaSinkOptions = Field(default_factory=KafkaSinkOptions)


# --------------------------------------------------------------------------- state


class StateConfig(StrictModel):
    # postgres: tables in the state connection; local: JSON files under `path` (embedded default).
    # kafka_control_topic: offsets live in the replication control topic (exactly_once), read-only here.
    type: Literal["postgres", "local", "kafka_control_topic"] = "local"
    connection_id: str | None = None
    connection_type: ConnectionType = "env"
    params: dict[str, Any] | None = None
    table: TableRef = Field(default_factory=lambda: TableRef(schema="etl_state", name="dpone_state"))
    offsets_table: TableRef = Field(
        default_factory=lambda: TableRef(schema="etl_state", name="etl_kafka_offsets")
    )
    path: str = ".dpone/state"


# --------------------------------------------------------------------------- quality


class _Check(StrictModel):
    name: str | None = None


# Which frame a row-level check judges: `published` (default) the rows as they will be published,
# after the delete policy, bad records and de-duplication; `extracted` the decoded batch before
# all of that (its default name ends in `_extracted`).
CheckStage = Literal["published", "extracted"]


class MinRowsCheck(_Check):
    type: Literal["min_rows"]
    threshold: int = Field(ge=0)


class SourceTargetCountCheck(_Check):
    type: Literal["source_target_count"]
    tolerance_pct: float = Field(default=0.0, ge=0, le=100)
    # The target topic is written by this pipeline alone: also count what the run's offset range
    # of the target holds (a concurrent writer would be counted as this run's output).
    exclusive_target: bool = False


class NotNullCheck(_Check):
    type: Literal["not_null"]
    stage: CheckStage = "published"
    columns: list[str] = Field(min_length=1)


class UniqueCheck(_Check):
    type: Literal["unique"]
    stage: CheckStage = "published"
    columns: list[str] = Field(min_length=1)


class AcceptedValuesCheck(_Check):
    type: Literal["accepted_values"]
    stage: CheckStage = "published"
    column: str
    values: list[Any] = Field(min_length=1)


class FreshnessCheck(_Check):
    type: Literal["freshness"]
    stage: CheckStage = "published"
    column: str | None = None  # default: the Kafka record timestamp
    max_age_seconds: int = Field(gt=0)


class GreatExpectationsCheck(_Check):
    type: Literal["great_expectations"]
    stage: CheckStage = "published"
    expectation_type: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


Check = Annotated[
    MinRowsCheck
    | SourceTargetCountCheck
    | NotNullCheck
    | UniqueCheck
    | AcceptedValuesCheck
    | FreshnessCheck
    | GreatExpectationsCheck,
    Field(discriminator="type"),
]


class QualityConfig(StrictModel):
    mode: Literal["fail", "warn"] = "fail"
    checks: list[Check] = Field(default_factory=list)


# --------------------------------------------------------------------------- observability


class ArtifactsConfig(StrictModel):
    enabled: bool = False
    path: str = ".dpone/runs"


class MetricsConfig(StrictModel):
    """Prometheus metrics of every run (observability/metrics.py lists them)."""

    # A node-exporter textfile collector directory: the run writes dpone_<pipeline>.prom there.
    textfile_dir: str | None = None
    # A Pushgateway (http://host:9091); pushed under the grouping key {job, pipeline}.
    pushgateway_url: str | None = None
    job: str = "dpone"
    push_timeout_seconds: float = Field(default=10.0, gt=0)


class ObservabilityConfig(StrictModel):
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)


# --------------------------------------------------------------------------- dagster


class SensorOptions(StrictModel):
    """The sensor that watches the source topic and requests runs."""

    enabled: bool = True
    # Offsets mode: request a run once this many messages wait beyond the stored offsets.
    min_new_messages: int = Field(default=1, gt=0)
    minimum_interval_seconds: int = Field(default=60, gt=0)
    running_by_default: bool = False
    # Time windows: how many closed windows back the first tick looks (and the furthest back any
    # later tick looks), the runs one window gets before the sensor stops requesting it, and the
    # wait after a failed run (doubled after each further failure).
    catch_up_windows: int = Field(default=24, gt=0)
    max_attempts: int = Field(default=3, gt=0)
    retry_backoff_seconds: int = Field(default=300, ge=0)


class RetryOptions(StrictModel):
    """Dagster run retries (dagster.yaml `run_retries`) for this pipeline's runs."""

    # Attempts in all, the first included: a run that fails for a reason a retry can fix (broker
    # or network trouble, a lost connection, a killed process) is run again until this many have
    # failed. Failures of the data itself (a quality gate, a bad record under on_error: fail) and
    # refused manifests are never retried: the same input fails the same way.
    max_attempts: int = Field(default=3, ge=1)


class ScheduleOptions(StrictModel):
    """A Dagster schedule: at each cron tick, offsets mode runs whatever has arrived; time-window
    mode requests every closed window (lateness passed) not materialized yet, like the sensor."""

    cron: str = Field(min_length=1)
    timezone: str = "UTC"
    running_by_default: bool = False


class AutomationOptions(StrictModel):
    """Dagster declarative automation on the asset (evaluated by the daemon's automation sensor):
    `on_cron` materializes once per cron tick, unless a run of it is in progress."""

    on_cron: str = Field(min_length=1)
    timezone: str = "UTC"


class DagsterOptions(StrictModel):
    group_name: str = "dpone"
    sensor: SensorOptions = Field(default_factory=SensorOptions)
    retries: RetryOptions = Field(default_factory=RetryOptions)
    schedule: ScheduleOptions | None = None
    automation: AutomationOptions | None = None

    @field_validator("schedule", "automation")
    @classmethod
    def _valid_cron(cls, value: Any) -> Any:
        from dagster._utils.schedules import is_valid_cron_string

        cron = getattr(value, "cron", None) or getattr(value, "on_cron", None)
        if cron is not None and not is_valid_cron_string(cron):
            raise ValueError(f"{cron!r} is not a cron expression (five fields, e.g. '*/15 * * * *')")
        return value


# --------------------------------------------------------------------------- manifest


class Manifest(StrictModel):
    name: str = Field(min_length=1)
    description: str | None = None
    source: Source
    sink: KafkaSink
    state: StateConfig = Field(default_factory=StateConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    dagster: DagsterOptions = Field(default_factory=DagsterOptions)

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        # ASCII only: Dagster rejects asset names outside ^[A-Za-z0-9_]+$ (str.isalnum accepts 'ï').
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(
                "must contain only letters, digits and underscores and not start with a digit "
                "(it becomes the Dagster asset key)"
            )
        return value
