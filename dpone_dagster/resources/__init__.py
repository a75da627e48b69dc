"""Dagster resources: Spark, Kafka, Schema Registry."""

from dpone_dagster.resources.kafka import KafkaResource
from dpone_dagster.resources.schema_registry import SchemaRegistryResource
from dpone_dagster.resources.spark import spark_resource

__all__ = ["KafkaResource", "SchemaRegistryResource", "spark_resource"]
