"""Exactly-once Kafka -> Kafka replication (sink.options.delivery.mode: exactly_once).

Records and the source offsets they came from are written to the TARGET cluster in one producer
transaction: the offsets live in a compacted control topic there (the Lenses K2K design), so the
source cluster is only ever read. Modules:

- `mapping`        topic selection, topic/partition mapping, tracing headers (pure)
- `control_topic`  the offset store on the target cluster: record format, reads, state view
- `plan`           per-partition [start, end) planning from watermarks and committed offsets (pure)
- `eos_task`       the executor side: one transactional copy of a source partition range
- `schemas`        schema id rewriting between two Schema Registries (schema_mapping)
- `run`            the driver: resolve, plan, preflight the target, run tasks on Spark, aggregate
"""
