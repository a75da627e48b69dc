"""Credential resolution for manifest connection blocks.

A block names a connection (`connection_id`) and where its credentials live (`connection_type`):

- env: `DPONE_CONN_<ID>_<FIELD>` or `<ID>_<FIELD>` (the DPONE_CONN_ form wins for a field set twice);
- params: the block's inline `params:` mapping;
- airflow: `AIRFLOW_CONN_<ID>`, an Airflow connection URI or Airflow's JSON form;
- vault: a HashiCorp Vault KV secret at `<DPONE_VAULT_PATH_PREFIX>/<connection_id>` read with hvac.

`resolve_fields` returns the raw fields; `resolve_kafka`, `resolve_postgres` and `resolve_jdbc` map them
onto frozen models whose repr, str and describe() never show a secret. Every secret a model holds is
added to the process-wide registry of `dpone_dagster.redact` (re-exported here), so that every output
passing through `redact_text` is scrubbed. Error messages name where a value was looked up, never the
value.

Modules: `env`, `params`, `airflow` and `vault` read the raw fields from each source; `base`, `kafka`
and `database` hold the typed models; `resolve` ties a block to its source and model. This package
module only re-exports; the modules below it never import it.
"""

from __future__ import annotations

from dpone_dagster.connections.airflow import airflow_var_names
from dpone_dagster.connections.database import JdbcConnection, PostgresConnection
from dpone_dagster.connections.env import env_key, env_var_names
from dpone_dagster.connections.kafka import KafkaConnection
from dpone_dagster.connections.ref import ConnectionRefLike
from dpone_dagster.connections.resolve import resolve_fields, resolve_jdbc, resolve_kafka, resolve_postgres
from dpone_dagster.redact import MASK, SECRETS, SecretRedactor, redact, redact_text

__all__ = [
    "MASK",
    "ConnectionRefLike",
    "JdbcConnection",
    "KafkaConnection",
    "PostgresConnection",
    "SECRETS",
    "SecretRedactor",
    "airflow_var_names",
    "env_key",
    "env_var_names",
    "redact",
    "redact_text",
    "resolve_fields",
    "resolve_jdbc",
    "resolve_kafka",
    "resolve_postgres",
]
