"""What child processes inherit: credentials stay in this process.

Spark's JVM (and through it every Python worker) and other tools this process starts copy its
environment, where a `ps e`, `/proc/<pid>/environ` or a crash report shows it. Connections are
resolved here and reach executors inside task closures, so no child needs these variables:

- `VAULT_TOKEN`, and the connection variables this project reads (`DPONE_CONN_*`, `AIRFLOW_CONN_*`);
- any variable whose name says it holds a credential (`*_PASSWORD`, `*_TOKEN`, `*_SECRET`, ...) or
  whose value holds a secret a connection resolved, or a `user:password@` URL / `password=` DSN.

A child that does need such a variable (cloud storage credentials for Spark, say) gets it when its
name is listed in `DPONE_CHILD_ENV_KEEP` (comma-separated). `withheld_from_children()` removes them from `os.environ` while a child is launched (PySpark reads
`os.environ` when it starts its gateway) and puts them back afterwards.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from dpone_dagster.redact import is_secret_key, redact_text

__all__ = ["child_environ", "is_withheld", "withheld_from_children"]

_ALWAYS = ("VAULT_TOKEN",)
_PREFIXES = ("DPONE_CONN_", "AIRFLOW_CONN_")
# Settings children do need whose names merely look like credentials.
_KEEP = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
_LOCK = threading.Lock()


def _kept() -> set[str]:
    return {*_KEEP, *(n.strip() for n in os.environ.get("DPONE_CHILD_ENV_KEEP", "").split(",") if n.strip())}


def is_withheld(name: str, value: str, kept: set[str] | None = None) -> bool:
    """Whether a child process must not inherit the variable `name`."""
    if name in (_kept() if kept is None else kept) and name not in _ALWAYS:
        return False
    if name in _ALWAYS or name.startswith(_PREFIXES) or is_secret_key(name):
        return True
    return redact_text(value) != value


def child_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` (default: this process's) without the variables children must not see."""
    environ = os.environ if environ is None else environ
    kept = _kept()
    return {name: value for name, value in environ.items() if not is_withheld(name, value, kept)}


@contextmanager
def withheld_from_children(environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """Remove the withheld variables from `environ` (default `os.environ`) for the block's duration."""
    environ = os.environ if environ is None else environ
    kept = _kept()
    with _LOCK:
        removed = {name: value for name, value in environ.items() if is_withheld(name, value, kept)}
        for name in removed:
            del environ[name]
        try:
            yield
        finally:
            for name, value in removed.items():
                environ.setdefault(name, value)
