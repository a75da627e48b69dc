"""What happens to bad input records: `source.options.on_error` fail | dead_letter | skip.

Bad input: a value that cannot be decoded (JSON, wrong magic byte, unknown schema id, not
matching the schema), a missing unique key, a message larger than the producer may send. Here the
engine decides: fail the run, count the records as skipped, or hand them to `DeadLetters`
(sinks/dead_letters.py), which produces them with the run's output once the gates have passed.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.sinks.dead_letters import DeadLetters


def handle_bad_records(
    manifest: Manifest,
    bad: DataFrame,
    count: int,
    letters: DeadLetters,
    result: RunResult,
    what: str,
) -> None:
    """`bad` has columns partition, offset, reason. Raises in fail mode; otherwise routes/counts.
    Dead letters are only collected here; `DeadLetters.publish` produces them after the gates."""
    if not count:
        return
    source = manifest.source
    policy = source.options.on_error if isinstance(source, KafkaSource) else "fail"
    if policy == "fail" and not isinstance(source, KafkaSource):
        raise DataRefused(
            f"{count} {what}; nothing was produced and the watermark did not move. Fill those columns in the "
            "table's rows, or choose sink.strategy.unique_key columns every row has"
        )
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
