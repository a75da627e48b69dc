"""Throughput and memory benchmarks of the dpone engine against plain confluent-kafka loops.

`python -m bench.k2k` (Kafka → Kafka) and `python -m bench.sql2k` (PostgreSQL → Kafka); see
docs/performance.md for what they measure and the recorded figures.
"""
