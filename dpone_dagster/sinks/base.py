"""What a sink offers the engine. Implement `Sink` to add one.

The engine (engine/run.py) shapes the batch into messages, runs every pre-publish gate, then
hands the messages to the sink once and reconciles what the sink reports against what it
expected: any failed delivery fails the run and no state advances, so a rerun sends the batch
again. The Kafka sink (sinks/kafka.py) is the one implementation.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pyspark.sql import DataFrame

from dpone_dagster.kafka.delivery import DeliveryStats

SettingsT = TypeVar("SettingsT", contravariant=True)


class Sink(Protocol[SettingsT]):
    """Delivers a shaped batch; `SettingsT` is the sink's own settings (where, with which client)."""

    def produce(self, messages: DataFrame, settings: SettingsT, records: int) -> DeliveryStats:
        """Deliver every row of `messages` (columns key, value, headers, partition; `records` of
        them, which bounds the wait) and return what was acknowledged, per target partition.
        Deliveries that fail are counted in the stats, not raised. Runs on Spark tasks: the batch
        is never collected on the driver."""
        ...
