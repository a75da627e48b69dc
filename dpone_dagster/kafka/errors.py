"""Classify Kafka and Schema Registry errors (pure): retry with backoff, fail fast, or a permanent
per-message failure — each with the cause and the fix a person needs.

The table follows the DeltaForge Kafka sink failure modes: broker unavailable / leader election /
timeouts retry (bounded) then fail; authentication, authorization, SSL and unknown topics fail
fast; a message too large fails that message permanently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorClass = Literal["retriable", "fail_fast", "permanent_message"]


@dataclass(frozen=True)
class Classified:
    kind: ErrorClass
    cause: str
    fix: str

    def message(self, detail: str) -> str:
        return f"{self.cause} ({detail}); fix: {self.fix}"


# librdkafka error names (KafkaError.name()) -> classification.
_BY_NAME: dict[str, Classified] = {
    "_TRANSPORT": Classified("retriable", "broker unavailable", "restore the broker or the network; check bootstrap_servers"),
    "_ALL_BROKERS_DOWN": Classified("retriable", "all brokers are down", "restore the brokers; check bootstrap_servers"),
    "_MSG_TIMED_OUT": Classified("retriable", "delivery timed out", "check broker health; raise delivery.producer_config message.timeout.ms"),
    "_TIMED_OUT": Classified("retriable", "request timed out", "check broker health and the network"),
    "REQUEST_TIMED_OUT": Classified("retriable", "request timed out", "check broker health and the network"),
    "NOT_LEADER_FOR_PARTITION": Classified("retriable", "leader election in progress", "usually transient; rerun"),
    "NOT_LEADER_OR_FOLLOWER": Classified("retriable", "leader election in progress", "usually transient; rerun"),
    "LEADER_NOT_AVAILABLE": Classified("retriable", "leader not available", "usually transient; rerun"),
    "NOT_ENOUGH_REPLICAS": Classified("retriable", "not enough in-sync replicas", "restore brokers or lower min.insync.replicas"),
    "KAFKA_STORAGE_ERROR": Classified("retriable", "broker storage error (disk)", "add disk space on the brokers"),
    "_AUTHENTICATION": Classified("fail_fast", "authentication failed", "fix sasl_username / sasl_password / sasl_mechanism of the connection"),
    "SASL_AUTHENTICATION_FAILED": Classified("fail_fast", "authentication failed", "fix sasl_username / sasl_password of the connection"),
    "TOPIC_AUTHORIZATION_FAILED": Classified("fail_fast", "not authorized for the topic", "grant the principal ACLs on the topic"),
    "GROUP_AUTHORIZATION_FAILED": Classified("fail_fast", "not authorized for the consumer group", "grant the principal ACLs on the group"),
    "CLUSTER_AUTHORIZATION_FAILED": Classified("fail_fast", "not authorized on the cluster", "grant the principal cluster ACLs (idempotent producers need IdempotentWrite)"),
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": Classified("fail_fast", "not authorized for the transactional id", "grant ACLs on transactional ids dpone-*"),
    "_SSL": Classified("fail_fast", "SSL/TLS handshake failed", "fix ssl_ca_location / certificates of the connection"),
    "_UNKNOWN_TOPIC": Classified("fail_fast", "unknown topic", "create the topic or fix its name"),
    "UNKNOWN_TOPIC_OR_PART": Classified("fail_fast", "unknown topic or partition", "create the topic or fix its name"),
    "MSG_SIZE_TOO_LARGE": Classified("permanent_message", "message too large", "raise message.max.bytes on the topic/broker and producer, or filter large records"),
    "_MSG_SIZE_TOO_LARGE": Classified("permanent_message", "message too large", "raise message.max.bytes, or filter large records"),
    "RECORD_LIST_TOO_LARGE": Classified("permanent_message", "record batch too large", "lower batch.size / batch_num_messages"),
    "INVALID_RECORD": Classified("permanent_message", "the broker rejected the record", "check the topic's configs (e.g. compacted topics need keys)"),
}

_UNKNOWN = Classified("fail_fast", "Kafka error", "see the error text")


def classify_kafka(name: str, retriable_flag: bool = False) -> Classified:
    """Classify by librdkafka error name; `retriable_flag` is KafkaError.retriable()."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    return Classified("retriable", "transient Kafka error", "rerun; check broker health") if retriable_flag else _UNKNOWN


def classify_registry(status: int | None, text: str = "") -> Classified:
    """Schema Registry HTTP failures: auth fails fast; 5xx and connection errors retry."""
    if status in (401, 403):
        return Classified("fail_fast", "Schema Registry rejected the credentials", "fix schema_registry_username / schema_registry_password")
    if status == 404:
        return Classified("fail_fast", "Schema Registry subject or schema not found", "register the schema or enable auto_register_schemas")
    if status == 409:
        return Classified("fail_fast", "Schema Registry refused an incompatible schema", "evolve the schema compatibly or change the subject's compatibility")
    if status is None or status >= 500:
        return Classified("retriable", "Schema Registry unavailable", "restore the registry; check schema_registry_url")
    return Classified("fail_fast", f"Schema Registry error {status}", text or "see the error text")


def classify_text(text: str) -> Classified:
    """Best effort for error strings that carry a librdkafka error name (delivery reports)."""
    for name, classified in _BY_NAME.items():
        if name in text:
            return classified
    return _UNKNOWN


def message_too_large(key: bytes | None, value: bytes | None, headers: list | None, max_bytes: int) -> bool:
    """Client-side check before producing (brokers may not enforce it; the embedded one does not)."""
    size = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers or [])
    return size > max_bytes
