"""Machine-readable output alone on stdout.

The Spark JVM (a child process that inherits file descriptor 1) and native client libraries log
to fd 1. While a command's output is JSON, fd 1 points at stderr, so their lines land there, and
the command writes to the original stdout through `output()`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_output: TextIO | None = None


def output() -> TextIO:
    """Where a command's own output goes: the original stdout."""
    return _output or sys.stdout


@contextmanager
def stdout_for_output_only(enabled: bool) -> Iterator[None]:
    """fd 1 → stderr for the duration, `output()` → the original stdout. A no-op when disabled or
    when sys.stdout is not fd 1 (a caller that captures output in Python already has it apart)."""
    global _output
    if not enabled or not _writes_to_fd_1(sys.stdout):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _output = open(saved, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - closed below
    try:
        yield
    finally:
        _output.close()
        _output = None
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _writes_to_fd_1(stream: TextIO) -> bool:
    try:
        return stream.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream
        return False
