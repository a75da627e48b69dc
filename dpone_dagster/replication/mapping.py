"""Which source topics are replicated, where each record goes, and the tracing headers (pure).

No IO: topic listings and partition counts come in as values, so every rule is unit-testable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import ReplicationOptions

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
INTERNAL_PREFIX = "__"

TRACE_PREFIX = "dpone.trace."
TRACE_SOURCE_TOPIC = TRACE_PREFIX + "source_topic"
TRACE_SOURCE_PARTITION = TRACE_PREFIX + "source_partition"
TRACE_SOURCE_OFFSET = TRACE_PREFIX + "source_offset"
TRACE_PIPELINE = TRACE_PREFIX + "pipeline"

Header = tuple[str, bytes | None]


def check_topic_name(name: str, what: str) -> str:
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"{what} {name!r} is not a legal Kafka topic name (1-249 characters of letters, digits, '.', '_', '-')"
        )
    return name


def target_topic(source_topic: str, options: ReplicationOptions) -> str:
    """The target topic name for `source_topic` under `options.topic_mapping`."""
    mapping = options.topic_mapping
    if mapping == "same":
        name = source_topic
    elif mapping == "prefix":
        name = f"{options.prefix}{source_topic}"
    elif mapping == "suffix":
        name = f"{source_topic}{options.suffix}"
    elif mapping == "regex":
        if options.pattern is None or options.replacement is None:
            raise ConfigError("sink.options.replication: topic_mapping regex needs pattern and replacement")
        try:
            name, count = re.subn(options.pattern, options.replacement, source_topic)
        except (re.error, IndexError) as exc:  # IndexError: a group reference the pattern lacks
            raise ConfigError(
                f"sink.options.replication: pattern {options.pattern!r} / replacement {options.replacement!r} "
                f"cannot be applied to {source_topic!r}: {exc}"
            ) from None
        if count == 0:
            # Falling back to the source name would silently merge this topic elsewhere.
            raise ConfigError(
                f"sink.options.replication.pattern {options.pattern!r} does not match source topic "
                f"{source_topic!r}; widen the pattern or narrow the source topics"
            )
    else:  # pragma: no cover - the manifest model only allows the four modes
        raise ConfigError(f"unknown topic_mapping {mapping!r}")
    return check_topic_name(name, f"target topic for {source_topic!r}")


def resolve_source_topics(
    all_topics: Iterable[str],
    topic: str | None,
    topics: Sequence[str] | None,
    pattern: str | None,
) -> list[str]:
    """The source topics to replicate, sorted: one name, a list, or a regex (full match).

    A pattern never selects internal topics (names starting with "__", e.g. __consumer_offsets or
    the control topic itself); named topics are taken as given. Every named topic must exist, so
    that a typo fails the run instead of replicating nothing.
    """
    existing = set(all_topics)
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"source.topic_pattern {pattern!r} is not a valid regular expression: {exc}") from None
        selected = sorted(t for t in existing if not t.startswith(INTERNAL_PREFIX) and regex.fullmatch(t))
        if not selected:
            raise ConfigError(
                f"source.topic_pattern {pattern!r} matches no topic of the source cluster "
                "(the whole name must match; internal '__' topics are never selected)"
            )
        return selected
    named = list(topics or []) or ([topic] if topic else [])
    if not named:
        raise ConfigError("source: set topic, topics or topic_pattern")
    missing = sorted(set(named) - existing)
    if missing:
        raise ConfigError(f"source topic(s) {', '.join(missing)} do not exist on the source cluster")
    return sorted(set(named))


def resolve_targets(
    sources: Sequence[str],
    options: ReplicationOptions,
    sink_topic: str = "",
    same_cluster: bool = False,
) -> dict[str, str]:
    """source topic -> target topic for every selected source.

    `sink.topic` only names the target of a single replicated topic under topic_mapping `same`;
    anywhere else it would contradict the mapping, so it is refused rather than ignored.
    """
    if sink_topic and options.topic_mapping != "same":
        raise ConfigError(
            f"sink.topic {sink_topic!r} conflicts with topic_mapping {options.topic_mapping}: the mapping "
            "names the target topics; remove sink.topic"
        )
    if sink_topic and len(sources) > 1:
        raise ConfigError(
            f"sink.topic {sink_topic!r} names one target but {len(sources)} source topics are replicated; "
            "use topic_mapping prefix/suffix/regex (or same without sink.topic)"
        )
    if sink_topic:
        targets = {sources[0]: check_topic_name(sink_topic, "sink.topic")}
    else:
        targets = {source: target_topic(source, options) for source in sources}
    if same_cluster:
        # One cluster on both sides: a target that is also a source would replicate into itself
        # (or be picked up again by the next run of a pattern).
        loops = sorted(t for t in targets.values() if t in set(sources))
        if loops:
            raise ConfigError(
                f"source and target are the same cluster and target topic(s) {', '.join(loops)} are also "
                "replicated sources; use a prefix/suffix mapping that the source selection does not match"
            )
    return targets


def target_partition(source_partition: int, target_partitions: int, mapping: str) -> int | None:
    """Target partition of a record: `keep` = same number, `partitioner` = None (the producer's
    partitioner decides from the key, like any producer of the target cluster would)."""
    if mapping == "partitioner":
        return None
    if mapping != "keep":
        raise ConfigError(f"unknown partition_mapping {mapping!r}; use keep or partitioner")
    if source_partition >= target_partitions:
        raise ConfigError(
            f"partition_mapping keep: source partition {source_partition} has no counterpart in a target "
            f"topic of {target_partitions} partition(s); give the target at least as many partitions as "
            "the source, or use partition_mapping: partitioner"
        )
    return source_partition


def tracing_headers(pipeline: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Where a replicated record came from, as UTF-8 text headers."""
    return [
        (TRACE_SOURCE_TOPIC, topic.encode()),
        (TRACE_SOURCE_PARTITION, str(partition).encode()),
        (TRACE_SOURCE_OFFSET, str(offset).encode()),
        (TRACE_PIPELINE, pipeline.encode()),
    ]


def record_headers(
    source_headers: Sequence[Header] | None,
    replicate: bool,
    tracing: Sequence[tuple[str, bytes]] | None,
) -> list[Header] | None:
    """Headers of the replicated record (None: no headers).

    With tracing on, incoming dpone.trace.* headers are dropped so each name appears once and
    describes the hop that produced this record (a reader taking the first match is not misled).
    """
    out: list[Header] = []
    if replicate and source_headers:
        out.extend(h for h in source_headers if not (tracing and h[0].startswith(TRACE_PREFIX)))
    if tracing:
        out.extend(tracing)
    return out or None


def source_partition_counts(partitions: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Partitions a target needs under `keep`: highest source partition number + 1."""
    return {topic: (max(parts) + 1 if parts else 0) for topic, parts in partitions.items()}
