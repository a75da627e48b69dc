"""What happens to bad input records: `source.options.on_error` fail | dead_letter | skip.

Bad input: a value that cannot be decoded (JSON, wrong magic byte, unknown schema id, not
matching the schema), a missing unique key, a message larger than the producer may send. Dead
letters carry the ORIGINAL key, value and headers plus error headers, and are produced before
anything reaches the sink, so a failure here leaves the sink and the state untouched.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused, RunFailed
from dpone_dagster.kafka.admin import ensure_sink_topic
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.manifest.models import KafkaSource, Manifest, TopicCreation
from dpone_dagster.spark.kafka_writer import ProducerSettings, produce

HEADER_TYPE = "array<struct<key:string,value:binary>>"


def handle_bad_records(
    manifest: Manifest,
    bad: DataFrame,
    count: int,
    raw: DataFrame | None,
    sink_config: dict[str, Any],
    result: RunResult,
    what: str,
) -> None:
    """`bad` has columns partition, offset, reason. Raises in fail mode; otherwise routes/counts."""
    if not count:
        return
    source = manifest.source
    policy = source.options.on_error if isinstance(source, KafkaSource) else "fail"
    if policy == "fail":
        sample = bad.orderBy("partition", "offset").limit(5).collect()
        where = ", ".join(f"{r['partition']}@{r['offset']} ({r['reason']})" for r in sample)
        raise DataRefused(
            f"{count} {what} (partition@offset: {where}); nothing was produced. Fix the producer, or set "
            "source.options.on_error: dead_letter (with dead_letter.topic) or skip"
        )
    if policy == "dead_letter":
        assert isinstance(source, KafkaSource) and source.options.dead_letter is not None and raw is not None
        _dead_letter(manifest, bad, count, raw, sink_config, result)
        result.rows_dead_lettered += count
    else:
        result.rows_skipped += count
    result.notes.append(f"{count} {what}: {'sent to ' + source.options.dead_letter.topic if policy == 'dead_letter' else 'skipped'}")


def _dead_letter(manifest: Manifest, bad: DataFrame, count: int, raw: DataFrame, sink_config: dict, result: RunResult) -> None:
    source = manifest.source
    assert isinstance(source, KafkaSource) and source.options.dead_letter is not None
    options = source.options.dead_letter
    ensure_sink_topic(sink_config, options.topic, TopicCreation(enabled=options.create, partitions=options.partitions))

    def header(name: str, value: Any) -> Any:
        return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

    error_headers = F.array(
        header("dpone.error.reason", F.col("reason")),
        header("dpone.error.source.topic", F.col("topic")),
        header("dpone.error.source.partition", F.col("partition")),
        header("dpone.error.source.offset", F.col("offset")),
        header("dpone.error.pipeline", F.lit(manifest.name)),
        header("dpone.error.run_id", F.lit(result.run_id)),
    )
    letters = raw.join(bad.select("partition", "offset", "reason"), on=["partition", "offset"]).select(
        F.col("key"),
        F.col("value"),
        F.concat(F.coalesce(F.col("headers"), F.array().cast(HEADER_TYPE)), error_headers).alias("headers"),
        F.lit(-1).cast("int").alias("partition"),
    )
    delivery = manifest.sink.options.delivery
    stats = produce(
        letters,
        ProducerSettings(options.topic, tuple(producer_config(sink_config, delivery).items()), delivery.flush_timeout_s),
    )
    if not stats.ok or stats.delivered != count:
        raise RunFailed(
            f"dead-lettering {count} record(s) to '{options.topic}' failed ({stats.delivered} acknowledged; "
            f"{'; '.join(stats.errors)}); nothing was produced to the sink and no state advanced"
        )
