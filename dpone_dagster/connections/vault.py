"""Fields of a connection with connection_type vault: a HashiCorp Vault KV secret at
`<DPONE_VAULT_PATH_PREFIX>/<connection_id>` read with hvac.

Every read looks the token up first and renews a renewable one once less than half its TTL is left;
a token accepted earlier in the process and refused now is reported as expired or revoked.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from dpone_dagster.connections.ref import connection_label
from dpone_dagster.errors import ConfigError
from dpone_dagster.redact import SECRETS, redact


class _VaultSettings(NamedTuple):
    addr: str
    token: str
    namespace: str | None
    mount: str
    path: str
    kv_version: int
    verify: str | None

    @property
    def where(self) -> str:
        namespace = f", namespace {self.namespace}" if self.namespace else ""
        return f"{self.mount}/{self.path} (KV v{self.kv_version}{namespace}) at {self.addr}"


def vault_path(connection_id: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """The mount and path of this connection's secret (also named in error messages)."""
    mount = (environ.get("DPONE_VAULT_MOUNT") or "secret").strip("/")
    prefix = (environ.get("DPONE_VAULT_PATH_PREFIX") or "dpone/connections").strip("/")
    return mount, f"{prefix}/{connection_id}" if prefix else connection_id


def _vault_settings(connection_id: str, environ: Mapping[str, str]) -> _VaultSettings:
    context = connection_label("", connection_id, "vault")
    addr, token = environ.get("VAULT_ADDR"), environ.get("VAULT_TOKEN")
    if not addr:
        raise ConfigError(
            f"{context}: VAULT_ADDR is not set. Fix: export VAULT_ADDR (e.g. https://vault.example:8200) and VAULT_TOKEN."
        )
    if not token:
        raise ConfigError(
            f"{context}: VAULT_TOKEN is not set. Fix: export VAULT_TOKEN with a token that may read the secret."
        )
    SECRETS.add(token)
    version_text = environ.get("DPONE_VAULT_KV_VERSION") or "2"
    if version_text not in ("1", "2"):
        raise ConfigError(
            f"{context}: DPONE_VAULT_KV_VERSION must be 1 or 2. Fix: set it to the KV engine version of the mount."
        )
    mount, path = vault_path(connection_id, environ)
    return _VaultSettings(
        addr=addr,
        token=token,
        namespace=environ.get("VAULT_NAMESPACE") or None,
        mount=mount,
        path=path,
        kv_version=int(version_text),
        verify=environ.get("VAULT_CACERT") or environ.get("VAULT_CAPATH") or None,
    )


def vault_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The keys of this connection's Vault secret, read with VAULT_TOKEN (kept fresh first)."""
    import hvac
    import requests
    from hvac import exceptions as vault_errors

    settings = _vault_settings(connection_id, environ)
    context = connection_label("", connection_id, "vault")
    client = hvac.Client(
        url=settings.addr, token=settings.token, namespace=settings.namespace, verify=settings.verify
    )
    _keep_token_fresh(client, settings, context)
    try:
        if settings.kv_version == 2:
            response = client.secrets.kv.v2.read_secret_version(
                path=settings.path, mount_point=settings.mount, raise_on_deleted_version=True
            )
            data = response["data"]["data"]
        else:
            data = client.secrets.kv.v1.read_secret(path=settings.path, mount_point=settings.mount)["data"]
    except vault_errors.InvalidPath:
        raise ConfigError(
            f"{context}: Vault secret {settings.where} does not exist. Fix: write it (e.g. `vault kv put "
            f"-mount={settings.mount} {settings.path} bootstrap_servers=...`), or point DPONE_VAULT_MOUNT, "
            "DPONE_VAULT_PATH_PREFIX and DPONE_VAULT_KV_VERSION at where it is."
        ) from None
    except (vault_errors.Forbidden, vault_errors.Unauthorized):
        policy_path = (
            f"{settings.mount}/data/{settings.path}"
            if settings.kv_version == 2
            else f"{settings.mount}/{settings.path}"
        )
        raise ConfigError(
            f"{context}: Vault denied reading {settings.where} with VAULT_TOKEN. Fix: use a valid token whose "
            f'policy grants read on "{policy_path}".'
        ) from None
    except (vault_errors.VaultError, requests.RequestException) as exc:
        detail = redact(f"{type(exc).__name__}: {exc}", [settings.token])
        raise ConfigError(
            f"{context}: cannot read Vault secret {settings.where}: {detail}. Fix: check that VAULT_ADDR is "
            "reachable and unsealed (and VAULT_NAMESPACE / VAULT_CACERT when used)."
        ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"{context}: Vault secret {settings.where} has no keys. Fix: store the connection's fields as its keys."
        )
    return dict(data)


# Tokens accepted earlier in this process (by digest, never the token), with when their TTL ran out
# as last seen (None: no expiry): tells an expired token from a wrong one.
_ACCEPTED_TOKENS: dict[str, float | None] = {}
_ACCEPTED_LOCK = threading.Lock()
# A renewable token is renewed when less than this share of its TTL is left.
VAULT_RENEW_BELOW = 0.5


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _keep_token_fresh(client: Any, settings: _VaultSettings, context: str) -> None:
    """Renew a renewable VAULT_TOKEN once less than half its TTL is left (every Vault read checks),
    and say clearly when a token that worked earlier in this process has expired since."""
    from hvac import exceptions as vault_errors

    digest = _token_digest(settings.token)
    try:
        info = client.auth.token.lookup_self()["data"]
    except (vault_errors.Forbidden, vault_errors.Unauthorized):
        with _ACCEPTED_LOCK:
            seen, expiry = digest in _ACCEPTED_TOKENS, _ACCEPTED_TOKENS.get(digest)
        if seen:
            until = (
                f" (its TTL ran out at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expiry))})"
                if expiry
                else ""
            )
            raise ConfigError(
                f"{context}: VAULT_TOKEN was accepted earlier in this process but Vault now refuses it: it "
                f"expired{until} or was revoked during the run. Fix: use a renewable token (it is renewed "
                "whenever less than half its TTL is left) or one whose TTL outlasts the run, e.g. a periodic "
                "token (`vault token create -period=1h -policy=<policy>`), then rerun."
            ) from None
        return  # never valid here: the secret read reports the denial with its fix
    except Exception:  # noqa: BLE001 - lookup-self not permitted or not answered: the read decides
        return
    ttl, creation_ttl = int(info.get("ttl") or 0), int(info.get("creation_ttl") or 0)
    if info.get("renewable") and creation_ttl and ttl < creation_ttl * VAULT_RENEW_BELOW:
        try:
            ttl = int(client.auth.token.renew_self()["auth"].get("lease_duration") or ttl)
        except Exception:  # noqa: BLE001 - a token past its max TTL cannot be renewed; it still works until then
            pass
    with _ACCEPTED_LOCK:
        _ACCEPTED_TOKENS[digest] = time.time() + ttl if ttl else None
