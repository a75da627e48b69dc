"""A subset of a manifest's quality checks, chosen by name (what a Dagster asset-check selection
asks for). Pure: the manifest is copied, never changed.

Every kept check is given its full-list name explicitly, so a check is known by the same name
whichever others run beside it (default names of duplicates depend on their neighbours).
"""

from __future__ import annotations

from collections.abc import Iterable

from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.quality.results import check_names


def select_checks(manifest: Manifest, names: Iterable[str] | None) -> Manifest:
    """`manifest` with only the quality checks named in `names` (None: all of them)."""
    if names is None:
        return manifest
    wanted = set(names)
    checks = manifest.quality.checks
    known = check_names(checks)
    unknown = sorted(wanted - set(known))
    if unknown:
        raise ConfigError(
            f"quality checks {unknown} are not declared by manifest '{manifest.name}' (its checks: {known}); "
            "select checks by the names the manifest's asset shows"
        )
    kept = [c.model_copy(update={"name": n}) for n, c in zip(known, checks, strict=True) if n in wanted]
    return manifest.model_copy(update={"quality": manifest.quality.model_copy(update={"checks": kept})})
