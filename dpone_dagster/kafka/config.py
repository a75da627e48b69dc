"""librdkafka producer settings built from the manifest, and the check that the effective
settings keep the promise of the declared delivery mode (pure).

Precedence, lowest first: the connection (its `librdkafka` settings, then a Kafka resource's
`extra_config`), the engine's defaults, the delivery block's typed fields, the delivery block's
`producer_config`. Whatever wins is checked against `sink.options.delivery.mode`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dpone_dagster.kafka.errors import record_client_error

if TYPE_CHECKING:  # annotations only: manifest.rules imports this module to validate delivery blocks
    from dpone_dagster.manifest.models import DeliveryOptions, Manifest


def producer_config(client_config: dict[str, Any], delivery: DeliveryOptions) -> dict[str, Any]:
    config: dict[str, Any] = {
        **client_config,
        # The sink topic is checked (or created) in preflight; never let a produce create it.
        "allow.auto.create.topics": False,
        "acks": "all",
        # librdkafka's default: bounds what a producer holds (flat memory whatever the batch's size);
        # 500k measured no faster on bench.routes at 1M and 4M messages
        "queue.buffering.max.messages": 100_000,
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


# librdkafka aliases of the settings a delivery mode depends on.
_ALIASES = {
    "request.required.acks": "acks",
    "message.send.max.retries": "retries",
    "max.in.flight": "max.in.flight.requests.per.connection",
}
# The producer settings `dpone plan` shows (connection settings such as credentials are left out).
SHOWN_SETTINGS = (
    "acks",
    "enable.idempotence",
    "retries",
    "max.in.flight.requests.per.connection",
    "compression.type",
    "linger.ms",
    "batch.num.messages",
    "message.max.bytes",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
)
# The idempotent producer keeps order and loses nothing only within these bounds (librdkafka's own).
IDEMPOTENT_MAX_IN_FLIGHT = 5


def canonical_name(key: str) -> str:
    return _ALIASES.get(key, key)


def _canonical(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Aliases folded into their canonical names; the later entry wins, as in librdkafka."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        out[canonical_name(key)] = value
    return out


def _acks(value: Any) -> str:
    text = str(value).strip().lower()
    return "all" if text in ("all", "-1") else text


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return {"true": True, "1": True, "false": False, "0": False}.get(text)


def _number(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def delivery_contradictions(mode: str, settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(setting, why) for each effective producer setting that breaks the promise of `mode`.

    Every mode promises that an acknowledged message is on every in-sync replica (acks all): with
    acks 0 or 1 a leader failure loses messages the run counted as delivered. idempotent and
    exactly_once additionally need the idempotent producer within its bounds (no duplicates, no
    reordering on retry).
    """
    effective = _canonical(settings)
    out: list[tuple[str, str]] = []
    acks = effective.get("acks")
    if acks is not None and _acks(acks) != "all":
        out.append(
            (
                "acks",
                f"acks {acks} does not keep {mode}: a message acknowledged by the leader alone (or not at all) "
                "is lost when the leader fails; use acks: all (the default)",
            )
        )
    if mode in ("idempotent", "exactly_once"):
        if "enable.idempotence" in effective and _flag(effective["enable.idempotence"]) is not True:
            out.append(
                (
                    "enable.idempotence",
                    f"enable.idempotence {effective['enable.idempotence']} switches off the idempotent producer "
                    f"that delivery.mode {mode} promises; remove the setting",
                )
            )
        in_flight = effective.get("max.in.flight.requests.per.connection")
        if in_flight is not None and (_number(in_flight) is None or not 1 <= _number(in_flight) <= IDEMPOTENT_MAX_IN_FLIGHT):
            out.append(
                (
                    "max.in.flight.requests.per.connection",
                    f"max.in.flight.requests.per.connection {in_flight} is outside 1..{IDEMPOTENT_MAX_IN_FLIGHT}, "
                    f"where the idempotent producer of delivery.mode {mode} keeps order without duplicates; "
                    "remove it or set at most 5",
                )
            )
        retries = effective.get("retries")
        if retries is not None and (_number(retries) is None or _number(retries) < 1):
            out.append(
                (
                    "retries",
                    f"retries {retries} stops the idempotent producer of delivery.mode {mode} from retrying; "
                    "remove the setting",
                )
            )
    if mode == "exactly_once" and "transactional.id" in effective:
        out.append(
            (
                "transactional.id",
                "exactly_once gives each replication task its own transactional.id (that is what fences a "
                "retried task); remove the setting",
            )
        )
    return out


