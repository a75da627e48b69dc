"""SQL sources (type: mssql | postgres | mysql): plan a bounded extract, then read it on Spark.

- `text/`: every SQL statement and bcp command line, pure (no IO), per dialect where they differ;
- `jdbc`: the table reached through Spark JDBC (settings, driver check, catalog, small queries),
  `jdbc_errors`: JDBC failures as actionable errors;
- `boundary`: what a run reads; `watermark`: incremental plans; `cdc`: MSSQL CDC plans;
- `extract`: `SqlBatchSource` (plan dispatch, full reads, the JDBC read and the final columns),
  with the `bcp` and `odbc` export modes and the shared Spark `casts`.
"""

from dpone_dagster.sources.sql.bcp import read_bcp_file
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.extract import SqlBatchSource

__all__ = ["SqlBatchSource", "SqlBoundary", "read_bcp_file"]
