"""What happens to bad input records: `source.options.on_error` fail | dead_letter | skip.

Bad input: a value that cannot be decoded (JSON, wrong magic byte, unknown schema id, not
matching the schema), a missing unique key, a message larger than the producer may send. Here the
engine decides: fail the run, count the records as skipped, or hand them to `DeadLetters`
(sinks/dead_letters.py), which produces them with the run's output once the gates have passed.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused, RunFailed
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.sinks.dead_letters import DeadLetters

# What a SQL source's refused rows tell the user to do, by why they were refused.
KEYLESS_FIX = "Fill those columns in the table's rows, or choose sink.strategy.unique_key columns every row has"
OVERSIZED_FIX = (
    "Raise message.max.bytes in sink.options.delivery.producer_config (and the topic's max.message.bytes), "
    "or leave the large columns out with source.options.columns"
)
KEYLESS = "record(s) have no unique key"


def oversized(limit: int) -> str:
    """What messages over the producer's limit are, in a refusal or a note."""
    return f"message(s) exceed message.max.bytes {limit}"


def sql_rows_refused(count: int, what: str, fix: str) -> DataRefused:
    """The refusal of a SQL batch holding `count` rows the sink cannot take (pure)."""
    return DataRefused(f"{count} {what}; nothing was produced and the watermark did not move. {fix}")


def keyless_deletes(count: int, registry_keys: bool = False) -> RunFailed:
    """The failure of a batch whose deletes have no key to make tombstones of."""
    fix = (
        "a source tombstone has no columns to make the registry-encoded key of (sink.options.key.format); "
        "use key.format: string to key it by its source record's key, or check unique_key"
        if registry_keys
        else "check unique_key"
    )
    return RunFailed(f"{count} delete(s) have no key, so no tombstone can be produced; {fix}")


def handle_bad_records(
    manifest: Manifest,
    bad: DataFrame,
    count: int,
    letters: DeadLetters,
    result: RunResult,
    what: str,
    fix: str = KEYLESS_FIX,
) -> None:
    """`bad` has columns partition, offset, reason. Raises in fail mode (with `fix` for a SQL
    source, whose rows have no bad-record policy); otherwise routes/counts.
    Dead letters are only collected here; `DeadLetters.publish` produces them after the gates."""
    if not count:
        return
    source = manifest.source
    policy = source.options.on_error if isinstance(source, KafkaSource) else "fail"
    if policy == "fail" and not isinstance(source, KafkaSource):
        raise sql_rows_refused(count, what, fix)
    if policy == "fail":
        sample = bad.orderBy("partition", "offset").limit(5).collect()
        where = ", ".join(f"{r['partition']}@{r['offset']} ({r['reason']})" for r in sample)
        raise DataRefused(
            f"{count} {what} (partition@offset: {where}); nothing was produced. Fix the producer, or set "
            "source.options.on_error: dead_letter (with dead_letter.topic) or skip"
        )
    if policy == "dead_letter":
        assert isinstance(source, KafkaSource) and source.options.dead_letter is not None and letters.raw is not None
        letters.add(bad, count)
        result.rows_dead_lettered += count
    else:
        result.rows_skipped += count
    result.notes.append(f"{count} {what}: {'sent to ' + source.options.dead_letter.topic if policy == 'dead_letter' else 'skipped'}")
