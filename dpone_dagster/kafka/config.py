"""librdkafka settings built from the manifest (pure)."""

from __future__ import annotations

import logging
import os
from typing import Any

from dpone_dagster.manifest.models import DeliveryOptions


def producer_config(client_config: dict[str, Any], delivery: DeliveryOptions) -> dict[str, Any]:
    config: dict[str, Any] = {
        **client_config,
        # The sink topic is checked (or created) in preflight; never let a produce create it.
        "allow.auto.create.topics": False,
        "acks": "all",
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
    }
    if delivery.mode in ("idempotent", "exactly_once"):
        config["enable.idempotence"] = True
        config["acks"] = "all"
    elif delivery.acks is not None:
        config["acks"] = delivery.acks
    if delivery.compression_type is not None:
        config["compression.type"] = delivery.compression_type
    if delivery.linger_ms is not None:
        config["linger.ms"] = delivery.linger_ms
    if delivery.batch_num_messages is not None:
        config["batch.num.messages"] = delivery.batch_num_messages
    config.update(delivery.producer_config)
    return config


_DRIVER_LOG = logging.getLogger("dpone.librdkafka")
if not os.environ.get("DPONE_LIBRDKAFKA_LOG"):
    # Connection retries against a down broker log hundreds of lines; the failure itself reaches
    # the user as an error with the cause. DPONE_LIBRDKAFKA_LOG=1 shows librdkafka's own log.
    _DRIVER_LOG.setLevel(logging.CRITICAL)


def driver_client_config(config: dict[str, Any]) -> dict[str, Any]:
    """Settings for clients created on the driver: librdkafka logs go to Python logging."""
    return {**config, "logger": _DRIVER_LOG}
