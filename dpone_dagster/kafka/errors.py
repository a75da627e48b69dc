"""Classify Kafka and Schema Registry errors (pure): retry with backoff, fail fast, or a permanent
per-message failure — each with the cause and the fix a person needs.

The table follows the DeltaForge Kafka sink failure modes: broker unavailable / leader election /
timeouts retry (bounded) then fail; authentication, authorization, SSL and unknown topics fail
fast; a message too large fails that message permanently.

A failed call on a client (list_topics, a flush) names only the symptom: `_TRANSPORT`, a time-out.
The cause — a broker certificate the client could not verify, a refused authentication — reaches
the client's `error_cb` instead, and only when the client is polled. `record_client_error` is that
callback for the driver's clients; `client_failure` polls the failed client and leads the message
with the cause it reported, classified by its text (TLS failures are named by the text, not by the
error name: librdkafka reports them as `_SSL` or `_TRANSPORT`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

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

# librdkafka texts (checked before the error names) that say more than the name. A broker
# certificate signed by a CA the client does not trust and one that does not name the host it was
# reached by read the same ("certificate verify failed").
_BY_TEXT: tuple[tuple[str, Classified], ...] = (
    (
        "certificate verify failed",
        Classified(
            "fail_fast",
            "TLS certificate verification failed: the broker's certificate is not signed by a CA in the "
            "connection's ssl_ca_location, or does not name the host in bootstrap_servers",
            "set ssl_ca_location of the connection (env: <CONNECTION_ID>_SSL_CA_LOCATION) to the CA bundle that "
            "signed the brokers' certificates, and connect by a name the certificates hold",
        ),
    ),
    ("SSL handshake failed", _BY_NAME["_SSL"]),
)


def classify_kafka(name: str, retriable_flag: bool = False, text: str = "") -> Classified:
    """Classify by librdkafka error name; `retriable_flag` is KafkaError.retriable(), `text` its
    str() (TLS failures are told apart by their text)."""
    for pattern, classified in _BY_TEXT:
        if pattern in text:
            return classified
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
    """Best effort for error strings that carry a librdkafka error name (delivery reports) or a
    TLS failure's text."""
    for pattern, classified in _BY_TEXT:
        if pattern in text:
            return classified
    for name, classified in _BY_NAME.items():
        if name in text:
            return classified
    return _UNKNOWN


# --------------------------------------------------------------------------- errors clients report


_REPORTED = threading.local()  # error_cb runs in the thread that polls the client


def _reported() -> deque[str]:
    seen = getattr(_REPORTED, "errors", None)
    if seen is None:
        seen = _REPORTED.errors = deque(maxlen=32)
    return seen


def record_client_error(error: Any) -> None:
    """`error_cb` of the driver's clients: keeps the last errors a client reported on its own."""
    try:
        _reported().append(f"{error.name()}: {error.str()}")
    except Exception:  # an error callback must never raise into librdkafka's poll
        pass


def reported_cause(reported: Iterable[str]) -> tuple[Classified, str] | None:
    """The first error among `reported` that fails fast for a known reason, with its text."""
    for text in reported:
        classified = classify_text(text)
        if classified.kind == "fail_fast" and classified is not _UNKNOWN:
            return classified, text
    return None


def client_failure(what: str, client: Any, failure: BaseException | str) -> str:
    """The message for a call that failed on a driver client created with `record_client_error`
    as its error_cb: `what: failure`, or — when the client reported why it cannot talk to the
    brokers — `what: cause (its text); fix: ...`. Polls the client once to serve its queued errors
    (a consumer must not be assigned, or a record it returns is dropped)."""
    seen = _reported()
    seen.clear()
    try:
        client.poll(0)
    except Exception:  # the failure being explained is what matters
        pass
    cause = reported_cause(list(seen))
    if cause is None:
        return f"{what}: {failure}"
    classified, text = cause
    return f"{what}: {classified.message(text)}"


def message_too_large(key: bytes | None, value: bytes | None, headers: list | None, max_bytes: int) -> bool:
    """Client-side check before producing (brokers may not enforce it; the embedded one does not)."""
    size = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers or [])
    return size > max_bytes
