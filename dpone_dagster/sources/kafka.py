"""Kafka source: fix the boundary, sample for the schema, read on Spark, decode."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka import inspect
from dpone_dagster.kafka.boundary import (
    Boundary,
    PartitionRange,
    Watermarks,
    cap_total_records,
    plan_offset_ranges,
    split_into_tasks,
)
from dpone_dagster.kafka.windows import PlannedWindow, Recorded, plan_windows
from dpone_dagster.kafka.windows import Window as TimeWindow
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.schema.inference import infer_schema, merge_structs
from dpone_dagster.sources.kafka_reader import (
    ReaderSettings,
    raw_records,
    read_ranges,
    read_records,
    reads_decoded,
)
from dpone_dagster.spark import decode

Log = Callable[[str], None]


@dataclass
class ExtractResult:
    # Builds the batch: payload + metadata columns (see dpone_dagster.columns). Built on first use
    # of `df`: when the read tasks decoded every record, the JVM decoder's frame is never needed
    # (building it costs the driver ~0.4 s of Spark analysis).
    build: Callable[[], DataFrame]
    schema: StructType  # payload schema
    envelope: str
    notes: list[str] = field(default_factory=list)
    # The raw records (re-readable: the boundary is fixed), for dead-lettering bad ones.
    raw: DataFrame | None = None
    # Columns of `df` that the others determine: the engine keeps the batch without them.
    rebuildable: dict[str, Column] = field(default_factory=dict)
    # Flat JSON: the read tasks' output, and given a kept copy of it, (the batch when the tasks
    # decoded every record, the batch otherwise). Kept as it is, that output needs no row copy
    # before keeping; each pass then renames its columns (see engine.run._stage_batch).
    records: DataFrame | None = None
    decode_kept: Callable[[DataFrame], tuple[DataFrame, Callable[[], DataFrame]]] | None = None
    # The read's task count where the reader fixes it (a JDBC read in one partition, or by hash
    # predicates): a Spark Connect client cannot see it otherwise without running the read.
    tasks: int | None = None

    @cached_property
    def df(self) -> DataFrame:
        return self.build()


@dataclass(frozen=True)
class JsonPlan:
    """How a batch of JSON values is decoded (`KafkaBatchSource.json_plan`)."""

    schema: StructType  # payload schema
    envelope: str  # flat | dpone, as resolved from the sample under envelope: auto
    notes: tuple[str, ...]
    # Widened by fields the sample missed (KafkaBatchSource.widen_plan): not checked for drift again.
    widened: bool = False


@dataclass(frozen=True)
class RegistryPlan:
    """What the direct path's tasks decode registry-framed values with (`KafkaBatchSource.registry_plan`):
    every version of the topic's value subject, fetched on the driver."""

    fmt: str
    schemas: dict[int, tuple[str, str]]  # schema id -> (schema type, schema string)
    references: dict[int, tuple[tuple[str, str], ...]] | None  # protobuf imports per id
    schema: StructType  # the payload schema over every version (as the Spark SQL path merges them)
    # Ids a batch carries that the registry does not hold: their records are undecodable bad records.
    missing: frozenset[int] = frozenset()


# The direct path decodes with every version of a subject; a subject with more is planned, as the
# Spark SQL path plans every batch, from the schema ids the batch carries.
MAX_SUBJECT_VERSIONS = 100


def default_group_id(manifest: Manifest) -> str:
    source = manifest.source
    assert isinstance(source, KafkaSource)
    return source.options.group_id or f"dpone.{manifest.name}"


