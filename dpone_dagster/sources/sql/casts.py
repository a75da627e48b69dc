"""Spark column helpers shared by the readers: quoting a column name, casting to a mapped type."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F


def backquote(name: str) -> str:
    """A column name for F.col / F.expr (Spark SQL quoting)."""
    return "`" + name.replace("`", "``") + "`"


def cast_column(column: Column, current: str, target: str) -> Column:
    """`column` (read as `current`) as the Spark type `target`."""
    if target == "binary" and current == "string":
        return F.unhex(F.regexp_replace(column, "^0[xX]", ""))
    if target == "boolean" and current not in ("boolean", "string"):
        return column.cast("int").cast("boolean")
    return column.cast(target)