def effective_producer_settings(manifest: Manifest, client_config: Mapping[str, Any]) -> dict[str, Any]:
    """The producer settings a run of `manifest` uses with this sink connection, as `dpone plan`
    shows them: the delivery-related settings and every key the manifest's producer_config sets."""
    delivery = manifest.sink.options.delivery
    settings = _canonical(producer_config(dict(client_config), delivery))
    if delivery.mode in ("idempotent", "exactly_once"):
        settings.setdefault("max.in.flight.requests.per.connection", IDEMPOTENT_MAX_IN_FLIGHT)
    if delivery.mode == "exactly_once":
        settings.update({"enable.idempotence": True, "acks": "all", "transactional.id": "<one per replication task>"})
    shown = set(SHOWN_SETTINGS) | {canonical_name(k) for k in delivery.producer_config}
    return {key: settings[key] for key in SHOWN_SETTINGS + tuple(sorted(shown - set(SHOWN_SETTINGS))) if key in settings}


def setting_origin(manifest: Manifest, key: str) -> str:
    """Where an effective producer setting came from, as the field to change."""
    delivery = manifest.sink.options.delivery
    for given in delivery.producer_config:
        if canonical_name(given) == key:
            return f"sink.options.delivery.producer_config.{given}"
    if key == "acks" and delivery.acks is not None:
        return "sink.options.delivery.acks"
    return (
        f"the librdkafka settings of sink connection '{manifest.sink.connection_id}' "
        "(or the Kafka resource's extra_config)"
    )


def check_producer_settings(manifest: Manifest, client_config: Mapping[str, Any]) -> None:
    """Refuse a run whose effective producer settings (after the connection's and the resource's
    overrides) contradict the delivery mode; raises ConfigError naming each setting and its origin."""
    from dpone_dagster.errors import ConfigError

    mode = manifest.sink.options.delivery.mode
    problems = delivery_contradictions(mode, producer_config(dict(client_config), manifest.sink.options.delivery))
    if problems:
        raise ConfigError(
            "; ".join(f"{setting_origin(manifest, key)}: {why}" for key, why in problems)
        )


_DRIVER_LOG = logging.getLogger("dpone.librdkafka")
if not os.environ.get("DPONE_LIBRDKAFKA_LOG"):
    # Connection retries against a down broker log hundreds of lines; the failure itself reaches
    # the user as an error with the cause. DPONE_LIBRDKAFKA_LOG=1 shows librdkafka's own log.
    _DRIVER_LOG.setLevel(logging.CRITICAL)


def driver_client_config(config: dict[str, Any]) -> dict[str, Any]:
    """Settings for clients created on the driver: librdkafka logs go to Python logging."""
    return {"error_cb": record_client_error, **config, "logger": _DRIVER_LOG}


def range_reader_config(
    client_config: Mapping[str, Any], group_id: str, queue_kbytes: int, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A consumer that reads planned offset ranges (batch reads and replication alike): committed
    records only, no offsets of its own, and an out-of-range start is an error, never a jump."""
    return {
        **client_config,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        # The prefetch queue is bounded in bytes, not only in records (100,000 by default): large
        # records would otherwise make a task's memory grow with the record size.
        "queued.max.messages.kbytes": queue_kbytes,
        # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default) whenever its queue
        # holds queued.min.messages; a task that builds batches between consume() calls keeps it
        # that full, and then waited ~0.8 s per task on an idle queue (measured).
        "fetch.queue.backoff.ms": 10,
        **dict(overrides or {}),
    }
