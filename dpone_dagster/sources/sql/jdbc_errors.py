"""JDBC failures as actionable errors: ConfigError (with the fix) for a missing driver, a refused
login, an unreachable server or a missing object; RunFailed otherwise. Messages are redacted."""

from __future__ import annotations

import re
from collections.abc import Callable

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.redact import redact_text

_UNREACHABLE = (
    "connection refused",
    "unknownhostexception",
    "communications link failure",
    "could not connect",
    "connect timed out",
    "socket fail to connect",
    "network error ioexception",
    "the tcp/ip connection to the host",
    "no route to host",
    "could not open connection",
)
_AUTH = ("password authentication failed", "access denied", "login failed", "authentication failed")
_UNKNOWN_OBJECT = (
    "does not exist",
    "doesn't exist",
    "invalid object name",
    "invalid column name",
    "unknown column",
    "unknown table",
    "unknown database",
)


def classify(exc: BaseException, what: str, target: str, driver_fix: Callable[[], str]) -> Exception:
    """The error to raise for `exc`, raised while trying to `what` against `target` (url + connection)."""
    messages = [redact_text(m) for m in _java_messages(exc)]
    lowered = "\n".join(messages).lower()
    detail = _detail(messages)
    if "classnotfoundexception" in lowered or "no suitable driver" in lowered:
        return ConfigError(driver_fix())
    if any(s in lowered for s in _AUTH) or re.search(r'role "[^"]*" does not exist', lowered):
        return ConfigError(
            f"{target} refused the login to {what}: {detail}. Fix: check the user and password of the "
            "connection and its grants."
        )
    if any(s in lowered for s in _UNREACHABLE) or re.search(r"connection to \S+ refused", lowered):
        return ConfigError(
            f"cannot connect to {target} to {what}: {detail}. Fix: check the host, port and database of the "
            "connection and that the server runs and is reachable from the Spark driver and executors."
        )
    if any(s in lowered for s in _UNKNOWN_OBJECT):
        return ConfigError(
            f"{target}: {what} failed because an object does not exist: {detail}. Fix: correct the "
            "connection's database, source.table, or source.options.columns / incremental_column / "
            "partition_column / predicate."
        )
    return RunFailed(f"{target}: failed to {what}: {detail}")


def _java_messages(exc: BaseException) -> list[str]:
    """The exception's text and every Java cause's (Spark 4 wraps driver errors in FAILED_JDBC.*)."""
    messages = [f"{type(exc).__name__}: {exc}"]
    cause = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    for _ in range(10):
        if cause is None:
            break
        try:
            messages.append(str(cause.toString()))
            cause = cause.getCause()
        except Exception:  # noqa: BLE001 - a broken gateway: keep what we have
            break
    return messages


def _detail(messages: list[str]) -> str:
    """The most specific message: the first cause that does not come from Spark itself."""
    for message in messages[1:]:
        if not message.startswith(("org.apache.spark", "java.util.concurrent")):
            return _first_line(message)
    return _first_line(messages[0])


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("at "):
            return line[:500]
    return text[:500]