class KafkaBatchSource:
    def __init__(self, manifest: Manifest, client_config: dict[str, Any], registry_config: dict[str, Any] | None = None):
        assert isinstance(manifest.source, KafkaSource)
        self.manifest = manifest
        self.source: KafkaSource = manifest.source
        self.options = manifest.source.options
        self.client_config = client_config
        self.group_id = default_group_id(manifest)
        self.registry_config = registry_config
        self._json_plan: tuple[Boundary, JsonPlan] | None = None  # the last boundary's
        self._registry_plan: tuple[Boundary, RegistryPlan] | None = None  # a boundary's, narrowed

    @property
    def topic(self) -> str:
        return self.source.topic

    # ----------------------------------------------------------------------- plan

    def plan(self, stored: dict[int, int], windows: list[TimeWindow] | None = None, recorded: Recorded | None = None) -> Boundary:
        """Fix [start, end) per partition before anything is read (retries read the same offsets).

        `windows` (contiguous, in order) come from Dagster partitions; otherwise the manifest's
        start/end timestamps apply to read_mode time_window. `recorded`: the offset ranges earlier
        runs recorded per window (kafka/windows.py), binding partition windows.
        """
        consumer = inspect.make_consumer(self.client_config, self.group_id, self._isolation())
        try:
            partitions = inspect.topic_partitions(consumer, self.topic)
            watermarks = inspect.verified_watermarks(consumer, self.topic, partitions)
            strategy = self.manifest.sink.strategy.mode
            windows = windows or self._manifest_windows()
            if self.options.read_mode == "time_window" or (windows and strategy == "replace"):
                if not windows:
                    raise ConfigError(
                        "source.options: read_mode time_window needs start_timestamp and end_timestamp "
                        "(or a Dagster partition)"
                    )
                return self._plan_windows(consumer, watermarks, windows, recorded or {})
            start_from = self.options.start_from
            if strategy in ("full_refresh", "replace"):
                start_from = "earliest" if start_from == "stored" else start_from
            boundary = plan_offset_ranges(self.topic, watermarks, stored, start_from, self.options.retention_gap_policy)
            if self.options.read_mode == "max_records":
                assert self.options.max_records is not None
                boundary = cap_total_records(boundary, self.options.max_records)
            return boundary
        finally:
            consumer.close()

    def _manifest_windows(self) -> list[TimeWindow]:
        o = self.options
        if o.start_timestamp and o.end_timestamp:
            return [TimeWindow(_utc(o.start_timestamp), _utc(o.end_timestamp))]
        return []

    def _plan_windows(self, consumer: Any, watermarks: dict[int, Watermarks], windows: list[TimeWindow], recorded: Recorded) -> Boundary:
        """Window i reads its recorded ranges, or the offsets between its edges (kafka/windows.py)."""
        probe = inspect.RecordProbe(consumer, self.topic)
        keyed = all(w.partition_key is not None for w in windows)
        planned = plan_windows(
            sorted(watermarks),
            windows,
            recorded if keyed else {},
            lambda ms: inspect.offsets_for_timestamp(consumer, probe, self.topic, watermarks, ms),
        )
        notes = list(self._retention_notes(probe, watermarks, windows[0], planned))
        planned = [_within_log(self.topic, w, watermarks) for w in planned]
        frozen = [w.window.partition_key or w.window.start.isoformat() for w in planned if w.frozen]
        if frozen:
            notes.append(f"window(s) {frozen} read the offset ranges recorded by their first run")
        ranges = tuple(
            PartitionRange(p, planned[0].ranges[i].start, max(planned[0].ranges[i].start, planned[-1].ranges[i].end))
            for i, p in enumerate(sorted(watermarks))
        )
        notes.append(f"window [{windows[0].start.isoformat()}, {windows[-1].end.isoformat()})")
        return Boundary(self.topic, "time_window", ranges, tuple(notes), tuple(w.as_dict() for w in planned))

    def _retention_notes(
        self, probe: inspect.RecordProbe, watermarks: dict[int, Watermarks], window: TimeWindow, planned: list[PlannedWindow]
    ) -> list[str]:
        """A window that starts before the oldest retained record may have lost data to retention."""
        gaps = {p for p, since in _retained_since(probe, watermarks).items() if since > window.start_ms}
        for i, (p, wm) in enumerate(sorted(watermarks.items())):
            if any(w.ranges[i].start < wm.low and w.ranges[i].size for w in planned if w.frozen):
                gaps.add(p)  # a recorded range reaches below the log start
        if not gaps:
            return []
        message = (
            f"window starting {window.start.isoformat()} is older than the oldest retained record of "
            f"'{self.topic}' partitions {sorted(gaps)} (retention removed records); the window may be incomplete"
        )
        if self.options.retention_gap_policy == "fail":
            raise RunFailed(message + "; set source.options.on_retention_gap: warn to run it anyway")
        return [f"warning: {message}"]

    def _isolation(self) -> dict[str, Any]:
        """The read tasks' isolation level, when source.options.consumer_config sets one."""
        level = self.options.consumer_config.get("isolation.level")
        return {"isolation.level": level} if level is not None else {}

    def complete_since_ms(self) -> int | None:
        """The instant from which every partition still holds every record: the newest timestamp of
        a partition's first retained record, over the partitions retention removed records from;
        None when it removed none. A window starting earlier may have lost records to retention."""
        consumer = inspect.make_consumer(self.client_config, self.group_id)
        try:
            watermarks = inspect.verified_watermarks(consumer, self.topic, inspect.topic_partitions(consumer, self.topic))
            since = _retained_since(inspect.RecordProbe(consumer, self.topic), watermarks)
        finally:
            consumer.close()
        return max(since.values(), default=None)

    def late_records(self, spark: SparkSession, boundary: Boundary) -> dict[str, int]:
        """Per window (start, ISO 8601): records whose timestamp is before the start of the window
        whose offsets hold them. One Spark pass over the windows' offsets (a count: nothing is kept)."""
        late = late_window(boundary, F.col("partition"), F.col("offset"), F.col("timestamp"))
        if late is None:
            return {}
        windows = self.raw_records(spark, boundary).select(late.alias("window")).where(F.col("window").isNotNull())
        counts = windows.groupBy("window").count().collect()
        by_index = {row["window"]: row["count"] for row in counts}
        return {w["start"]: int(by_index.get(i, 0)) for i, w in enumerate(boundary.windows)}

    def raw_records(self, spark: SparkSession, boundary: Boundary) -> DataFrame:
        """The boundary's records as read (columns of kafka_reader.RAW_SCHEMA); re-readable."""
        return read_ranges(spark, split_into_tasks(boundary, self.options.records_per_task), self.reader_settings())

    # ----------------------------------------------------------------------- extract

    def extract(self, spark: SparkSession, boundary: Boundary, log: Log) -> ExtractResult:
        if self.options.message_format != "json":
            return self._extract_registry(spark, boundary, log)
        plan = self.json_plan(boundary)
        # An inferred schema may miss keys the sample did not hold: every record is checked.
        detect = self.options.schema_ is None and bool(boundary.total) and not plan.widened
        return self._extract_json(spark, boundary, plan.schema, plan.envelope, list(plan.notes), detect, log)

    def notes_of_nothing_read(self, boundary: Boundary) -> list[str]:
        """The extract's notes of a batch with no offsets to read."""
        fmt = self.options.message_format
        return list(self.json_plan(boundary).notes) if fmt == "json" else registry_notes(fmt, set(), set())

    def json_plan(self, boundary: Boundary) -> JsonPlan:
        """How JSON values of `boundary` are decoded: the envelope and the payload schema (declared,
        or inferred from a sample). Decided once per boundary: every path of a run decodes alike."""
        if self._json_plan is not None and self._json_plan[0] is boundary:
            return self._json_plan[1]
        sample = self.sample_values(boundary) if boundary.total else []
        envelope = self.resolve_envelope(sample)
        schema = self._schema(sample, self._decoding(envelope))
        reserved = sorted(set(schema.names) & (C.METADATA - {C.OP}))
        if reserved:
            raise ConfigError(
                f"records of '{self.topic}' have fields {reserved}, names the engine keeps for its own columns; "
                "declare source.options.schema without them (undeclared fields are not read)"
            )
        notes = (f"envelope: {envelope}" + (" (detected)" if self.options.envelope == "auto" else ""),)
        plan = JsonPlan(schema, envelope, notes)
        self._json_plan = (boundary, plan)
        return plan

    def _extract_json(
        self, spark: SparkSession, boundary: Boundary, schema: StructType, envelope: str, notes: list[str], detect: bool, log: Log
    ) -> ExtractResult:
        tasks = split_into_tasks(boundary, self.options.records_per_task)
        log(f"extract: {len(tasks)} Spark task(s) over {boundary.total} offsets of '{self.topic}'")
        settings = self.reader_settings()
        # Flat JSON is decoded in the read tasks where pyarrow can (spark/arrow_json.py).
        records = read_records(spark, tasks, settings, schema if envelope == "flat" else None)
        # Under envelope: auto each record is decided on its own (the sample only chose the above).
        decoding = self._decoding(envelope)
        extracted = ExtractResult(
            lambda: decode.decode_json(raw_records(records, tasks), schema, decoding, detect_unknown=detect),
            schema,
            envelope,
            notes,
            read_ranges(spark, tasks, settings),
            decode.rebuildable_columns(self.topic),
        )
        if reads_decoded(records):

            def decode_kept(kept: DataFrame) -> tuple[DataFrame, Callable[[], DataFrame]]:
                raw = raw_records(kept, tasks)
                return decode.decoded_in_tasks(raw, schema), lambda: decode.decode_json(raw, schema, decoding, detect_unknown=detect)

            extracted.records, extracted.decode_kept = records, decode_kept
        return extracted

    def widen(self, spark: SparkSession, boundary: Boundary, extracted: ExtractResult, staged: DataFrame, log: Log) -> ExtractResult:
        """Re-extract with the schema widened by the keys `staged` reports in C.UNKNOWN_KEYS
        (`_widened`). The new extract does not look for drift again."""
        plan = self._widened(JsonPlan(extracted.schema, extracted.envelope, tuple(extracted.notes)), staged)
        log(f"extract: {plan.notes[-1]}; reading the batch again")
        return self._extract_json(spark, boundary, plan.schema, plan.envelope, list(plan.notes), False, log)

    def widen_plan(self, boundary: Boundary, decoded: DataFrame) -> JsonPlan:
        """The plan of `boundary` widened by the keys `decoded` (records decoded with drift
        detection) reports, as `widen` widens it; every later read of the boundary decodes with it."""
        plan = self._widened(self.json_plan(boundary), decoded)
        self._json_plan = (boundary, plan)
        return plan

    def _widened(self, plan: JsonPlan, decoded: DataFrame) -> JsonPlan:
        """`plan` with the fields `decoded` reports in C.UNKNOWN_KEYS, their types inferred from
        the first 50 records (in partition, offset order) that hold each."""
        per_key = Window.partitionBy("k").orderBy(C.SOURCE_PARTITION, C.SOURCE_OFFSET)
        samples = (
            decoded.where(F.col(C.UNKNOWN_KEYS).isNotNull())
            .select(F.explode(C.UNKNOWN_KEYS).alias("k"), C.UNKNOWN_TEXT, C.SOURCE_PARTITION, C.SOURCE_OFFSET)
            .withColumn("n", F.row_number().over(per_key))
            .where("n <= 50")
            .select("k", C.UNKNOWN_TEXT)
            .collect()
        )
        keys = sorted({row["k"] for row in samples})
        texts = list(dict.fromkeys(row[C.UNKNOWN_TEXT] for row in samples))
        schema = merge_structs(plan.schema, self._infer([_loads(t) for t in texts], self._decoding(plan.envelope)))
        return JsonPlan(schema, plan.envelope, (*plan.notes, f"schema widened with fields not in the sample: {keys}"), widened=True)

    def reader_settings(self) -> ReaderSettings:
        return ReaderSettings(
            client_config=self.client_config,
            group_id=self.group_id,
            batch_size=self.options.batch_size,
            poll_timeout_ms=self.options.poll_timeout_ms,
            max_empty_polls=self.options.max_empty_polls,
            consumer_overrides=tuple(self.options.consumer_config.items()),
        )

    def _extract_registry(self, spark: SparkSession, boundary: Boundary, log: Log) -> ExtractResult:
        """Confluent-framed records: the schema ids in the batch are fetched once on the driver and
        shipped to the executors, which decode with them (never calling the registry)."""
        from dpone_dagster.schema.registry import (
            references_by_id,
            registry_client,
            registry_errors,
            schemas_by_id,
        )
        from dpone_dagster.spark.registry_codec import decode_registry, distinct_schema_ids

        fmt = self.options.message_format
        tasks = split_into_tasks(boundary, self.options.records_per_task)
        log(f"extract: {len(tasks)} Spark task(s) over {boundary.total} offsets of '{self.topic}' ({fmt})")
        raw = read_ranges(spark, tasks, self.reader_settings()).cache()
        assert self.registry_config is not None
        client = registry_client(self.registry_config)
        ids = distinct_schema_ids(raw) if boundary.total else []
        with registry_errors(self.registry_config):
            schemas = schemas_by_id(client, ids, message_format=fmt)
            references = references_by_id(client, ids) if fmt == "protobuf" else None
        schema = self.registry_schema(fmt, schemas, references)
        notes = registry_notes(fmt, set(schemas), set(ids) - set(schemas))
        df = decode_registry(raw, fmt, schemas, schema, references)
        return ExtractResult(lambda: df, schema, "flat", notes, raw, decode.rebuildable_columns(self.topic))

    def registry_plan(self, boundary: Boundary) -> RegistryPlan | None:
        """Every registered version of the topic's value subject (or the plan `use_registry_plan`
        set for the boundary), or None when the subject is not named by the topic alone (then only
        the batch's own schema ids tell which are used: `registry_plan_of_ids`), is empty or has
        more than MAX_SUBJECT_VERSIONS versions."""
        if self._registry_plan is not None and self._registry_plan[0] is boundary:
            return self._registry_plan[1]
        from dpone_dagster.schema.registry import (
            fetch_versions,
            references_by_id,
            registry_client,
            registry_errors,
        )

        options = self.options.schema_registry
        if self.registry_config is None or (options is not None and options.subject_name_strategy != "topic"):
            return None
        fmt = self.options.message_format
        client = registry_client(self.registry_config)
        with registry_errors(self.registry_config):
            versions = fetch_versions(client, f"{self.topic}-value", fmt)
            if not versions or len(versions) > MAX_SUBJECT_VERSIONS:
                return None
            schemas = {
                int(v.schema_id): ((v.schema.schema_type or "AVRO").upper(), v.schema.schema_str or "") for v in versions
            }
            references = references_by_id(client, schemas) if fmt == "protobuf" else None
        return RegistryPlan(fmt, schemas, references, self.registry_schema(fmt, schemas, references))

    def registry_plan_of_ids(self, ids: set[int]) -> RegistryPlan:
        """The plan of a batch that carries `ids`, every one fetched by id (a subject the topic does
        not name, or one with no version or too many to decode with)."""
        fmt = self.options.message_format
        empty = RegistryPlan(fmt, {}, {} if fmt == "protobuf" else None, StructType([]))
        return self.registry_plan_by_id(empty, ids)

    def narrowed_registry_plan(self, plan: RegistryPlan, ids: set[int]) -> RegistryPlan:
        """`plan` with only the versions `ids` (those a batch carries), merged as the Spark SQL path
        merges them (pure but for loading the schemas)."""
        schemas = {i: plan.schemas[i] for i in ids if i in plan.schemas}
        references = {i: r for i, r in plan.references.items() if i in schemas} if plan.references is not None else None
        missing = plan.missing & frozenset(ids)
        return RegistryPlan(plan.fmt, schemas, references, self.registry_schema(plan.fmt, schemas, references), missing)

    def registry_plan_by_id(self, plan: RegistryPlan, ids: set[int]) -> RegistryPlan:
        """The plan of a batch that carries `ids` (all of them): those outside `plan` fetched by id,
        as the Spark SQL path fetches every id of a batch; ids the registry does not hold are
        `missing`. Merged over `ids` only, as that path merges them."""
        from dpone_dagster.schema.registry import (
            references_by_id,
            registry_client,
            registry_errors,
            schemas_by_id,
        )

        assert self.registry_config is not None
        fetch = set(ids) - set(plan.schemas) - plan.missing
        client = registry_client(self.registry_config)
        with registry_errors(self.registry_config):
            found = schemas_by_id(client, fetch, message_format=plan.fmt)
            found_references = references_by_id(client, found) if plan.fmt == "protobuf" else None
        references = {**(plan.references or {}), **(found_references or {})} if plan.fmt == "protobuf" else None
        every = RegistryPlan(plan.fmt, {**plan.schemas, **found}, references, plan.schema, plan.missing | frozenset(fetch - set(found)))
        return self.narrowed_registry_plan(every, ids)

    def use_registry_plan(self, boundary: Boundary, plan: RegistryPlan) -> None:
        """Decode `boundary` with `plan` from now on."""
        self._registry_plan = (boundary, plan)

    def registry_schema(self, fmt: str, schemas: dict[int, tuple[str, str]], references: Any) -> StructType:
        """The payload schema: declared in the manifest, or the union of the batch's registered
        schemas (newest first, so the newest field order wins)."""
        from dpone_dagster.schema import avro, json_schema, protobuf

        if self.options.schema_ is not None:
            return self._schema([], "flat")
        registry_options = self.options.schema_registry
        if fmt == "protobuf" and registry_options and registry_options.protobuf_message:
            return protobuf.message_to_spark(protobuf.load_message_class(registry_options.protobuf_message))
        merged = StructType([])
        for schema_id in sorted(schemas, reverse=True):
            _, text = schemas[schema_id]
            if fmt == "avro":
                part = avro.avro_to_spark(text)
            elif fmt == "json_schema":
                part = json_schema.json_schema_to_spark(text)
            else:
                refs = (references or {}).get(schema_id, ())
                part = protobuf.message_to_spark(protobuf.message_class_from_schema(text, [0], refs))
            merged = merge_structs(merged, part)
        return merged

    def sample_values(self, boundary: Boundary) -> list[Any]:
        """Up to schema_sample_size decoded values, spread across the partitions of the boundary."""
        wanted = self.options.schema_sample_size
        ranges = [r for r in boundary.ranges if r.size]
        per_partition = max(1, wanted // max(1, len(ranges)))
        consumer = inspect.make_consumer(self.client_config, self.group_id)
        try:
            wanted = {r.partition: (r.start, min(per_partition, r.size), r.end) for r in ranges}
            sampled = _read_samples(consumer, self.topic, wanted)
        finally:
            consumer.close()
        return [_loads(value) for r in ranges for value in sampled[r.partition] if value is not None]

    def resolve_envelope(self, sample: list[Any]) -> str:
        if self.options.envelope != "auto":
            return self.options.envelope
        objects = [v for v in sample if isinstance(v, dict)]
        if objects and all("op" in v and isinstance(v.get("data"), dict | None) and "data" in v for v in objects):
            return "dpone"
        return "flat"

    def _decoding(self, resolved: str) -> str:
        """The envelope decode_json applies: `auto` stays per record, whatever the sample said."""
        return "auto" if self.options.envelope == "auto" else resolved

    def _schema(self, sample: list[Any], envelope: str) -> StructType:
        if self.options.schema_ is not None:
            ddl = ", ".join(f"`{c.name}` {c.type}" for c in self.options.schema_)
            return StructType.fromDDL(ddl)
        return self._infer(sample, envelope)

    @staticmethod
    def _infer(values: list[Any], envelope: str) -> StructType:
        if envelope == "dpone":
            rows = [v["data"] for v in values if isinstance(v, dict) and isinstance(v.get("data"), dict)]
        elif envelope == "auto":
            # Envelopes contribute their data (a delete's may be null), flat records themselves.
            rows = [v["data"] if decode.is_envelope_value(v) else v for v in values if isinstance(v, dict)]
            rows = [r for r in rows if isinstance(r, dict)]
        else:
            rows = [v for v in values if isinstance(v, dict)]
        return infer_schema(rows)


def _read_samples(consumer: Any, topic: str, wanted: dict[int, tuple[int, int, int]]) -> dict[int, list[bytes | None]]:
    """Values of up to `count` records from `start` of each partition (`wanted`: partition ->
    (start, count, end)), never past `end`. All partitions are fetched at once; a partition is
    paused as soon as it has its share."""
    from confluent_kafka import KafkaError, TopicPartition

    out: dict[int, list[bytes | None]] = {p: [] for p in wanted}
    pending = {p for p, (_, count, _) in wanted.items() if count > 0}
    consumer.assign([TopicPartition(topic, p, wanted[p][0]) for p in sorted(pending)])
    patience = time.monotonic() + 10.0  # without any answer
    try:
        while pending and time.monotonic() < patience:
            messages = consumer.consume(num_messages=10_000, timeout=inspect.POLL_S)
            if messages:
                patience = time.monotonic() + 10.0
            done: set[int] = set()
            for message in messages:
                err = message.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise RunFailed(f"{topic}[{message.partition()}]: fetch failed while sampling: {err}")
                partition = message.partition()
                if partition not in pending or partition in done:
                    continue
                _, count, end = wanted[partition]
                if err is not None or message.offset() >= end:
                    done.add(partition)
                    continue
                out[partition].append(message.value())
                if len(out[partition]) >= count:
                    done.add(partition)
            if done:
                pending -= done
                consumer.pause([TopicPartition(topic, p) for p in sorted(done)])
    finally:
        consumer.unassign()
    return out


def _loads(value: bytes | str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None  # counted as corrupt by the Spark decode


def registry_notes(fmt: str, schemas: set[int], unknown: set[int]) -> list[str]:
    """The extract's notes of a registry-framed batch: the ids decoded with, and those the registry
    does not know (their records are bad records)."""
    notes = [f"{fmt}: schema id(s) {sorted(schemas)} from the registry"]
    if unknown:
        notes.append(f"unknown schema id(s) {sorted(unknown)}: their records are reported as undecodable")
    return notes


def late_window(boundary: Boundary, partition: Column, offset: Column, timestamp_ms: Column) -> Column | None:
    """The index of the window that holds a record whose timestamp is before that window's start
    (a late record), null for every other record; None when no window holds an offset."""
    if boundary.method != "time_window" or not boundary.windows or not boundary.total:
        return None
    late = None
    for index, window in enumerate(boundary.windows):
        for r in window["partitions"]:
            if r["end"] <= r["start"]:
                continue
            held = (partition == r["partition"]) & offset.between(r["start"], r["end"] - 1)
            condition = F.when(held & (timestamp_ms < window["start_ms"]), F.lit(index))
            late = condition if late is None else F.coalesce(late, condition)
    return late


def _within_log(topic: str, planned: PlannedWindow, watermarks: dict[int, Watermarks]) -> PlannedWindow:
    """A recorded range past the end of the log means the topic was recreated: refuse it. One that
    starts below the log start reads what retention kept (`_retention_notes` decided to go on)."""
    ranges = []
    for r in planned.ranges:
        wm = watermarks[r.partition]
        if r.end > wm.high:
            raise RunFailed(
                f"{topic}[{r.partition}]: window starting {planned.window.start.isoformat()} was recorded with "
                f"offsets up to {r.end}, beyond the end of the log ({wm.high}); was the topic recreated? Reset the "
                "state with `dpone state reset <manifest> --yes`"
            )
        ranges.append(PartitionRange(r.partition, max(r.start, wm.low), max(r.end, wm.low)))
    return PlannedWindow(planned.window, tuple(ranges), planned.frozen)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _retained_since(probe: inspect.RecordProbe, watermarks: dict[int, Watermarks]) -> dict[int, int]:
    """Per partition retention removed records from (log start above 0): the timestamp of its first
    retained record."""
    since: dict[int, int] = {}
    for p, wm in sorted(watermarks.items()):
        if wm.low == 0:
            continue  # nothing was ever removed from this partition
        first = probe.first_at_or_after(p, wm.low)
        if first is not None:
            since[p] = first[1]
    return since
