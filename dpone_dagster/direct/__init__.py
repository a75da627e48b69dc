"""Executor side of the direct path (engine/direct.py): Spark tasks that read, shape and produce
Kafka → Kafka JSON batches without handing records to Spark's JVM."""
